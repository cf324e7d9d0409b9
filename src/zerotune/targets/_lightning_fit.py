"""What a Lightning ``fit`` asks for, and a tuned config applied to it: read by the strategy, and
by the probe's Lightning hooks in the trial processes.

The micro-batch lives where Lightning's BatchSizeFinder looks for it (a ``batch_size`` attribute of
the LightningModule, its hparams or the DataModule); accumulation is the Trainer's
``accumulate_grad_batches``. A config never carries ``gradient_accumulation_steps`` into Lightning.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy

from .._errors import ConfigError
from ._lightning_program import LightningJob, trainer_settings


def batch_size_holders(model, datamodule) -> list[tuple[Any, str]]:
    """Objects holding ``batch_size``, in Lightning's order (the last one is read)."""
    holders: list[tuple[Any, str]] = []
    if model is not None and hasattr(model, "batch_size"):
        holders.append((model, "model"))
    hparams = getattr(model, "hparams", None) if model is not None else None
    if hparams is not None and "batch_size" in hparams:
        holders.append((hparams, "hparams"))
    if datamodule is not None and hasattr(datamodule, "batch_size"):
        holders.append((datamodule, "datamodule"))
    return holders


def _get(holder) -> Any:
    obj, _ = holder
    return obj["batch_size"] if isinstance(obj, dict) else obj.batch_size


def _loader_batch_size(trainer, model, datamodule, train_dataloaders) -> int | None:
    """The batch size of the train DataLoader that fit will use (no batch_size attribute)."""
    loader = train_dataloaders
    try:
        if loader is None and datamodule is not None:
            loader = datamodule.train_dataloader()
        elif loader is None and getattr(trainer.fit_loop._data_source, "instance", None) is not None:
            loader = trainer.fit_loop._data_source.dataloader()  # what trainer.fit(model, loader) attached
        elif loader is None:
            loader = model.train_dataloader()
    except Exception:  # the script's own data code: a failure here is reported by its real run
        return None
    return getattr(loader, "batch_size", None)


def _num_params(model) -> int:
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())


def _device_memory(strategy) -> tuple[str, int]:
    from lightning.pytorch.accelerators import CUDAAccelerator

    if isinstance(strategy.accelerator, CUDAAccelerator):
        import torch

        return "cuda", int(torch.cuda.get_device_properties(0).total_memory)
    from ..launch import host_memory

    return "cpu", host_memory()


def describe(strategy, trainer, model, datamodule=None, train_dataloaders=None) -> LightningJob:
    """What ``trainer.fit(model, ...)`` asks for, read before any process is started."""
    holders = batch_size_holders(model, datamodule)
    batch_size = _get(holders[-1]) if holders else _loader_batch_size(trainer, model, datamodule, train_dataloaders)
    is_ds = isinstance(strategy, DeepSpeedStrategy)
    world = len(strategy.parallel_devices or [None]) * getattr(strategy, "num_nodes", 1)
    try:
        config = json.loads(json.dumps(strategy.config)) if is_ds and strategy.config else {}
    except TypeError as e:
        raise ConfigError(
            f"the strategy's DeepSpeed config is not JSON ({e}); pass plain numbers, strings, lists and dicts"
        ) from None
    job = LightningJob(
        strategy=type(strategy).__name__,
        deepspeed=is_ds,
        world_size=world,
        num_nodes=getattr(strategy, "num_nodes", 1),
        precision=str(getattr(strategy.precision_plugin, "precision", "32-true")),
        batch_size=int(batch_size) if isinstance(batch_size, int) else None,
        batch_size_attr=holders[-1][1] if holders else None,
        accumulate_grad_batches=int(trainer.accumulate_grad_batches),
        base_config=config,
        num_params=_num_params(model),
    )
    extras = getattr(strategy, "_describe_extras", None)
    if extras is not None:  # AutotuneDeepSpeedStrategy: its search space, cache and fingerprint
        extras(job, model)
    return job


def fingerprint(job: LightningJob, model, strategy) -> str:
    """Same model, processes, device, precision, global batch and search space: same result."""
    device, memory = _device_memory(strategy)
    inputs = {
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "structure": hashlib.sha256(str(model).encode()).hexdigest(),
        "num_params": _num_params(model),
        "world_size": job.world_size,
        "num_nodes": job.num_nodes,
        "device": device,
        "device_memory": memory,
        "precision": job.precision,
        "global_batch": job.global_batch,
        "micro_batch_fixed": job.batch_size if job.batch_size_attr is None else None,
        "config": job.tuning_config(),
        "offload": job.offload,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def apply_tuned(strategy, trainer, config: dict[str, Any]) -> tuple[int, int]:
    """Train with ``config``: its micro-batch goes to the ``batch_size`` attribute, its
    accumulation to ``trainer.accumulate_grad_batches``, the rest to the strategy's config.
    Returns (micro-batch, accumulation)."""
    world = len(strategy.parallel_devices or [None]) * strategy.num_nodes
    mb, gas = trainer_settings(config, world)
    model = strategy.lightning_module
    holders = batch_size_holders(model, trainer.datamodule)
    for obj, _ in holders:
        if isinstance(obj, dict):
            obj["batch_size"] = mb
        else:
            obj.batch_size = mb
    trainer.accumulate_grad_batches = gas
    cfg = copy.deepcopy(config)
    for key in ("gradient_accumulation_steps", "train_batch_size", "autotuning"):
        cfg.pop(key, None)
    strategy.config = cfg
    strategy._config_initialized = False  # Lightning formats it again (accumulation, precision)
    return mb, gas
