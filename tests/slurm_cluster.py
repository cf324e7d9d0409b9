"""A Slurm cluster on this machine for the tests: munged, slurmctld and two slurmd "nodes"
(zt-n1, zt-n2, one CPU each, both this host at 127.0.0.1), everything in one temporary folder
with ports of its own. ``env`` points Slurm's commands at it (SLURM_CONF); nothing outside the
folder is written. Needs root (slurmd runs tasks as their user) and Debian's slurm-wlm and munge,
which ``make test-setup`` installs."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("zt-n1", "zt-n2")
TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "squeue", "scontrol", "sinfo")


def missing() -> str:
    """Why no cluster can start here ("" where it can)."""
    if os.geteuid() != 0:
        return "slurmd runs tasks as their owner and needs root"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    return f"{', '.join(absent)} not installed (make test-setup installs slurm-wlm and munge)" if absent else ""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o711)
        key = r / "munge" / "key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        sock = r / "munge" / "sock"
        subprocess.run(
            ["munged", "--force", f"--socket={sock}", f"--key-file={key}", f"--log-file={r / 'munge/log'}",
             f"--pid-file={r / 'munge/pid'}", f"--seed-file={r / 'munge/seed'}"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        host = socket.gethostname()
        ctld, *node_ports = _free_ports(1 + len(NODES))
        nodes = "".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=1 RealMemory=1000 State=UNKNOWN\n"
            for n, p in zip(NODES, node_ports, strict=True)
        )
        self.conf.write_text(
            f"ClusterName=zerotune\nSlurmctldHost={host}\nSlurmctldPort={ctld}\nSlurmUser=root\n"
            f"AuthType=auth/munge\nAuthInfo=socket={sock}\nStateSaveLocation={r / 'state'}\n"
            f"SlurmdSpoolDir={r / 'spool'}/%n\nSlurmctldPidFile={r / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={r}/slurmd-%n.pid\nSlurmctldLogFile={r / 'log/slurmctld.log'}\n"
            f"SlurmdLogFile={r}/log/slurmd-%n.log\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nMpiDefault=none\nReturnToService=2\n"
            f"{nodes}PartitionName=tests Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP\n"
        )
        subprocess.run(["slurmctld"], env=self.env, check=True, capture_output=True, timeout=60)
        for n in NODES:
            subprocess.run(["slurmd", "-N", n], env=self.env, check=True, capture_output=True, timeout=60)
        self.wait_for(lambda: self.states() == {"idle"}, "both nodes idle")

    def states(self) -> set[str]:
        out = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=self.env, capture_output=True, text=True)
        return set(out.stdout.split()) if out.returncode == 0 else set()

    def steps(self) -> list[str]:
        out = subprocess.run(
            ["squeue", "--steps", "--noheader", "--format=%i %j"], env=self.env, capture_output=True, text=True
        )
        return out.stdout.splitlines()

    def wait_for(self, ready, what: str, seconds: float = 120.0) -> None:
        """Poll ``ready`` (a query of the cluster's own state) until it holds."""
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline:
                logs = "".join(p.read_text(errors="replace")[-2000:] for p in (self.root / "log").glob("*.log"))
                raise TimeoutError(f"the test Slurm cluster never reached: {what}\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=60)
        pids = [self.root / "slurmctld.pid", *(self.root / f"slurmd-{n}.pid" for n in NODES), self.root / "munge/pid"]
        for pid_file in pids:
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass
