"""AutotuneDeepSpeedStrategy against Lightning's own DeepSpeedStrategy, side by side in one run (CPU).

1. overhead: the same config (stage 2, the script's batch) trained through zerotune's strategy with
   tuning off, and through Lightning's DeepSpeedStrategy with its CUDA-only check lifted the same
   way (the three CPU overrides, nothing else).
2. tuned speedup: zerotune's strategy after tuning on first fit (the bundled GPT, global batch
   kept at the script's batch x processes), against Lightning's default ``deepspeed_stage_2``
   settings at the same batch.

Each training run is its own process; runs alternate (A, B, C, D, A, B, ...) and each pair's ratio
is the median over the rounds. Throughput: samples per second over the micro-batches after warm-up.

    python bench/lightning_overhead.py [--model small] [--rounds 3] [--steps 40]

Last line: lightning: overhead_ratio=<ours/theirs> tuned_speedup=<tuned/stage2_default>
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP_BATCHES = 5
FIXED = {"zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 2},
         "train_micro_batch_size_per_gpu": 8}


def child(mode: str, args) -> None:
    """One training run; prints `RESULT {"throughput": ...}` on rank 0."""
    import lightning as L
    import torch
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    sys.path.insert(0, str(ROOT / "examples"))
    from lightning_gpt import GPTModule, TokenData

    from zerotune.lightning import AutotuneDeepSpeedStrategy

    class LiftedDeepSpeedStrategy(DeepSpeedStrategy):
        """Lightning's strategy with only its CUDA-only checks lifted, as zerotune's are."""

        @property
        def parallel_devices(self):
            return self._parallel_devices

        @parallel_devices.setter
        def parallel_devices(self, devices):
            if devices and all(d.type == "cpu" for d in devices):
                devices = [torch.device("cpu", i) for i in range(len(devices))]
            self._parallel_devices = devices

        def setup_environment(self):
            if isinstance(self.accelerator, CPUAccelerator):
                DDPStrategy.setup_environment(self)
                return
            super().setup_environment()

    class Throughput(L.Callback):
        def __init__(self):
            self.marks: list[tuple[float, int]] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.marks.append((time.perf_counter(), int(batch.shape[0]) * trainer.world_size))

    strategy = {
        "ours": lambda: AutotuneDeepSpeedStrategy(config=dict(FIXED), autotune=False),
        "theirs": lambda: LiftedDeepSpeedStrategy(config=dict(FIXED)),
        "tuned": lambda: AutotuneDeepSpeedStrategy(cache_dir=args.cache_dir),
        "stage2_default": lambda: LiftedDeepSpeedStrategy(stage=2),  # what strategy="deepspeed_stage_2" builds
    }[mode]()
    meter = Throughput()
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[meter])
    trainer.fit(GPTModule(args.model), TokenData(args.model, batch_size=8))
    if trainer.global_rank == 0:
        marks = meter.marks[WARMUP_BATCHES:]
        samples = sum(n for _, n in marks[1:])
        print("RESULT " + json.dumps({"mode": mode, "throughput": samples / (marks[-1][0] - marks[0][0]),
                                      "batches": len(marks)}), flush=True)


def run(mode: str, args, env, log: Path) -> float:
    cmd = [sys.executable, __file__, "--child", mode, "--model", args.model, "--steps", str(args.steps),
           "--cache-dir", args.cache_dir]
    with open(log, "a") as f:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=f, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{mode} failed (status {proc.returncode}); see {log}")
    return json.loads(lines[-1][len("RESULT "):])["throughput"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args)
        return
    work = Path(tempfile.mkdtemp(prefix="zerotune-lightning-bench-"))
    args.cache_dir = args.cache_dir or str(work / "cache")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("PL_DEEPSPEED_CONFIG_PATH", None)
    log = work / "bench.log"
    print(f"model {args.model}, 2 CPU processes, {args.rounds} rounds; logs in {log}", flush=True)
    start = time.monotonic()
    run("tuned", args, env, log)  # the first fit tunes and fills the cache; later ones train from it
    (entry,) = Path(args.cache_dir).glob("*/tuned.json")
    best = json.loads(entry.read_text())
    print(f"tuned on first fit in {time.monotonic() - start:.0f} s: {best['best']} "
          f"(batch_size={best['batch_size']}, accumulate_grad_batches={best['accumulate_grad_batches']})", flush=True)
    modes = ["ours", "theirs", "tuned", "stage2_default"]
    measured: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            measured[mode].append(run(mode, args, env, log))
        print(f"round {r + 1}: " + "  ".join(f"{m} {measured[m][-1]:.1f}" for m in modes) + " samples/s", flush=True)
    overhead = statistics.median(a / b for a, b in zip(measured["ours"], measured["theirs"]))
    speedup = statistics.median(a / b for a, b in zip(measured["tuned"], measured["stage2_default"]))
    print(f"lightning: overhead_ratio={overhead:.3f} tuned_speedup={speedup:.3f}")


if __name__ == "__main__":
    main()
