"""Entry point of every trial process: ``python -m zerotune.probe`` (started by the launcher).

The user's arguments come from probe.json in the trial folder, never from this process's own
command line, so no launcher's argument parser ever sees (or abbreviates) them.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path


def _redirect(out: Path, rank: int) -> None:
    for fd, name in ((1, f"rank{rank}.stdout"), (2, f"rank{rank}.stderr")):
        f = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)


def main() -> None:
    spec_path = os.environ.get("ZEROTUNE_PROBE")
    if not spec_path:
        sys.exit("zerotune.probe is started by zerotune for each trial; run `zerotune tune script.py ...` instead")
    from .._proc import die_with_parent

    # If the launcher is killed outright, end this rank too rather than wait in a collective.
    die_with_parent(signal.SIGTERM)
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mode = spec["mode"]
    probe = None
    if mode == "measure":
        out = Path(spec["out_dir"])
        _redirect(out, rank)
        import faulthandler

        faulthandler.enable()  # a segfault leaves its signal and Python stack in rank<N>.stderr
        from ._hooks import StepProbe, install

        probe = StepProbe(spec, rank)
        install(probe)
    if mode == "inspect":
        from ._lightning import install_inspect

        install_inspect(spec)
    elif spec.get("lightning_config"):
        from ._lightning import install_trial

        install_trial(spec["lightning_config"], probe)
    script = spec["script"]
    sys.argv = [script] + ([f"--local_rank={local_rank}"] if spec.get("local_rank_arg") else []) + spec["args"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if probe is not None and e.code not in (0, None):
            probe.finish("crashed", f"the script exited with status {e.code}", code=1 if not isinstance(e.code, int)
                         else e.code)
        raise
    except BaseException as e:
        if probe is None:
            raise
        from ._memory import is_oom_error

        traceback.print_exc()
        state = "oom" if is_oom_error(e) else "crashed"
        line = (traceback.format_exception_only(type(e), e)[-1].strip())[:500]
        probe.finish(state, line, code=3 if state == "oom" else 1)
    if probe is not None:
        # The script ended on its own before the estimate was stable: keep what was measured.
        probe.finish("ok", "the script finished before the measurement was stable")


if __name__ == "__main__":
    main()
