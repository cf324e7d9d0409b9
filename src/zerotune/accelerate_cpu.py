"""Accelerate (and the Hugging Face Trainer) in CPU processes, as on GPUs.

Two of Accelerate's set-up steps work on GPUs only. PyTorch's ``fully_shard`` trains on a CPU
device mesh over gloo, but Accelerate turns its FSDP plugin on only for GPU-like devices (in CPU
processes it sets up plain multi-CPU data parallelism and drops the plugin); and where DeepSpeed's
CPU accelerator starts the process group, Accelerate counts one process, so every rank's
DataLoader gives it the same samples. zerotune lifts both in its trial processes on CPU (see
``zerotune.probe.install_accelerate_cpu``); nothing changes where a GPU is used. FSDP2's
processes must also be told they run on CPU (``ACCELERATE_USE_CPU=true``), and a CPU command
zerotune writes for FSDP2 installs the lift through the ``sitecustomize.py`` of :func:`write_site`
(Python imports that module at start-up from the ``PYTHONPATH``).
"""

from __future__ import annotations

import os
from pathlib import Path

SITE_DIR = "_accelerate_cpu"
"""The folder (in the results folder) whose sitecustomize.py installs the lift in a CPU command."""
CPU_ENV = {"ACCELERATE_USE_CPU": "true"}
"""What tells Accelerate its processes run on CPU (accelerate launch sets it only without FSDP)."""


def write_site(root: Path) -> Path:
    """``root/_accelerate_cpu/sitecustomize.py``, which installs the lift where Accelerate is used;
    returns the folder, for the command's PYTHONPATH."""
    from ._files import write_atomic

    folder = root / SITE_DIR
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()  # zerotune's own name in the results folder: a link or file there is replaced
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(
        folder / "sitecustomize.py",
        '"""Written by zerotune: lets Accelerate run FSDP2 in CPU processes (see zerotune.accelerate_cpu)."""\n'
        "import os\n\n"
        'if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true":\n'
        "    from zerotune.probe import install_accelerate_cpu\n\n"
        "    install_accelerate_cpu()\n",
    )
    return folder


def wanted() -> bool:
    """Whether this process trains on CPU (no GPU torch can use, or DeepSpeed's CPU accelerator)."""
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        return True
    import torch

    return not torch.cuda.is_available()
