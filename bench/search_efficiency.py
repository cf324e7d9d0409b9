"""Search efficiency: trials each searcher needs to come within 2% of the best configuration.

A tabular benchmark. The space is one stage's ZeRO knobs x micro-batches of the bundled GPT
(CPU, 2 processes, DeepSpeed's CPU accelerator): stage 2, reduce_bucket_size x overlap_comm x
contiguous_gradients x micro-batch = 36 configurations. Every one is measured once as a real trial
(zerotune's launcher and probe) and saved; the best of the sweep is the oracle. Then each searcher
(grid, random, model-based), with seeds 0-2, is replayed against the saved measurements: it asks,
the table answers. Counted: launched trials until one within 2% of the oracle's throughput.

Grid runs in DeepSpeed's order (the micro-batch varying fastest, each knob's values as listed);
random in a seeded shuffle; model-based is zerotune's: first the prior (largest micro-batch,
DeepSpeed's default knobs), then Optuna TPE. ``tpe_no_prior`` (TPE from random start-up points,
no prior) is printed too, to show what the prior contributes. The sweep is the costly part (about 10 minutes);
``--reuse`` replays an earlier sweep, and seeds are then free.

    python bench/search_efficiency.py [--model small] [--reuse]

Last line: search_efficiency: model_based=<trials> random=<trials> grid=<trials> oracle=<space size>
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from _record import save  # bench/_record.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
Z = "zero_optimization."
STAGE = 2
KNOBS = {
    Z + "reduce_bucket_size": (2e5, 2e6, 5e8),
    Z + "overlap_comm": (True, False),
    Z + "contiguous_gradients": (True, False),
}
MICRO_BATCHES = (4, 8, 16)
GLOBAL_BATCH = 64
DP = 2
WITHIN = 0.02
SEEDS = (0, 1, 2)


def space():
    from zerotune.request._space import MICRO_BATCH, Dimension, Space

    dims = tuple(Dimension(k, v) for k, v in KNOBS.items()) + (Dimension(MICRO_BATCH, MICRO_BATCHES),)
    return Space(stage=STAGE, dims=dims, global_batch=GLOBAL_BATCH, dp=DP)


def measure(spec, out: Path, args) -> dict:
    """One real trial of ``spec``; returns its row of the table."""
    from zerotune.launch import LocalLauncher, TrialJob
    from zerotune.request._space import trial_config
    from zerotune.trials._settings import MeasureSettings

    d = out / spec.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    base = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "zero_optimization": {"stage": STAGE}}
    (d / "ds_config.json").write_text(json.dumps(trial_config(base, spec, DP)))
    job = TrialJob(
        spec=spec,
        trial_dir=d,
        script=str(ROOT / "examples" / "gpt.py"),
        script_args=["--model", args.model, "--deepspeed_config", str(d / "ds_config.json")],
        local_rank_arg=True,
        num_gpus=DP,
        budget=None,
        warmup_steps=2,
        min_steps=3,
        measure=MeasureSettings(max_measure_seconds=args.max_seconds, precision=args.precision),
    )
    r = LocalLauncher(device="cpu").run(job)
    m = r.measurement
    return {
        "name": spec.name,
        "state": r.state.value,
        "reason": r.reason,
        "peak": r.max_peak,
        "samples_per_step": m.samples_per_step if m else None,
        "step_time_mean": m.step_time_mean if m else None,
        "step_time_ci95": m.step_time_ci95 if m else None,
    }


def replay(searcher, table: dict[str, dict], target: float) -> int | None:
    """Launched trials until one reaches ``target`` throughput (None: never)."""
    from zerotune.trials._trial import Measurement, TrialResult, TrialState

    launched = 0
    while (s := searcher.suggest()) is not None:
        row = table[s.spec.name]
        launched += 1
        if row["state"] == "ok":
            m = Measurement(
                samples_per_step=row["samples_per_step"],
                step_time_mean=row["step_time_mean"],
                step_time_std=0.0,
                step_time_ci95=row["step_time_ci95"],
                steps_measured=5,
                stable=True,
            )
            result = TrialResult(spec=s.spec, state=TrialState.OK, measurement=m, peak_memory=[row["peak"] or 0])
        else:
            result = TrialResult(spec=s.spec, state=TrialState(row["state"]), reason=row["reason"])
        searcher.observe(result)
        if result.state is TrialState.OK and m.throughput >= target:
            return launched
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=["tiny", "small", "medium"])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "search_efficiency"))
    p.add_argument("--reuse", action="store_true", help="replay the sweep an earlier run saved in --out")
    p.add_argument("--precision", type=float, default=0.05, help="relative 95%% interval each trial aims at")
    p.add_argument("--max-seconds", type=float, default=8.0, help="measuring time cap per trial")
    args = p.parse_args()
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from zerotune.search import SEARCHERS

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep_file = out / "sweep.json"
    table: dict[str, dict] = json.loads(sweep_file.read_text()) if args.reuse and sweep_file.exists() else {}
    points = list(space())
    print(f"space: stage {STAGE}, {len(points)} configurations; sweep in {out}", flush=True)
    for i, spec in enumerate(points, 1):
        if spec.name in table:
            continue
        table[spec.name] = measure(spec, out, args)
        row = table[spec.name]
        tput = row["samples_per_step"] / row["step_time_mean"] if row["state"] == "ok" else 0.0
        print(f"[{i:2}/{len(points)}] {spec.name:48} {row['state']:6} {tput:8.1f} samples/s", flush=True)
        sweep_file.write_text(json.dumps(table, indent=1))
    ok = {n: r["samples_per_step"] / r["step_time_mean"] for n, r in table.items() if r["state"] == "ok"}
    if not ok:
        sys.exit("no configuration ran; see the trial folders in " + str(out))
    oracle = max(ok, key=ok.get)
    target = (1 - WITHIN) * ok[oracle]
    within = sorted(n for n, v in ok.items() if v >= target)
    print(
        f"oracle: {oracle} {ok[oracle]:.1f} samples/s; {len(within)} of {len(points)} within {WITHIN:.0%}: "
        + ", ".join(within)
    )
    means = {}
    variants = {
        "model_based": ("model_based", {}),
        "tpe_no_prior": ("model_based", {"use_prior": False}),
        "random": ("random", {}),
        "gridsearch": ("gridsearch", {}),
    }
    for label, (kind, kw) in variants.items():
        counts = [
            replay(SEARCHERS[kind](space(), metric="throughput", seed=seed, **kw), table, target) for seed in SEEDS
        ]
        shown = [c if c is not None else len(points) for c in counts]
        means[label] = statistics.mean(shown)
        print(f"{label:12} trials to within {WITHIN:.0%} per seed {SEEDS}: {counts}  mean {means[label]:.1f}")
    print(
        f"search_efficiency: model_based={means['model_based']:.1f} random={means['random']:.1f} "
        f"grid={means['gridsearch']:.1f} oracle={len(points)}"
    )
    save(
        "search_efficiency",
        {
            "model_based": means["model_based"],
            "random": means["random"],
            "grid": means["gridsearch"],
            "oracle": len(points),
        },
        {"seeds": list(SEEDS)},
    )


if __name__ == "__main__":
    main()
