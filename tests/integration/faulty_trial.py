"""A tiny DeepSpeed training script that misbehaves on purpose: the fault matrix of zerotune's
reliability tests and of bench/faults.py.

    --faults '{"0": "segv"}'   ZeRO stage -> fault; other stages train normally
    --at-step 1                the optimizer step after which the fault strikes
    --fault-once PATH          strike only if PATH does not exist yet (and create it): a rerun is clean

Faults: exit1 (every rank exits with status 1), segv (rank 1 dies of SIGSEGV), hang (every rank
stops making progress), oom (a CUDA out-of-memory error), error_words (prints "error" lines but
trains fine), rank_dies (rank 1 vanishes while rank 0 waits in the next all-reduce),
slow_start (sleeps before deepspeed.initialize, then trains fine), ignore_term (every rank ignores
SIGTERM and stops making progress: only SIGKILL ends it), killed (rank 1 is killed with SIGKILL, as
a user's `kill -9` or a watchdog does), daemon (rank 0 starts a daemon in a session of its own,
which sleeps for 900 s, then trains fine).
"""

import argparse
import json
import os
import signal
import sys
import time

import deepspeed
import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--faults", default="{}")
    p.add_argument("--at-step", type=int, default=1)
    p.add_argument("--fault-once", default=None)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    faults = json.loads(args.faults)
    stage = json.load(open(args.deepspeed_config))["zero_optimization"]["stage"]
    fault = faults.get(str(stage))
    # --fault-once: every rank decides from the marker as it was when they started; the marker
    # is made only after all of them have decided (a barrier), so no rank misses the fault.
    if fault and args.fault_once and os.path.exists(args.fault_once):
        fault = None
    if fault == "slow_start":
        time.sleep(5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    rank, mb, gas = dist.get_rank(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    if fault and args.fault_once:
        dist.barrier()
        if rank == 0:
            open(args.fault_once, "w").close()
    for step in range(1, 100_000):
        for _ in range(gas):
            loss = engine(torch.randn(mb, 64)).pow(2).mean()
            engine.backward(loss)
            engine.step()
        if fault == "error_words":
            print(f"step {step}: error=0.0, no errors; ERROR budget fine", flush=True)
            print("warning: this line has the word error in it", file=sys.stderr, flush=True)
        if step != args.at_step:
            continue
        if fault == "exit1":
            sys.exit(1)
        if fault == "segv" and rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "hang":
            time.sleep(3600)
        if fault == "ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            # Say so in the trial folder, so that a test waits on this file rather than a clock.
            probe = os.environ.get("ZEROTUNE_PROBE")
            if probe:
                open(os.path.join(os.path.dirname(probe), f"ignoring_term.rank{rank}"), "w").close()
            time.sleep(3600)
        if fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if fault == "rank_dies" and rank == 1:
            os._exit(7)
        if fault == "killed" and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "daemon" and rank == 0:
            start_daemon()


def start_daemon() -> None:
    """The classic double fork: the daemon is in a session of its own, its parent gone."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "900"])
        os._exit(0)
    os.wait()


if __name__ == "__main__":
    main()
