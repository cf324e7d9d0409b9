"""What lets Accelerate (and the Hugging Face Trainer) run in CPU processes as on GPUs: FSDP2,
and DeepSpeed's ranks told apart (see zerotune.accelerate_cpu)."""

from __future__ import annotations

import os

_installed = False


def install() -> None:
    """Two checks of Accelerate's that only a GPU passes, lifted (once per process):

    - where it set up multi-CPU data parallelism and was given an FSDP plugin, its state becomes
      FSDP with that plugin, as on a GPU;
    - where DeepSpeed started the process group (its CPU accelerator) and Accelerate counted one
      process, it counts the group's: each rank is told its index, so that its DataLoader gives
      it its own share of the batch, as on GPUs (else every rank trains on the same samples).
    """
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    from accelerate import state
    from accelerate.utils import DistributedType

    partial_init = state.PartialState.__init__

    def partial(self, *args, **kwargs):
        partial_init(self, *args, **kwargs)
        if dist.is_available() and dist.is_initialized() and self.num_processes == 1 and dist.get_world_size() > 1:
            self.num_processes, self.process_index = dist.get_world_size(), dist.get_rank()
            self.local_process_index = int(os.environ.get("LOCAL_RANK", "0"))

    accelerator_init = state.AcceleratorState.__init__

    def accelerator(self, *args, fsdp_plugin=None, **kwargs):
        accelerator_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    state.PartialState.__init__ = partial
    state.AcceleratorState.__init__ = accelerator
    _installed = True
