"""A small GPT-style causal language model trained with DeepSpeed on synthetic tokens.

A plain DeepSpeed script, the kind zerotune tunes without changes. With zerotune, which
searches what ``ds_config.json`` lists (every ZeRO stage, micro-batches at a global batch of 64),
then trains with its choice (``tune`` stops after the choice):

    zerotune run --num-gpus 2 examples/gpt.py --deepspeed_config examples/ds_config.json

Without it, plain DeepSpeed on a fixed config (``ds_config_fixed.json``; or the
``ds_config_optimal.json`` a tuning wrote):

    deepspeed --num_gpus 2 examples/gpt.py --deepspeed_config examples/ds_config_fixed.json

On a machine without GPUs prefix either with ``DS_ACCELERATOR=cpu``. ``--model tiny`` picks a
~0.2M-parameter model for fast tests; ``--model small`` (default) has ~12.6M parameters;
``--steps`` the optimizer steps. ``ds_config_gpu.json`` is a GPU job's config to tune (bf16,
stages 1-3, the optimizer offloaded or not). From Python, ``train(ds_config_dict, model="tiny")``
trains in each rank of a launched job.
"""

import argparse
import math

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

MODELS = {
    # name: (vocab, d_model, layers, heads, seq_len)
    "tiny": (512, 64, 2, 2, 32),
    "small": (8192, 320, 6, 5, 64),
    "medium": (32768, 512, 8, 8, 128),
}


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class SyntheticTokens(Dataset):
    """Token sequences with learnable structure: each is an arithmetic progression mod vocab."""

    def __init__(self, vocab: int, seq_len: int, size: int = 100_000):
        self.vocab, self.seq_len, self.size = vocab, seq_len, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        start, stride = torch.randint(0, self.vocab, (2,), generator=g).tolist()
        return (start + (stride % 7 + 1) * torch.arange(self.seq_len)) % self.vocab


def train(
    ds_config: dict | None = None,
    *,
    model: str = "small",
    steps: int = 200,
    log_every: int = 10,
    args: argparse.Namespace | None = None,
) -> None:
    """Train the model; the ds_config comes as a dict, or from ``args.deepspeed_config``."""
    torch.manual_seed(0)
    vocab, d_model, layers, heads, seq_len = MODELS[model]
    net = GPT(vocab, d_model, layers, heads, seq_len)
    engine, _, _, _ = deepspeed.initialize(
        args=args if ds_config is None else None, model=net, model_parameters=net.parameters(), config=ds_config
    )

    data = SyntheticTokens(vocab, seq_len)
    sampler = DistributedSampler(data, num_replicas=engine.world_size, rank=engine.global_rank)
    loader = DataLoader(data, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler)
    params = sum(p.numel() for p in net.parameters())
    if engine.global_rank == 0:
        print(
            f"model={model} params={params / 1e6:.2f}M micro_batch={engine.train_micro_batch_size_per_gpu()} "
            f"grad_accum={engine.gradient_accumulation_steps()} zero_stage={engine.zero_optimization_stage()}",
            flush=True,
        )

    step, micro = 0, 0
    gas = engine.gradient_accumulation_steps()
    for epoch in range(math.ceil(steps * gas * loader.batch_size / len(data)) + 1):
        sampler.set_epoch(epoch)
        for tokens in loader:
            loss = engine(tokens.to(engine.device))
            engine.backward(loss)
            engine.step()
            micro += 1
            if micro % gas == 0:
                step += 1
                if engine.global_rank == 0 and step % log_every == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
                if step >= steps:
                    return


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps to train")
    parser.add_argument("--log-every", type=int, default=10)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    train(model=args.model, steps=args.steps, log_every=args.log_every, args=args)
    # Ended here, not left to the interpreter's exit: there, gloo's threads can abort a rank
    # that has finished training ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
