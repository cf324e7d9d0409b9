"""Peak memory of one rank, term by term, for a ZeRO stage, offload, precision and micro-batch.

Model states follow DeepSpeed's ZeRO accounting (the ZeRO paper; DeepSpeed's
``estimate_zero2/3_model_states_mem_needs``): with mixed precision 2 bytes per parameter of
half-precision weights, 2 of gradients and 16 of optimizer state (fp32 master weights, Adam's two
moments and the fp32 gradient partition); in fp32, 4 + 4 + 8. Stage 1 partitions the optimizer
state over the data-parallel ranks, stage 2 also the gradients, stage 3 also the weights (a rank
then gathers one layer, plus the prefetch bucket, at a time). Offload moves the optimizer state
(and with stage 3 the weights) to host memory. ZeRO's communication buckets, activations (bytes
per sample, calibrated from trials) and a fixed runtime overhead complete the device side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIXED = {"fp16", "bf16"}
DEVICE_TERMS = ("params", "gradients", "optimizer", "buffers", "activations", "overhead")


@dataclass(kw_only=True)
class MemorySetup:
    """What decides a rank's memory, apart from the micro-batch."""

    num_params: int
    """Trainable parameters of the whole model."""
    largest_layer: int | None = None
    """Parameters of the largest layer (ZeRO-3 gathers it whole); default: a tenth of the model."""
    dp: int = 1
    """Data-parallel ranks that share the partitioned states."""
    mp: int = 1
    precision: str = "fp32"
    """"fp32", or "fp16"/"bf16" (mixed: half-precision weights with fp32 master weights)."""
    optimizer_bytes: float = 8.0
    """Optimizer state per parameter in fp32 (Adam: two moments, 8 bytes)."""
    stage: int = 0
    offload_optimizer: str = "none"
    offload_param: str = "none"
    reduce_bucket_size: float = 5e8
    allgather_bucket_size: float = 5e8
    overlap_comm: bool = False
    prefetch_bucket_size: float = 5e7
    activation_per_sample: float = 0.0
    """Activation bytes per sample of the micro-batch (calibrated from trials)."""
    overhead: float = 0.0
    """Fixed runtime memory: CUDA context and allocator, or the process itself on CPU."""
    engine: str = "deepspeed"
    """"fsdp": PyTorch FSDP2, its ``stage`` 3 resharding the parameters after forward, 2 keeping
    them (see zerotune.trials' FSDP_STAGES); its offload moves every sharded state to the host."""

    def __post_init__(self):
        if self.num_params < 1:
            raise ValueError(f"num_params must be positive, not {self.num_params}")
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0-3, not {self.stage}")
        if self.precision not in MIXED | {"fp32"}:
            raise ValueError(f"precision must be fp32, fp16 or bf16, not {self.precision!r}")
        if self.offload_param != "none" and self.stage < 3 and self.engine == "deepspeed":
            raise ValueError("offload_param needs ZeRO stage 3")
        if self.offload_optimizer != "none" and self.stage < 1:
            raise ValueError("offload_optimizer needs ZeRO stage 1 or higher")

    @classmethod
    def from_config(cls, config: dict, *, num_params: int, dp: int, mp: int = 1) -> MemorySetup:
        """The setup a ds_config (with its stage set) describes, with DeepSpeed's defaults for
        what it leaves out."""
        zero = config.get("zero_optimization") or {}
        stage = int(zero.get("stage", 0))

        def number(key: str, default: float) -> float:
            value = zero.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        def device(block: str) -> str:
            value = (zero.get(block) or {}).get("device", "none") if isinstance(zero.get(block), dict) else "none"
            return value if value in ("cpu", "nvme") else "none"

        return cls(
            num_params=num_params,
            dp=dp,
            mp=mp,
            stage=stage,
            precision=next((k for k in ("bf16", "fp16") if (config.get(k) or {}).get("enabled")), "fp32"),
            offload_optimizer=device("offload_optimizer") if stage >= 1 else "none",
            offload_param=device("offload_param") if stage == 3 or config.get("engine") == "fsdp" else "none",
            reduce_bucket_size=number("reduce_bucket_size", 5e8),
            allgather_bucket_size=number("allgather_bucket_size", 5e8),
            overlap_comm=bool(zero.get("overlap_comm", stage == 3)),
            prefetch_bucket_size=number("stage3_prefetch_bucket_size", 5e7),
            engine=str(config.get("engine", "deepspeed")),
        )

    @property
    def weight_bytes(self) -> int:
        return 2 if self.precision in MIXED else 4

    @property
    def optimizer_state_bytes(self) -> float:
        """Per parameter: optimizer state, plus fp32 master weights and gradients when mixed."""
        return self.optimizer_bytes + (8.0 if self.precision in MIXED else 0.0)


@dataclass
class Breakdown:
    """Bytes per rank, each term named: device side and host side."""

    device: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)

    @property
    def device_total(self) -> float:
        return sum(self.device.values())

    @property
    def host_total(self) -> float:
        return sum(self.host.values())


def estimate_fsdp(s: MemorySetup, micro_batch: int) -> Breakdown:
    """Peak memory of one FSDP2 rank at ``micro_batch``: its shards of the fp32 parameters,
    gradients and optimizer states (Accelerate keeps fp32 shards under mixed precision; on the
    host with offload), and the unsharded parameters in the compute dtype: one unit gathered and
    the next prefetched where they are resharded after forward, every unit where they are kept
    until backward; and one unit's unsharded gradients before their reduce-scatter."""
    p, w, dp = s.num_params / s.mp, s.weight_bytes, s.dp
    layer = min(p, s.largest_layer if s.largest_layer else p / 10)
    shards = {"params": 4 * p / dp, "gradients": 4 * p / dp, "optimizer": s.optimizer_bytes * p / dp}
    offload = s.offload_param != "none" or s.offload_optimizer != "none"
    gathered = 2 * w * layer if s.stage == 3 else w * p
    out = Breakdown()
    out.device = {
        "params": gathered + (0.0 if offload else shards["params"]),
        "gradients": w * layer + (0.0 if offload else shards["gradients"]),
        "optimizer": 0.0 if offload else shards["optimizer"],
        "buffers": 0.0,
        "activations": s.activation_per_sample * micro_batch,
        "overhead": s.overhead,
    }
    out.host = dict(shards) if offload else {"optimizer": 0.0, "params": 0.0}
    return out


def estimate(s: MemorySetup, micro_batch: int) -> Breakdown:
    """Peak memory of one rank at ``micro_batch``."""
    if s.engine == "fsdp":
        return estimate_fsdp(s, micro_batch)
    p = s.num_params / s.mp
    w, dp = s.weight_bytes, s.dp
    layer = min(p, s.largest_layer if s.largest_layer else p / 10)
    opt_total = s.optimizer_state_bytes * p / (dp if s.stage >= 1 else 1)
    out = Breakdown()
    if s.stage < 3:
        params = w * p
        grads = w * p / (dp if s.stage >= 2 else 1)
        if s.offload_optimizer != "none" and s.stage == 2:
            grads = 0.0  # gradients go to the host partition bucket by bucket
        buffers = w * min(s.reduce_bucket_size, p) * (2 if s.overlap_comm else 1) if s.stage >= 1 else 0.0
        buffers += w * min(s.allgather_bucket_size, p) if s.stage >= 1 else 0.0
    else:
        # One gathered layer's weights and gradients (DeepSpeed's 4L), the prefetched weights,
        # and this rank's partition of the weights unless they live on the host.
        params = 2 * w * layer + (0.0 if s.offload_param != "none" else w * p / dp)
        grads = 0.0  # reduced straight into the fp32 partition (part of the optimizer term)
        buffers = w * min(s.prefetch_bucket_size, p)
    out.device = {
        "params": params,
        "gradients": grads,
        "optimizer": 0.0 if s.offload_optimizer != "none" else opt_total,
        "buffers": buffers,
        "activations": s.activation_per_sample * micro_batch,
        "overhead": s.overhead,
    }
    out.host = {
        "optimizer": opt_total if s.offload_optimizer != "none" else 0.0,
        "params": w * p / dp if s.offload_param != "none" else 0.0,
    }
    return out


def largest_micro_batch(s: MemorySetup, budget: float, candidates: list[int]) -> int | None:
    """The largest candidate whose predicted device peak fits ``budget``, or None."""
    fitting = [c for c in candidates if estimate(s, c).device_total <= budget]
    return max(fitting) if fitting else None
