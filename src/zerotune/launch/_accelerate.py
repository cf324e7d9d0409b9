"""The ranks of a trial started by Accelerate's launcher (``accelerate launch``) instead of
DeepSpeed's: for programs whose users start them so, with their Accelerate config."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def accelerate_argv(options: Sequence[str], num_gpus: int, port: int, devices: list[int] | None) -> list[str]:
    """``accelerate launch`` with ``options`` (its config file and the user's other options),
    starting ``zerotune.probe`` in ``num_gpus`` processes on this node, on ``devices``. The
    user's arguments are not here: the probe reads them from the trial folder."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *options,
        "--num_processes",
        str(num_gpus),
        "--num_machines",
        "1",
        "--main_process_port",
        str(port),
        *(["--gpu_ids", ",".join(map(str, devices))] if devices else []),
        "--module",
        "zerotune.probe",
    ]
