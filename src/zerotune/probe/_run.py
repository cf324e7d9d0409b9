"""How a rank of ``zerotune run`` (the real training) ends once the user's script is done.

Left to the interpreter's own teardown, a rank that has finished training can abort there
("terminate called without an active exception", exit status -6): gloo's threads still hold
work with tensors in it when the interpreter frees them (pytorch#190489, pytorch#179291). So a
script that returned, or exited with status 0, is ended here instead: its engine freed and the
default process group destroyed while the interpreter is whole, then what the teardown would
have done that a user can see (non-daemon threads joined, atexit hooks run, open files
flushed), then ``os._exit``. A script that failed is left to end as it would have.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from typing import NoReturn


def release_default_group() -> None:
    """The default process group destroyed, where the script left it alive."""
    dist = sys.modules.get("torch.distributed")  # a script that never imported torch has no group
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_finished_run() -> NoReturn:
    """Ends this rank with status 0 after a script that finished, without the interpreter's
    teardown (see the module's docstring)."""
    gc.collect()  # the engine's reference cycles, and the collective work they hold, freed now
    release_default_group()
    gc.collect()
    # What the interpreter's exit does first, in its order: wait for the script's own threads
    # (a checkpoint upload), then its atexit hooks (loggers, trackers).
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 -- CPython's own exit step; os._exit skips it
    flush_open_files()
    os._exit(0)


def flush_open_files() -> int:
    """Flush every open buffered file, as their finalizers would at the interpreter's exit (a
    script's log file it never closed keeps what it wrote); returns how many were flushed."""
    flushed = 0
    for obj in gc.get_objects():
        # By the type, not isinstance: that reads ``obj.__class__``, which some objects answer
        # with a warning (torch.distributed.reduce_op).
        if issubclass(type(obj), (io.BufferedIOBase, io.TextIOBase)):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
                    flushed += 1
            except (OSError, ValueError):  # a pipe whose reader is gone, a detached wrapper
                continue
    return flushed
