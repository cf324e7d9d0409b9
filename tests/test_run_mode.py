"""``zerotune run``'s rank process (the probe in run mode): what it does after the user's script."""

import json
import os
import subprocess
import sys

import pytest

# A script that trains nothing but leaves its default process group alive, as many do; its
# atexit hook records whether the group was still there. It also leaves behind what the
# interpreter's exit would have finished: a log file it never closed, a thread still working.
SCRIPT = """
import atexit, sys, threading
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: open(sys.argv[2], "w").write(str(dist.is_initialized())))
log = open(sys.argv[3], "w")
log.write("last line")
script = sys.modules["__main__"]
def upload():  # still working well after the script has returned (runpy puts zerotune's __main__ back)
    while sys.modules["__main__"] is script:
        threading.Event().wait(0.01)
    threading.Event().wait(1.0)  # a long upload: only a join can see it through, however loaded the machine
    open(sys.argv[4], "w").write("uploaded")
threading.Thread(target=upload).start()
{end}
"""


@pytest.mark.parametrize("end", ["pass", "sys.exit(0)", "sys.exit(3)"])
def test_a_group_the_script_left_alive_is_destroyed_before_the_interpreter_exits(tmp_path, end):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(end=end))
    seen, log, upload = tmp_path / "at_exit.txt", tmp_path / "train.log", tmp_path / "upload.txt"
    spec = tmp_path / "run_probe.json"
    spec.write_text(
        json.dumps(
            {
                "mode": "run",
                "script": str(script),
                "local_rank_arg": False,
                "args": [str(tmp_path / "store"), str(seen), str(log), str(upload)],
            }
        )
    )
    env = {**os.environ, "ZEROTUNE_PROBE": str(spec)}
    proc = subprocess.run(
        [sys.executable, "-m", "zerotune.probe"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == (3 if "3" in end else 0), proc.stderr
    # A failed script's group is left as it was: a rank stuck in a collective must not be
    # made to wait on it; the launcher ends the ranks.
    assert seen.read_text() == ("True" if "3" in end else "False")
    # Ended without the interpreter's teardown, nothing of what that teardown does is lost.
    assert log.read_text() == "last line" and upload.read_text() == "uploaded"


def test_open_files_are_flushed_and_closed_ones_left_alone(tmp_path):
    from zerotune.probe._run import flush_open_files

    kept, done = open(tmp_path / "a.txt", "w"), open(tmp_path / "b.txt", "w")
    kept.write("pending")
    done.close()
    assert (tmp_path / "a.txt").read_text() == ""
    assert flush_open_files() >= 1
    assert (tmp_path / "a.txt").read_text() == "pending"
    kept.close()
