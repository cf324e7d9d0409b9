"""`zerotune estimate`: which stages and offloads fit, with what micro-batch, before any training.

The model's size comes from a parameter count (``--params 1.3B``), a Hugging Face style
config.json, or a Python factory ``module:function`` built on the meta device (no memory, no
weights). Activations come from the config's shape (Korthikanti et al., no recomputation) when it
is known.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..models import MemorySetup, estimate, largest_micro_batch
from ..trials import FSDP_STAGES
from ..units import parse_count

VARIANTS = [
    (0, "none", "none"),
    (1, "none", "none"),
    (1, "cpu", "none"),
    (2, "none", "none"),
    (2, "cpu", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
]
"""DeepSpeed's stages x offload (optimizer, parameters)."""
FSDP_VARIANTS = [(2, "none", "none"), (3, "none", "none"), (3, "cpu", "cpu")]
"""FSDP2 keeping and resharding the parameters, and resharding with every sharded state on the host."""


@dataclass(kw_only=True)
class Estimate:
    size: ModelSize
    rows: list[dict[str, Any]]
    devices: int
    device_memory: int
    overhead: int


@dataclass(kw_only=True)
class ModelSize:
    num_params: int
    largest_layer: int | None = None
    activation_per_sample: float | None = None
    """Bytes per sample at half precision, when the model's shape is known."""
    source: str = ""


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    """The first of ``keys`` that holds a plausible size (a positive number below 10^9)."""
    return next(
        (
            cfg[k]
            for k in keys
            if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg[k], bool) and 0 < cfg[k] < 1e9
        ),
        None,
    )


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def from_hf_config(path: str | Path, seq_len: int | None = None) -> ModelSize:
    """A decoder-style transformer from its config.json (GPT-2, Llama, OPT, ... key names)."""
    from ..request import read_config_text

    text = read_config_text(path, "--hf-config")
    try:
        cfg = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--hf-config {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValueError as e:
        raise ConfigError(f"--hf-config {str(path)!r}: {e}; give finite numbers") from None
    if not isinstance(cfg, dict):
        raise ConfigError(
            f"--hf-config {str(path)!r} must hold a JSON object {{...}} (a model's config.json), not "
            f"{type(cfg).__name__}"
        )
    h = _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _first(cfg, "vocab_size")
    for key in ("hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers", "vocab_size"):
        if key in cfg and _first(cfg, key) is None:
            raise ConfigError(
                f"--hf-config {str(path)!r}: {key} is {json.dumps(cfg[key])[:40]}, not a size; give a "
                "positive whole number below 10^9 (a model's own config.json has one)"
            )
    if not (h and layers and vocab):
        raise ConfigError(
            f"--hf-config {str(path)!r} lacks hidden_size, num_hidden_layers or vocab_size; give --params instead"
        )
    heads = _first(cfg, "num_attention_heads", "n_head") or max(1, h // 64)
    ffn = _first(cfg, "intermediate_size", "n_inner", "ffn_dim") or 4 * h
    seq = seq_len or _first(cfg, "max_position_embeddings", "n_positions", "seq_length") or 2048
    mlp = (3 if "intermediate_size" in cfg and cfg.get("hidden_act", "") in ("silu", "swiglu") else 2) * h * ffn
    params = int(
        layers * (4 * h * h + mlp + 4 * h) + vocab * h + (0 if cfg.get("tie_word_embeddings", True) else vocab * h)
    )
    # Per layer and sample s*h*(34 + 5*a*s/h) bytes in half precision, plus the logits (half + fp32).
    act = layers * seq * h * (34 + 5 * heads * seq / h) + seq * vocab * 6
    return ModelSize(
        num_params=params,
        largest_layer=max(vocab * h, h * ffn),
        activation_per_sample=act,
        source=f"{path}: hidden {h}, layers {layers}, heads {heads}, vocabulary {vocab}, sequence {seq}",
    )


def from_factory(spec: str) -> ModelSize:
    """``module:function`` or ``file.py:function`` returning a torch module, built on the meta device."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"--factory {spec!r}: write it as module:function or path/to/file.py:function")
    try:
        if target.endswith(".py"):
            if not Path(target).is_file():
                raise ConfigError(f"--factory: {target!r} does not exist")
            module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            module = importlib.util.module_from_spec(module_spec)
            sys.path.insert(0, str(Path(target).resolve().parent))
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        factory = getattr(module, name)
    except ConfigError:
        raise
    except (Exception, SystemExit) as e:  # the user's code: say what failed, not where in zerotune
        raise ConfigError(f"--factory {spec!r} cannot be imported: {type(e).__name__}: {e}") from None
    import torch

    try:
        with torch.device("meta"):
            model = factory()
    except (Exception, SystemExit) as e:
        raise ConfigError(f"--factory {spec!r} failed on the meta device: {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"--factory {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if params == 0:
        raise ConfigError(f"--factory {spec!r} built a model without trainable parameters")
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelSize(num_params=params, largest_layer=largest or None, source=f"{spec}: {type(model).__name__}")


def table(
    size: ModelSize,
    *,
    dp: int,
    precision: str,
    device_memory: int,
    overhead: float,
    candidates: list[int],
    processes_per_node: int,
) -> list[dict[str, Any]]:
    """One row per engine, stage and offload (DeepSpeed's ZeRO stages, FSDP2's settings): device peak at the smallest micro-batch, host per node, and the
    largest micro-batch that fits (None when none does, "?" when activations are unknown)."""
    rows = []
    variants = [("deepspeed", *v) for v in VARIANTS] + [("fsdp", *v) for v in FSDP_VARIANTS]
    for engine, stage, off_opt, off_param in variants:
        setup = MemorySetup(
            engine=engine,
            num_params=size.num_params,
            largest_layer=size.largest_layer,
            dp=dp,
            precision=precision,
            stage=stage,
            offload_optimizer=off_opt,
            offload_param=off_param,
            overhead=overhead,
            activation_per_sample=(size.activation_per_sample or 0.0) * (1 if precision != "fp32" else 2),
        )
        b = estimate(setup, candidates[0])
        fits = largest_micro_batch(setup, device_memory, candidates)
        rows.append(
            {
                "engine": engine,
                "setting": f"ZeRO-{stage}" if engine == "deepspeed" else f"FSDP2 {FSDP_STAGES[stage]}",
                "stage": stage,
                "offload_optimizer": off_opt,
                "offload_param": off_param,
                "device_bytes": b.device_total,
                "host_bytes_per_node": b.host_total * processes_per_node,
                "breakdown": b.device,
                "host_breakdown": b.host,
                "largest_micro_batch": fits if size.activation_per_sample is not None or fits is None else "?",
            }
        )
    return rows


def profile(command: list[str], *, num_gpus: int, results_dir: Path, precision: str) -> tuple[ModelSize, float]:
    """One short real trial of ``command`` (at its ds_config's first stage and smallest micro-batch):
    the parameter count, activations per sample and fixed overhead it measures."""
    from ..models import MemorySetup, model_states
    from ..search import Searcher, Suggestion
    from ..trials import TrialSpec, TrialState
    from ..tuning import Autotuner

    class OneTrial(Searcher):
        def __init__(self):
            self.spec: TrialSpec | None = None
            self.done = False

        def suggest(self):
            return None if self.done else Suggestion(self.spec)

        def observe(self, result):
            self.done = True

    searcher = OneTrial()
    tuner = Autotuner(command, num_gpus=num_gpus, results_dir=results_dir, searcher=searcher, overwrite=True)
    stage = tuner.request.stages[0]
    mb = tuner.trials.candidates()[0]
    gas = tuner.request.global_batch // (mb * tuner.trials.dp) if tuner.request.global_batch else 1
    searcher.spec = TrialSpec(stage=stage, micro_batch=mb, grad_accum=gas)
    result = tuner.tune().trials[0]
    if result.state is not TrialState.OK or not result.static_memory or not result.num_params:
        raise ConfigError(
            f"the profiling trial {result.name} ended {result.state.value}: {result.reason}; see {results_dir}"
        )
    peak, static = result.max_peak, max(result.static_memory)
    states = model_states(
        MemorySetup(
            num_params=result.num_params,
            dp=tuner.trials.dp,
            stage=stage,
            precision=precision,
            reduce_bucket_size=0,
            allgather_bucket_size=0,
            prefetch_bucket_size=0,
        )
    )
    size = ModelSize(
        num_params=result.num_params,
        activation_per_sample=max(0.0, (peak - static) / mb),
        source=f"profiled: {result.name} of {command[0]} on {num_gpus} {tuner.node.device} process(es)",
    )
    return size, max(0.0, static - states)


def from_args(args) -> Estimate:
    """The predictions `zerotune estimate` asks for, from its parsed options."""
    from ..launch import check_counts
    from ..request import MAX_GLOBAL_BATCH, MAX_MICRO_BATCH
    from ..units import parse_size

    check_counts(args.num_gpus, args.num_nodes)
    if args.seq_len is not None and not 1 <= args.seq_len <= 2**24:
        raise ConfigError(f"--seq-len {args.seq_len} must be a number of tokens from 1 to {2**24}")
    measured_overhead = None
    if args.profile:
        import tempfile

        if not args.command:
            raise ConfigError("--profile needs the script after it: --profile train.py --deepspeed_config ds.json")
        out = Path(tempfile.mkdtemp(prefix="zerotune-profile-"))
        size, measured_overhead = profile(args.command, num_gpus=1, results_dir=out, precision=args.precision)
    elif args.params:
        size = ModelSize(num_params=parse_count(args.params, what="--params"), source=f"--params {args.params}")
        if args.largest_layer:
            size.largest_layer = parse_count(args.largest_layer, what="--largest-layer")
            if size.largest_layer > size.num_params:
                raise ConfigError("--largest-layer cannot exceed --params")
    elif args.hf_config:
        size = from_hf_config(args.hf_config, args.seq_len)
    elif args.factory:
        size = from_factory(args.factory)
    else:
        raise ConfigError(
            "give the model's size: --params 1.3B, --hf-config config.json, --factory module:function "
            "or --profile script.py ..."
        )
    if args.activation_per_sample:
        size.activation_per_sample = parse_size(args.activation_per_sample, what="--activation-per-sample")
    device_memory = parse_size(args.device_memory, what="--device-memory")
    if args.overhead is not None:
        overhead = parse_size(args.overhead, what="--overhead")
    else:
        overhead = int(measured_overhead) if measured_overhead is not None else 1024**3
    dp = args.num_gpus * args.num_nodes
    candidates = [2**i for i in range(11)]
    if args.global_batch is not None:
        if not 1 <= args.global_batch <= MAX_GLOBAL_BATCH or args.global_batch % dp:
            raise ConfigError(
                f"--global-batch {args.global_batch} must be a multiple of the {dp} devices from 1 to "
                f"{MAX_GLOBAL_BATCH}"
            )
        per_device = args.global_batch // dp
        candidates = [c for c in range(1, min(per_device, MAX_MICRO_BATCH) + 1) if per_device % c == 0]
    rows = table(
        size,
        dp=dp,
        precision=args.precision,
        device_memory=device_memory,
        overhead=overhead,
        candidates=candidates,
        processes_per_node=args.num_gpus,
    )
    return Estimate(size=size, rows=rows, devices=dp, device_memory=device_memory, overhead=overhead)
