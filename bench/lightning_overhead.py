"""AutotuneDeepSpeedStrategy against Lightning's own DeepSpeedStrategy, side by side in one run (CPU).

1. overhead: the same config (stage 2, the script's batch) trained through zerotune's strategy with
   tuning off, and through Lightning's DeepSpeedStrategy with its CUDA-only check lifted the same
   way (the three CPU overrides, nothing else).
2. tuned speedup: zerotune's strategy after tuning on first fit (the bundled GPT, global batch
   kept at the script's batch x processes), against Lightning's default ``deepspeed_stage_2``
   settings at the same batch.

First a plain ``python`` run tunes on first fit and fills the cache. Then one pair of processes
(started by torchrun, so several fits can share them) trains A, B, C, D, D, C, B, A, ... with a
fresh Trainer each time: the machine's drift between processes minutes apart (up to 30% here)
does not enter the ratios. Throughput: samples per median step time after warm-up; each ratio is
the median over the rounds.

    python bench/lightning_overhead.py [--model small] [--rounds 5] [--steps 30]

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

from _record import save  # bench/_record.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
WARMUP_BATCHES = 5
MODES = ["ours", "theirs", "tuned", "stage2_default"]
FIXED = {"zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8}


def child(mode: str, args) -> None:
    """Mode "tune": one fit that tunes. "measure": every mode in turn, in these same two processes;
    rank 0 prints `RESULT {...}` per fit."""
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

    strategies = {
        "ours": lambda: AutotuneDeepSpeedStrategy(config=dict(FIXED), autotune=False),
        "theirs": lambda: LiftedDeepSpeedStrategy(config=dict(FIXED)),
        "tuned": lambda: AutotuneDeepSpeedStrategy(cache_dir=args.cache_dir),
        "stage2_default": lambda: LiftedDeepSpeedStrategy(stage=2),  # what strategy="deepspeed_stage_2" builds
    }

    def fit(mode: str) -> float | None:
        meter = Throughput()
        torch.manual_seed(0)
        strategy = strategies[mode]()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            max_steps=args.steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[meter],
        )
        trainer.fit(GPTModule(args.model), TokenData(args.model, batch_size=8))
        if trainer.global_rank != 0:
            return None
        if mode == "tuned" and strategy.tuned_config is None:
            sys.exit("the tuned run found no tuned config")
        marks = meter.marks[WARMUP_BATCHES:]
        step = statistics.median(b[0] - a[0] for a, b in zip(marks, marks[1:]))
        return marks[-1][1] / step

    if mode == "tune":
        fit("tuned")
        return
    for r in range(args.rounds):
        for m in MODES if r % 2 == 0 else MODES[::-1]:
            value = fit(m)
            if value is not None:
                print("RESULT " + json.dumps({"round": r, "mode": m, "throughput": value}), flush=True)


def run(argv: list[str], env, log: Path) -> list[str]:
    with open(log, "a") as f:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=f, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed (status {proc.returncode}); see {log}")
    return [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
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
    common = [
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--rounds",
        str(args.rounds),
        "--cache-dir",
        args.cache_dir,
    ]
    start = time.monotonic()
    run([sys.executable, __file__, "--child", "tune", *common], env, log)  # tunes on first fit, fills the cache
    (entry,) = Path(args.cache_dir).glob("*/tuned.json")
    best = json.loads(entry.read_text())
    print(
        f"tuned on first fit in {time.monotonic() - start:.0f} s: {best['best']} "
        f"(batch_size={best['batch_size']}, accumulate_grad_batches={best['accumulate_grad_batches']})",
        flush=True,
    )
    lines = run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", __file__, "--child", "measure", *common],
        env,
        log,
    )
    measured: dict[str, list[float]] = {m: [] for m in MODES}
    for line in lines:
        r = json.loads(line[len("RESULT ") :])
        measured[r["mode"]].append(r["throughput"])
    for r in range(args.rounds):
        print(f"round {r + 1}: " + "  ".join(f"{m} {measured[m][r]:.1f}" for m in MODES) + " samples/s")
    overhead = statistics.median(a / b for a, b in zip(measured["ours"], measured["theirs"]))
    speedup = statistics.median(a / b for a, b in zip(measured["tuned"], measured["stage2_default"]))
    print(f"lightning: overhead_ratio={overhead:.3f} tuned_speedup={speedup:.3f}")
    save(
        "lightning_overhead",
        {"overhead_ratio": round(overhead, 3), "tuned_speedup": round(speedup, 3)},
        {"model": args.model, "rounds": args.rounds},
    )


if __name__ == "__main__":
    main()
