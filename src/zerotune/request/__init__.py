"""What the user asks to tune: their ds_config and its ``autotuning`` section, read with
DeepSpeed's key names, and the space of configurations it spans."""

from ._config import (
    MAX_GLOBAL_BATCH,
    MAX_MICRO_BATCH,
    MAX_PROCESSES,
    STAGES,
    AutotuningConfig,
    TuningRequest,
    load_ds_config,
    parse_request,
    parse_stages,
    read_config_text,
)
from ._fsdp import (
    FSDP_FILE,
    FsdpSettings,
    config_file,
    deepspeed_space,
    ds_equivalent,
    fsdp_config,
    numerics,
    numerics_line,
    parse_engines,
    parse_wrap,
    precision_of,
)
from ._own import SEARCHABLE, parse_search
from ._space import MICRO_BATCH, Dimension, Space, effective_value, invalid_reason, stage_dimensions, trial_config

__all__ = [
    "FSDP_FILE",
    "FsdpSettings",
    "config_file",
    "deepspeed_space",
    "ds_equivalent",
    "fsdp_config",
    "numerics",
    "numerics_line",
    "parse_engines",
    "parse_wrap",
    "precision_of",
    "SEARCHABLE",
    "parse_search",
    "AutotuningConfig",
    "Dimension",
    "MAX_GLOBAL_BATCH",
    "MAX_MICRO_BATCH",
    "MAX_PROCESSES",
    "MICRO_BATCH",
    "STAGES",
    "Space",
    "TuningRequest",
    "effective_value",
    "invalid_reason",
    "load_ds_config",
    "parse_request",
    "parse_stages",
    "read_config_text",
    "stage_dimensions",
    "trial_config",
]
