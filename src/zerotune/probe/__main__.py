"""Entry point of every trial process: ``python -m zerotune.probe`` (started by the launcher).

The user's arguments come from probe.json in the trial folder, never from this process's own
command line, so no launcher's argument parser ever sees (or abbreviates) them. Modes:
``measure`` (one trial, then the process ends), ``serve`` (warm: trials one after another, see
_warm), ``inspect`` (what a Lightning program asks for) and ``run`` (the real training; see _run for
how it ends).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def _ranks_from_slurm(spec: dict) -> None:
    """A task of a Slurm job step (see zerotune.launch's Slurm launcher): its rank and local rank
    are Slurm's task ids, as torch.distributed and DeepSpeed read them from RANK and LOCAL_RANK.
    Rank 0 names the step in the trial folder (step.txt: job.step on node)."""
    os.environ["RANK"] = os.environ.get("SLURM_PROCID", "0")
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if os.environ["RANK"] == "0" and spec.get("out_dir"):
        step = f"{os.environ.get('SLURM_JOB_ID', '?')}.{os.environ.get('SLURM_STEP_ID', '?')}"
        Path(spec["out_dir"], "step.txt").write_text(f"{step} on {os.environ.get('SLURMD_NODENAME', '?')}\n")


def main() -> None:
    spec_path = os.environ.get("ZEROTUNE_PROBE")
    if not spec_path:
        sys.exit("zerotune.probe is started by zerotune for each trial; run `zerotune tune script.py ...` instead")
    from .. import _cpu_info as cpu_info
    from .._proc import die_with_parent

    # If the launcher is killed outright, end this rank too rather than wait in a collective.
    die_with_parent(signal.SIGTERM)
    cpu_info.install(os.environ.get(cpu_info.ENV))
    spec = json.loads(Path(spec_path).read_text())
    if os.environ.get("ZEROTUNE_RANKS_FROM") == "slurm":
        _ranks_from_slurm(spec)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mode = spec["mode"]
    if mode == "measure":
        # This rank's process is up (the node works): a trial that fails without it on any rank
        # of a host lost that host, not a verdict on its config (see the multi-node launchers).
        Path(spec["out_dir"], f"rank{rank}.started").write_text(os.environ.get("SLURMD_NODENAME", ""))
    if mode in ("measure", "serve"):
        from ._waiter import run_watched

        run_watched(Path(spec["pool"] if mode == "serve" else spec["out_dir"]), rank)  # returns in the rank
    if mode == "serve":
        from ._serve import serve

        serve(Path(spec["pool"]), rank, local_rank)
    if mode == "measure":
        from ._trial import run_measured

        run_measured(spec, rank, local_rank)  # ends the process
        raise AssertionError("unreachable: a cold trial ends its process")
    if mode == "inspect":
        from ._lightning import install_inspect

        install_inspect(spec)
    elif spec.get("lightning_config"):
        from ._lightning import install_trial

        install_trial(spec["lightning_config"], None)
    import faulthandler

    from ._run import end_finished_run
    from ._trial import run_script

    faulthandler.enable(all_threads=True)  # a rank that aborts or segfaults says where, in its stderr
    from .. import accelerate_cpu

    if spec.get("accelerate") and accelerate_cpu.wanted():
        from ._accelerate_cpu import install

        install()
        if spec.get("engine") == "fsdp":
            os.environ.update(accelerate_cpu.CPU_ENV)
    try:
        run_script(spec, local_rank)
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    end_finished_run()


if __name__ == "__main__":
    main()
