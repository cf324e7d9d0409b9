"""The fault matrix against a real tuner (CPU, 2 processes, DeepSpeed's CPU accelerator).

Each scenario injects one fault into a tuning of ``tests/integration/faulty_trial.py`` over ZeRO
stages 0 and 1 (the fault strikes stage 0's trial) and checks that the tuning survives it:

- in the trial: exit 1, SIGSEGV on one rank, a hang without progress, CUDA OOM, the word "error"
  in normal output, one rank dying while the other waits in a collective, a slow start, one rank
  killed with SIGKILL from outside (a verdict of killed, not oom), a daemon the script starts;
- around it: the master port already taken, the results disk filling up mid-write, the tuner
  killed with SIGKILL mid-trial (then rerun), Ctrl-C mid-trial (then rerun), Ctrl-C twice at
  once, the tuner killed with SIGKILL while its ranks ignore SIGTERM with the results folder
  given relative to the tuner's folder (then rerun).

Survived: the tuning (or its rerun) ends normally, the faulty trial is classified as expected and
stage 1 still wins. lost_results: trials finished before the fault that are missing, unreadable
or rerun afterwards. orphans: trial processes alive after the tuning (or its rerun) ended.

    python bench/faults.py              # the fault matrix, then the hostile-input line
    python bench/faults.py --hostile    # only the hostile inputs (seconds, no real trials)

Then hostile inputs against the CLI in this process (fake launcher: nothing trains): every kind of
damaged results folder under ``show`` and ``report``, odd option values for ``tune`` and
``estimate``, and edits that must make a rerun measure again (the script, a module it imports,
the ds_config, a failed trial's timeout). tracebacks: runs that ended in one; escaped: files
changed outside the results folder; stale_reuse: trials reused although what they measured changed.
A report of 2,000 trials is timed too.

Then what zerotune owns and leaves behind, against the same CLI: a results folder that is not
zerotune's, --overwrite beside a user's folder, the Python API given "no" for False;
deleted_foreign: user files deleted or changed. Leftover trial processes of a killed tuner (a
relative results folder, ranks that ignore SIGTERM, a daemon) and its shared-memory buffers:
leftover_procs and leaked_shm, alive or present after the next tuning. Ranks killed from outside
and trials that time out: false_oom, those called out of memory.

Lines: faults: injected=<n> survived=<n> lost_results=<n> orphans=<n>
       hostile: tried=<n> tracebacks=<n> escaped=<n> stale_reuse=<n> deleted_foreign=<n>
                leftover_procs=<n> leaked_shm=<n> false_oom=<n>
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _record import save  # noqa: E402  (bench/_record.py, beside this script)
from procs import trial_processes  # noqa: E402

FAULTY = ROOT / "tests" / "integration" / "faulty_trial.py"
OUT = ROOT / "bench" / "results" / "faults"
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
IN_TRIAL = {
    "exit1": "crashed",
    "segv": "crashed",
    "hang": "timeout",
    "oom": "oom",
    "error_words": "ok",
    "rank_dies": "crashed",
    "slow_start": "ok",
    "killed": "killed",
    "daemon": "ok",
}


def setup(name: str) -> tuple[Path, Path]:
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cfg = d / "ds.json"
    cfg.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": [4],
                "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": [0, 1]},
                "autotuning": {"start_profile_step": 2, "end_profile_step": 5},
            }
        )
    )
    return d / "results", cfg


def cli(res: Path, cfg: Path, faults: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zerotune.cli",
        "tune",
        "--num-gpus",
        "2",
        "--results-dir",
        str(res),
        "--precision",
        "0.2",
        "--stall-timeout",
        "5",
        "--trial-timeout",
        "120",
        str(FAULTY),
        "--faults",
        json.dumps(faults),
        "--deepspeed_config",
        str(cfg),
    ]


def states(res: Path) -> dict[int, str]:
    try:
        return {t["spec"]["stage"]: t["state"] for t in json.loads((res / "results.json").read_text())["trials"]}
    except (OSError, ValueError, KeyError):
        return {}


def readable(res: Path) -> set[str]:
    out = set()
    for p in res.glob("*/result.json"):
        try:
            json.loads(p.read_text())
            out.add(p.parent.name)
        except ValueError:
            pass
    return out


def orphans(res: Path) -> int:
    time.sleep(1.0)
    return len(trial_processes(res.resolve()))


def in_trial(fault: str) -> tuple[bool, int, int, str]:
    res, cfg = setup(fault)
    out = subprocess.run(cli(res, cfg, {"0": fault}), env=ENV, capture_output=True, text=True, timeout=600)
    got = states(res)
    ok = out.returncode == 0 and got == {0: IN_TRIAL[fault], 1: "ok"}
    return ok, 0, orphans(res), f"exit {out.returncode}, states {got}"


def killed(sig: int) -> tuple[bool, int, int, str]:
    """Kill the tuner during stage 1's trial, then rerun the same command."""
    res, cfg = setup(signal.Signals(sig).name)
    cmd = cli(res, cfg, {"1": "slow_start"})
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (readable(res) and list(res.glob("z1_*/probe.json"))):
        time.sleep(0.2)
    before = {name: (res / name / "result.json").stat().st_mtime for name in readable(res)}
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    t0 = time.monotonic()
    while trial_processes(res.resolve()) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    left_after_kill = len(trial_processes(res.resolve())) if sig != signal.SIGKILL else 0
    told = sig == signal.SIGKILL or "Rerun the same command to resume" in err
    again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    lost = sum(
        1
        for name, t in before.items()
        if not (res / name / "result.json").exists() or (res / name / "result.json").stat().st_mtime != t
    )
    ok = again.returncode == 0 and told and states(res) == {0: "ok", 1: "ok"} and bool(before)
    detail = (
        f"{len(before)} finished before the kill, killed run exit {proc.returncode}, rerun exit "
        f"{again.returncode}, states {states(res)}"
    )
    if not told:
        detail += f"; no resume hint in: {err.strip()[-300:]!r}"
    return ok, lost, left_after_kill + orphans(res), detail


def ignoring_ranks_relative() -> tuple[bool, int, int, str]:
    """SIGKILL the tuner while stage 1's ranks ignore SIGTERM, the results folder given as a
    relative path; the rerun must end them before its own trials (else they take its orders)."""
    res, cfg = setup("ignore_term_relative")
    before = set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"))
    cmd = cli(Path("results"), cfg, {"1": "ignore_term"}) + ["--fault-once", str(res.parent / "struck")]
    cmd[cmd.index("--stall-timeout") + 1] = "300"
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=res.parent)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(res.glob("z1_*/ignoring_term.rank*"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600, cwd=res.parent)
    told = "left running" in " ".join(again.stdout.split())
    leaked = set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")) - before
    ok = again.returncode == 0 and told and states(res) == {0: "ok", 1: "ok"} and not leaked
    return (
        ok,
        0,
        orphans(res),
        f"rerun exit {again.returncode}, ended the leftovers: {told}, buffers left: {len(leaked)}",
    )


def ctrl_c_twice() -> tuple[bool, int, int, str]:
    res, cfg = setup("ctrl_c_twice")
    before = set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"))
    proc = subprocess.Popen(
        cli(res, cfg, {"0": "hang"}), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(res.glob("z0_*/rank*.progress"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    leaked = set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")) - before
    ok = proc.returncode == 130 and "Traceback" not in err and not leaked
    return ok, 0, orphans(res), f"exit {proc.returncode}, buffers left: {len(leaked)}"


def port_taken() -> tuple[bool, int, int, str]:
    from zerotune import Autotuner
    from zerotune.launch import _local

    res, cfg = setup("port_taken")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports, real = iter([busy.getsockname()[1]]), _local.free_port
    _local.free_port = lambda: next(ports, None) or real()
    try:
        result = Autotuner(
            [str(FAULTY), "--deepspeed_config", str(cfg)], num_gpus=2, results_dir=res, precision=0.2, stall_timeout=5
        ).tune()
    finally:
        _local.free_port = real
        busy.close()
    # A cold trial retries in its own folder (launcher.attempt*); warm processes that could not
    # take the port are retired with that reason, and the trial runs in the next ones.
    retried = any(p.name.startswith("launcher.attempt") for p in res.glob("*/*")) or any(
        "master port was in use" in p.read_text() for p in res.glob("_warm/*/retired.txt")
    )
    ok = retried and {t.spec.stage: t.state.value for t in result.trials} == {0: "ok", 1: "ok"}
    return ok, 0, orphans(res), f"retried on another port: {retried}"


def disk_full() -> tuple[bool, int, int, str]:
    import errno
    import pathlib

    from zerotune import Autotuner, ZerotuneError

    res, cfg = setup("disk_full")
    real = pathlib.Path.write_text

    def filling(self, text, *a, **kw):  # the disk fills once stage 0's trial has finished
        if self.name.endswith(".tmp") and readable(res):
            real(self, text[: len(text) // 2], *a, **kw)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *a, **kw)

    def tune():
        return Autotuner(
            [str(FAULTY), "--deepspeed_config", str(cfg)], num_gpus=2, results_dir=res, precision=0.2, stall_timeout=5
        ).tune()

    pathlib.Path.write_text = filling
    try:
        tune()
        clear = False
    except ZerotuneError as e:
        clear = "No space left on device" in str(e)
    finally:
        pathlib.Path.write_text = real
    before = {name: (res / name / "result.json").stat().st_mtime for name in readable(res)}
    half = list(res.rglob("*.tmp"))
    result = tune()
    lost = sum(1 for name, t in before.items() if (res / name / "result.json").stat().st_mtime != t)
    ok = (
        clear
        and not half
        and bool(before)
        and {t.spec.stage: t.state.value for t in result.trials} == {0: "ok", 1: "ok"}
    )
    return ok, lost, orphans(res), f"clear error: {clear}, half-written files: {len(half)}"


def hostile() -> dict[str, int]:
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from hostile import damages, run_cli, tuned_folder
    from zerotune.report._html import write_report

    tried = tracebacks = escaped = stale = 0

    def count(outcome, allowed: Path | None = None) -> None:
        """``allowed``: a folder the user asked to be written (--tensorboard DIR)."""
        nonlocal tried, tracebacks, escaped
        tried += 1
        tracebacks += bool(outcome.traceback) or outcome.code not in (0, 2)
        escaped += sum(allowed is None or Path(p).parent != allowed for p in outcome.escaped)

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pristine").mkdir()
        pristine = tuned_folder(Path(tmp) / "pristine")
        for command in ("show", "report"):
            for i in range(len(damages(pristine))):
                box = Path(tmp) / f"{command}{i}"
                shutil.copytree(pristine.parent, box, symlinks=True)
                damages(box / "results")[i][1]()
                count(run_cli([command, str(box / "results")], box, box / "results"))
        odd = ["nan", "inf", "-1", "0", "1e400", "1000000000", "", "../x", "/proc/x", "\x1b[31m"]
        for flag in (
            "--num-gpus",
            "--memory-per-device",
            "--trial-timeout",
            "--stall-timeout",
            "--precision",
            "--max-measure-seconds",
            "--remeasure-seconds",
            "--remeasure-rounds",
            "--max-steps",
            "--max-warmup-steps",
            "--time-budget",
            "--hostfile",
            "--tensorboard",
            "--max-concurrent-trials",
        ):
            for value in odd:
                box = Path(tmp) / "args"
                shutil.rmtree(box, ignore_errors=True)
                shutil.copytree(pristine.parent, box, symlinks=True)
                count(
                    run_cli(
                        [
                            "tune",
                            "--quiet",
                            flag,
                            value,
                            "--results-dir",
                            str(box / "results"),
                            "train.py",
                            "--deepspeed_config",
                            "ds.json",
                        ],
                        box,
                        box / "results",
                    ),
                    allowed=box / value if flag == "--tensorboard" else None,
                )
        for flag in ("--params", "--global-batch", "--seq-len", "--num-gpus", "--device-memory"):
            for value in odd:
                count(
                    run_cli(
                        ["estimate", "--hf-config", str(ROOT / "bench" / "faults.py"), flag, value]
                        if flag == "--seq-len"
                        else ["estimate", *(["--params", "1B"] if flag != "--params" else []), flag, value],
                        Path(tmp),
                        Path(tmp) / "none",
                    )
                )
        # Edits that change what a trial measures: a rerun must measure again, reusing nothing.
        edits = {
            "script": lambda b: (b / "train.py").write_text((b / "train.py").read_text() + "X = 1\n"),
            "config": lambda b: (b / "ds.json").write_text(
                (b / "ds.json").read_text().replace('"type": "AdamW"', '"type": "Adam"')
            ),
        }
        for name, edit in edits.items():
            box = Path(tmp) / f"edit-{name}"
            shutil.copytree(pristine.parent, box, symlinks=True)
            edit(box)
            outcome = run_cli(
                [
                    "tune",
                    "--log-format",
                    "json",
                    "--results-dir",
                    str(box / "results"),
                    "train.py",
                    "--deepspeed_config",
                    "ds.json",
                ],
                box,
                box / "results",
            )
            count(outcome)
            stale += sum(
                json.loads(line).get("event") == "reused" for line in outcome.out.splitlines() if line.startswith("{")
            )
        found = owned_and_left(Path(tmp), count)
        sys.path.insert(0, str(ROOT / "tests"))
        from test_report_html import many_trials_folder

        big = many_trials_folder(Path(tmp) / "big")
        start = time.monotonic()
        write_report(big)
        print(f"report of 2000 trials: {time.monotonic() - start:.1f} s", flush=True)
    print(
        f"hostile: tried={tried} tracebacks={tracebacks} escaped={escaped} stale_reuse={stale} "
        + " ".join(f"{k}={v}" for k, v in found.items())
    )
    return {"tried": tried, "tracebacks": tracebacks, "escaped": escaped, "stale_reuse": stale, **found}


def owned_and_left(tmp: Path, count) -> dict[str, int]:
    """What zerotune owns, leaves behind and concludes: foreign folders and files it must keep,
    processes and shared-memory buffers a killed tuning left, kills it must not call out of
    memory, and bad input that must be one message. ``count`` counts each run of the CLI."""
    from hostile import CONFIG, SCRIPT, run_cli, tuned_folder
    from procs import sleeper
    from zerotune import Autotuner, NoFeasibleConfigError
    from zerotune.launch._collect import collect
    from zerotune.launch._leftovers import note_port
    from zerotune.trials._trial import TrialSpec, TrialState

    found = {"deleted_foreign": 0, "leftover_procs": 0, "leaked_shm": 0, "false_oom": 0}

    def box(name: str) -> Path:
        b = tmp / name
        b.mkdir()
        (b / "train.py").write_text(SCRIPT)
        (b / "ds.json").write_text(json.dumps(CONFIG))
        return b

    def tune(b: Path, *argv: str, results: str = "results"):
        out = run_cli(["tune", "--quiet", "--num-gpus", "2", "--results-dir", results, *argv], b, b / results)
        count(out)
        return out

    # A results folder that is not zerotune's, and --overwrite beside a user's folder.
    b = box("foreign")
    user = {b / "results" / n: "the user's" for n in ("summary.txt", "results.json", "cmd_optimal.txt")}
    user[b / "results" / "data" / "result.json"] = "{}"
    for path, text in user.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    tune(b, "train.py", "--deepspeed_config", "ds.json")
    b2 = tmp / "overwrite"
    b2.mkdir()
    tuned_folder(b2)
    mine = {b2 / "results" / "data" / n: "keep" for n in ("result.json", "probe.json", "weights.bin")}
    mine[b2 / "results" / "notes.md"] = "keep"
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    tune(b2, "--overwrite", "train.py", "--deepspeed_config", "ds.json")
    b3 = tmp / "api"
    b3.mkdir()
    results = tuned_folder(b3)
    before = sorted(p.name for p in results.iterdir())
    for given in (
        {"overwrite": "no"},
        {"warm_trials": "no"},
        {"num_gpus": "2"},
        {"num_gpus": 2.5},
        {"on_event": 5},
        {"retry_failed": "false"},
    ):
        try:
            Autotuner(
                [str(b3 / "train.py"), "--deepspeed_config", str(b3 / "ds.json")], **{"results_dir": results, **given}
            )
            count(SimpleNamespace(code=0, traceback="accepted " + repr(given), escaped=[]))
        except ValueError:
            count(SimpleNamespace(code=2, traceback="", escaped=[]))
    found["deleted_foreign"] = sum(not p.exists() or p.read_text() != t for p, t in {**user, **mine}.items()) + (
        sorted(p.name for p in results.iterdir()) != before
    )

    # Bad input: each one message and status 2.
    b = box("bad")
    (b / "dup.json").write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    (b / "batch.json").write_text(
        json.dumps({"train_batch_size": 64, "gradient_accumulation_steps": 3, "train_micro_batch_size_per_gpu": 4})
    )
    (b / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with open(b / "huge.json", "wb") as f:
        f.truncate(4 << 30)
    (b / "folder.py").mkdir()
    os.mkfifo(b / "pipe.json")
    (b / "hf.json").write_text('{"hidden_size": 1e400, "num_hidden_layers": 2, "vocab_size": 10}')
    for argv in (
        ["train.py", "--deepspeed_config", "ds.json", "--deepspeed_config", "dup.json"],
        ["train.py", "--deepspeed_config", "dup.json"],
        ["train.py", "--deepspeed_config", "batch.json"],
        ["train.py", "--deepspeed_config", "deep.json"],
        ["train.py", "--deepspeed_config", "huge.json"],
        ["folder.py", "--deepspeed_config", "ds.json"],
        ["train.py", "--deepspeed_config", "pipe.json"],
    ):
        tune(b, *argv)
    count(run_cli(["estimate", "--hf-config", str(b / "hf.json")], b, b / "none"))
    tune(b, "--", "train.py", "--deepspeed_config", "ds.json", results="dashdash")
    tune(b, "train.py", "--deepspeed_config", "ds.json", results="~/runs")

    # Leftovers of a killed tuner (a relative results folder, ranks that ignore SIGTERM), a daemon
    # of this tuner's trials, and shared-memory buffers no process maps any more.
    b = tmp / "leftovers"
    b.mkdir()
    tuned_folder(b)
    dead = subprocess.Popen(["true"])
    dead.wait()
    procs = [sleeper("results", str(dead.pid), cwd=b), sleeper("results", str(dead.pid), cwd=b, setsid=True)]
    note_port(b / "results", 1)  # a port no job uses: its buffers are a killed tuning's
    shm = [Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_1_{i}" for i in (0, 1)]
    for p in shm:
        p.write_bytes(b"x")
    procs.append(sleeper(b / "results", str(os.getpid()), setsid=True))  # this tuning's daemon
    try:
        tune(b, "train.py", "--deepspeed_config", "ds.json")
        time.sleep(0.5)  # a process SIGKILLed a moment ago may not have been reaped yet
        found["leftover_procs"] = sum(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    found["leaked_shm"] = sum(p.exists() for p in shm)
    for p in shm:
        p.unlink(missing_ok=True)

    # Kills that are not out of memory, and trials that time out.
    trial = tmp / "killed"
    trial.mkdir()
    (trial / "launcher.log").write_text("[ERROR] ['python'] exits with return code = -9\n")
    (trial / "rank0.json").write_text(
        json.dumps({"state": "crashed", "reason": "RuntimeError: reset", "peak_memory": 350 << 20})
    )
    for kills in (0, None):
        r = collect(
            spec=TrialSpec(stage=0, micro_batch=4),
            trial_dir=trial,
            world=2,
            returncode=247,
            timed_out=False,
            timeout=60,
            wall_time=1.0,
            budget=12 << 30,
            min_steps=3,
            rel_ci=0.03,
            oom_kills=kills,
        )
        found["false_oom"] += r.state is TrialState.OOM
    b = box("hang")
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes import FakeLauncher, FakeMachine

    try:
        Autotuner(
            [str(b / "train.py"), "--deepspeed_config", str(b / "ds.json")],
            num_gpus=2,
            results_dir=b / "results",
            launcher=FakeLauncher(FakeMachine(hang={0, 1, 2, 3})),
        ).tune()
    except NoFeasibleConfigError as e:
        found["false_oom"] += "memory" in str(e)
    return found


def main() -> None:
    if "--hostile" in sys.argv:
        save("hostile", {f"hostile_{k}": v for k, v in hostile().items()}, {})
        return
    os.environ.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    scenarios = {f"trial: {f}": (lambda f=f: in_trial(f)) for f in IN_TRIAL}
    scenarios.update(
        {
            "port already in use": port_taken,
            "results disk full": disk_full,
            "tuner SIGKILL mid-trial, rerun": lambda: killed(signal.SIGKILL),
            "Ctrl-C mid-trial, rerun": lambda: killed(signal.SIGINT),
            "Ctrl-C twice at once": ctrl_c_twice,
            "SIGKILL, ranks ignore TERM, relative": ignoring_ranks_relative,
        }
    )
    survived = lost = left = 0
    for name, run in scenarios.items():
        start = time.monotonic()
        try:
            ok, n_lost, n_left, detail = run()
        except Exception as e:  # a scenario that raises did not survive
            ok, n_lost, n_left, detail = False, 0, 0, f"{type(e).__name__}: {e}"
        survived += ok
        lost += n_lost
        left += n_left
        print(
            f"{name:32} {'survived' if ok else 'FAILED':8} lost={n_lost} orphans={n_left} "
            f"{time.monotonic() - start:5.0f} s  {detail}",
            flush=True,
        )
    print(f"faults: injected={len(scenarios)} survived={survived} lost_results={lost} orphans={left}")
    counts = hostile()
    save(
        "faults",
        {
            "injected": len(scenarios),
            "survived": survived,
            "lost_results": lost,
            "orphans": left,
            **{f"hostile_{k}": v for k, v in counts.items()},
        },
        {},
    )


if __name__ == "__main__":
    main()
