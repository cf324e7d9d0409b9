"""Process hygiene: die_with_parent is safe between fork and exec, and still ends the child with
the thread that started it."""

import builtins
import ctypes
import signal
import subprocess
import sys
import threading

import pytest

from zerotune._proc import die_with_parent
from zerotune.launch._process import ProcessGroup

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def test_between_fork_and_exec_it_imports_nothing_and_loads_no_library():
    # In the child an import or a dlopen waits for ever on a lock another thread held at the
    # fork (a CI run hung in `import ctypes` there): both fail loudly here instead.
    def refuse(*args, **kwargs):
        raise AssertionError("imported or loaded a library after the fork")

    def prepare():
        builtins.__import__ = refuse
        ctypes.CDLL = refuse
        die_with_parent()

    proc = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=prepare)
    assert proc.wait(timeout=60) == 0


def test_a_child_ends_with_the_thread_that_started_it(tmp_path):
    started = []
    starter = threading.Thread(
        target=lambda: started.append(
            ProcessGroup([sys.executable, "-c", "import time; time.sleep(600)"], env={}, log=tmp_path / "log")
        )
    )
    starter.start()
    starter.join()
    (group,) = started
    try:
        assert group.proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        group.kill(grace=0.0)
