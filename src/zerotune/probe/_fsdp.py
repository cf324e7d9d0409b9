"""Hooks that measure a training under PyTorch FSDP2 (``fully_shard``), as DeepSpeed's engine
hooks measure one under ZeRO.

FSDP2 has no engine object to wrap: the training is found from outside. Every module that
``fully_shard`` wraps is hooked; the first whose forward runs is the root, and its forward marks
each micro-step; every optimizer step (torch's global step hook) is a gradient-accumulation
boundary, since Accelerate and the Hugging Face Trainer call the optimizer only there.
:class:`FsdpTraining` answers the probe's questions in the words of DeepSpeed's engine.
"""

from __future__ import annotations

from typing import Any


class FsdpTraining:
    """What the probe reads of a training under FSDP2: its root module, device and batch."""

    config_hint = (
        "train through Accelerate or the Hugging Face Trainer with the FSDP config zerotune gives the "
        "run (--fsdp_config, or the Accelerate config's fsdp_config)"
    )

    def __init__(self, root, expect: dict[str, Any]):
        self.module = root
        self.expect = expect
        first = next(iter(root.parameters()), None)
        self.device = first.device if first is not None else None
        self.forwards = 0
        """Forwards since the last optimizer step."""
        self.accumulation: int | None = None
        """Forwards in the first optimizer step: the accumulation the script ran."""

    def zero_optimization_stage(self) -> int:
        return int(self.expect.get("stage", 3))

    def train_micro_batch_size_per_gpu(self) -> int:
        return int(self.expect.get("micro_batch", 1))

    def gradient_accumulation_steps(self) -> int:
        return self.accumulation or int(self.expect.get("grad_accum", 1))

    def train_batch_size(self) -> int:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        return self.train_micro_batch_size_per_gpu() * self.gradient_accumulation_steps() * world

    def stepped(self) -> None:
        """An optimizer step ended: the micro-steps before it were one accumulation."""
        if self.accumulation is None:
            self.accumulation = max(1, self.forwards)
        self.forwards = 0


def install_fsdp(probe) -> None:
    """Hook every module ``fully_shard`` wraps from now on (Accelerate imports it at each call):
    the first of them whose forward runs is the root, whose forwards mark the micro-steps; each
    optimizer step after it (torch's global step hook) ends an accumulation."""
    import functools

    import torch.distributed.fsdp as fsdp
    from torch.optim.optimizer import register_optimizer_step_post_hook

    probe.flops_note = "FSDP2 trials are not profiled for FLOPs"
    state: dict[str, Any] = {"training": None}

    def pre_forward(module, args, kwargs):
        training = state["training"]
        if training is None:  # the outermost wrapped module's forward runs first: the root
            training = state["training"] = FsdpTraining(module, probe.spec.get("expect") or {})
            if probe.model_params is None:
                probe.model_params = sum(int(p.numel()) for p in module.parameters())
            probe.engine_built()
        if module is not training.module:
            return None
        if probe.finished is not None:  # a script that caught the stop and trains on
            probe.stop()
        if training.forwards:
            probe.after_micro(training)  # the previous micro-step ended with this forward's start
        training.forwards += 1
        probe.before_forward(training, args, kwargs)
        return None

    def post_forward(module, args, out):
        training = state["training"]
        if training is not None and module is training.module:
            probe.saw_output(out)
        return None

    original = fsdp.fully_shard

    @functools.wraps(original)
    def fully_shard(module, *args, **kwargs):
        out = original(module, *args, **kwargs)
        for m in module if isinstance(module, (list, tuple)) else [module]:
            m.register_forward_pre_hook(pre_forward, with_kwargs=True, prepend=True)
            m.register_forward_hook(post_forward)
        return out

    def after_optimizer_step(optimizer, args, kwargs):
        training = state["training"]
        if training is None:
            return
        training.stepped()
        probe.after_step(training)

    fsdp.fully_shard = fully_shard
    register_optimizer_step_post_hook(after_optimizer_step)  # for the process: FSDP2 trials run cold
