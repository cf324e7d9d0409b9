"""A tiny DeepSpeed training script with the habits that make re-running a script in the same
process hard (the warm-trial tests):

    --workers N       a DataLoader with N worker processes
    --atexit          registers an atexit hook that would write atexit.rank<R> in the trial folder
    --destroy         destroys the process group in a ``finally`` at the end
    --exit-after N    sys.exit(0) after N optimizer steps (the script ends before it is measured)
    --catch           catches BaseException around training and carries on to its end
    --oom-at N        raises a CUDA-style out-of-memory error at optimizer step N

Each rank writes the losses of its first steps to losses.rank<R>.json in the trial folder.
"""

import argparse
import atexit
import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist


def trial_dir() -> str:
    return os.path.dirname(os.environ["ZEROTUNE_PROBE"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--atexit", action="store_true")
    p.add_argument("--destroy", action="store_true")
    p.add_argument("--exit-after", type=int, default=0)
    p.add_argument("--catch", action="store_true")
    p.add_argument("--oom-at", type=int, default=0)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    deepspeed.init_distributed()
    rank = dist.get_rank()
    if args.atexit:
        atexit.register(lambda: open(os.path.join(trial_dir(), f"atexit.rank{rank}"), "w").close())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32))
    loader = torch.utils.data.DataLoader(
        data, batch_size=engine.train_micro_batch_size_per_gpu(), num_workers=args.workers, shuffle=False
    )
    losses = []
    try:
        try:
            train(engine, loader, losses, args, rank)
        except BaseException as e:  # noqa: BLE001 -- what --catch tests: a script that swallows everything
            if not args.catch:
                raise
            print(f"caught {type(e).__name__}; carrying on", flush=True)
    finally:
        if args.destroy:
            dist.destroy_process_group()


def train(engine, loader, losses, args, rank) -> None:
    step = 0
    while True:
        for (x,) in loader:
            loss = engine(x).pow(2).mean()
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                step += 1
                if len(losses) < 6:
                    losses.append(loss.item())
                    with open(os.path.join(trial_dir(), f"losses.rank{rank}.json"), "w") as f:
                        json.dump(losses, f)
            engine.step()
            if args.oom_at and step == args.oom_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            if args.exit_after and step >= args.exit_after:
                sys.exit(0)


if __name__ == "__main__":
    main()
