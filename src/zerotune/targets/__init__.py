"""What is tuned: a DeepSpeed script, a function, a Hugging Face Trainer script, an Accelerate
script or a Lightning program. Each kind owns how it is found, its trial command line, the
final command and the outputs only it writes. Only this package names a kind."""

from .._lazy import lazy_exports
from ._base import Target, require_config
from ._command import UserCommand
from ._detection import detect
from ._lightning_program import INSPECT, LightningJob, LightningTarget, default_cache_dir, is_tuned_config, read_cache

__all__ = [
    "INSPECT",
    "LightningJob",
    "LightningTarget",
    "Target",
    "UserCommand",
    "apply_tuned",
    "default_cache_dir",
    "describe",
    "detect",
    "fingerprint",
    "is_tuned_config",
    "read_cache",
    "require_config",
]

__getattr__ = lazy_exports(
    __name__, {"apply_tuned": "_lightning_fit", "describe": "_lightning_fit", "fingerprint": "_lightning_fit"}
)
"""apply_tuned, describe and fingerprint: their module imports Lightning, loaded on first use."""
