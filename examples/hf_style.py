"""A training script in Hugging Face Trainer style: batch sizes come as arguments, and the
ds_config's ``"auto"`` values are filled from them by the script, as ``transformers`` does.

    deepspeed --num_gpus 2 examples/hf_style.py --per_device_train_batch_size 8 \
        --gradient_accumulation_steps 2 --deepspeed examples/ds_config_hf.json

zerotune tunes it through ``autotuning.arg_mappings`` (see ``examples/ds_config_hf.json``): each
trial rewrites ``--per_device_train_batch_size`` and ``--gradient_accumulation_steps`` and leaves
the ``"auto"`` values for the script. The model is the GPT of ``gpt.py``.
"""
import argparse
import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, MODELS, SyntheticTokens  # noqa: E402


def fill_auto(config: dict, args: argparse.Namespace, world: int, hidden: int) -> dict:
    """Replace "auto" the way Hugging Face's HfTrainerDeepSpeedConfig does: batch sizes and the
    learning rate from the arguments, ZeRO buckets from the hidden size."""
    def fill(node: dict, key: str, value) -> None:
        if node.get(key) == "auto":
            node[key] = value

    fill(config, "train_micro_batch_size_per_gpu", args.per_device_train_batch_size)
    fill(config, "gradient_accumulation_steps", args.gradient_accumulation_steps)
    fill(config, "train_batch_size", args.per_device_train_batch_size * args.gradient_accumulation_steps * world)
    fill((config.get("optimizer") or {}).get("params") or {}, "lr", args.learning_rate)
    zero = config.get("zero_optimization") or {}
    fill(zero, "reduce_bucket_size", hidden * hidden)
    fill(zero, "stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
    fill(zero, "stage3_param_persistence_threshold", 10 * hidden)
    return config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--deepspeed", required=True, help="path to the ds_config")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--max_steps", type=int, default=100)
    p.add_argument("--model", choices=sorted(MODELS), default="small")
    args = p.parse_args()

    deepspeed.init_distributed()
    world = dist.get_world_size()
    vocab, d_model, layers, heads, seq_len = MODELS[args.model]
    with open(args.deepspeed) as f:
        config = fill_auto(json.load(f), args, world, d_model)
    config.pop("autotuning", None)
    torch.manual_seed(0)
    net = GPT(vocab, d_model, layers, heads, seq_len)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    data = SyntheticTokens(vocab, seq_len)
    loader = DataLoader(data, batch_size=args.per_device_train_batch_size,
                        sampler=DistributedSampler(data, num_replicas=world, rank=dist.get_rank()))
    step = 0
    for micro, tokens in enumerate(loader, 1):
        loss = engine(tokens.to(engine.device))
        engine.backward(loss)
        engine.step()
        if micro % args.gradient_accumulation_steps == 0:
            step += 1
            if dist.get_rank() == 0 and step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.max_steps:
                break


if __name__ == "__main__":
    main()
