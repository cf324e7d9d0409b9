"""One measured trial inside a rank process: the user's script run with the probe's hooks, and
how it ended. A cold process then exits; a warm one (see _warm) goes on to the next trial."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from .. import accelerate_cpu
from ._accelerate_cpu import install as install_accelerate_cpu
from ._history import ProcessHistory
from ._hooks import StepProbe, TrialStop, install


def redirect(out: Path, stem: str) -> None:
    """This process's stdout and stderr appended to ``out/<stem>.stdout|.stderr``."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, f"{stem}.stdout"), (2, f"{stem}.stderr")):
        f = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)


def run_script(spec: dict[str, Any], local_rank: int) -> None:
    """The user's script as ``__main__``, with its arguments from probe.json."""
    script = spec["script"]
    os.environ.update(spec.get("env") or {})  # what the target's program reads its config from (Accelerate)
    sys.argv = [script] + ([f"--local_rank={local_rank}"] if spec.get("local_rank_arg") else []) + spec["args"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def run_measured(
    spec: dict[str, Any], rank: int, local_rank: int, *, warm: bool = False, history: ProcessHistory | None = None
) -> tuple[StepProbe, str]:
    """Runs one measured trial. Cold: the process ends here, with the trial. Warm: returns the
    probe and "" when the script ended cleanly (the probe stopped it, or it ended on its own),
    else why this process must not serve another trial (its result is written either way).
    ``history``: what the warm process's earlier trials left (see ProcessHistory)."""
    import faulthandler

    redirect(Path(spec["out_dir"]), f"rank{rank}")
    faulthandler.enable()  # a segfault leaves its signal and Python stack in rank<N>.stderr
    probe = StepProbe(spec, rank, warm=warm, history=history)
    if spec.get("accelerate") and accelerate_cpu.wanted():
        install_accelerate_cpu()
    if spec.get("engine") == "fsdp":
        from ._fsdp import install_fsdp

        if accelerate_cpu.wanted():
            os.environ.update(accelerate_cpu.CPU_ENV)
        install_fsdp(probe)
    else:
        install(probe)
    if spec.get("lightning_config"):
        from ._lightning import install_trial

        install_trial(spec["lightning_config"], probe)
    try:
        run_script(spec, local_rank)
    except TrialStop as stop:
        return probe, "" if stop.code == 0 else f"the trial ended with status {stop.code}"
    except SystemExit as e:
        if e.code not in (0, None):
            # sys.exit("message") prints the message and exits with status 1.
            why = (
                f"the script exited with status {e.code}"
                if isinstance(e.code, int)
                else f"the script exited with status 1 and the message {str(e.code)[:300]!r}"
            )
            return probe, _failed(probe, "crashed", why, e.code if isinstance(e.code, int) else 1)
    except BaseException as e:
        from ._memory import is_oom_error

        traceback.print_exc()
        if probe.finished is not None:
            return probe, "the script turned zerotune's stop into an error of its own"
        state = "oom" if is_oom_error(e) else "crashed"
        line = (traceback.format_exception_only(type(e), e)[-1].strip())[:500]
        return probe, _failed(probe, state, line, 3 if state == "oom" else 1)
    if probe.finished is not None:
        return probe, (
            "the script caught zerotune's stop (except BaseException) and ran on to its end; its result stands"
        )
    if probe.engine is None and not spec.get("lightning_config"):
        what = (
            "training a module that fully_shard wrapped (FSDP2), so there was no training to measure; "
            "check that it trains through Accelerate or the Hugging Face Trainer with the FSDP config "
            "it is given"
            if spec.get("engine") == "fsdp"
            else "calling deepspeed.initialize, so there was no training to measure; check that it trains "
            "with the ds_config it is given (--deepspeed_config)"
        )
        return probe, _failed(
            probe, "crashed", f"the script ended without {what} and does not stop before its training loop", 1
        )
    # The script ended on its own before the estimate was stable: keep what was measured.
    probe.write("ok", "the script finished before the measurement was stable")
    if not warm:
        probe.stop()
    return probe, ""


def _failed(probe: StepProbe, state: str, reason: str, code: int) -> str:
    probe.write(state, reason, code)
    if not probe.warm:
        probe.stop()
    return f"the trial ended {state}: {reason}"
