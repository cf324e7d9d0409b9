"""Models fitted on measured trials: per-rank memory (what cannot fit is never launched) and
throughput (which micro-batches are worth measuring)."""

from ._memory import MemoryModel, Z, model_states
from ._memory_terms import MemorySetup, estimate, largest_micro_batch
from ._throughput import Prediction, ThroughputModel

__all__ = [
    "MemoryModel",
    "MemorySetup",
    "Prediction",
    "ThroughputModel",
    "Z",
    "estimate",
    "largest_micro_batch",
    "model_states",
]
