"""Warm trials against cold ones, side by side in one run, on the bundled example (CPU).

1. overhead and agreement: each configuration (stages 0-3) measured cold (processes of its
   own) and warm (processes one launch serves), interleaved config by config (cold first in
   even rounds, warm first in odd ones, --reps rounds); per-trial
   overhead (wall time outside the timed steps) and whether the two measurements agree within
   their 95% intervals.
2. choice: ``zerotune tune`` on the bundled example with --cold-trials and without; the same
   choice, or where they differ, both choices measured again cold, interleaved (A B A B A B),
   and whether they are within noise of each other; and the tuning times.
3. soak: N warm trials across stages 0-3 in random order in one launch: every teardown clean
   (no engine left alive, no retirement), thread and fd counts constant after the first trial
   of each kind, and the RSS after teardown back at its level after the first of each kind.

    DS_ACCELERATOR=cpu python bench/warm_vs_cold.py [--model small] [--soak 30] [--skip-choice | --only-choice]
    python bench/warm_vs_cold.py --device cuda --num-gpus 1 --skip-choice     # on a GPU node

On a GPU the soak also reads the device memory held by tensors after each teardown
(``torch.cuda.memory_allocated``) and its growth after the first trial of each kind.

Last line: warm_vs_cold: overhead_ratio=<warm/cold> agree=<k>/<n> same_choice=<yes|within noise|no (...)|skipped>
time_ratio=<warm/cold tuning> soak_clean=<k>/<n> rss_growth_mb=<after all kinds seen>
[device_growth_mb=<the same of device memory, on a GPU>]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _record import save  # bench/_record.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "src"))

from zerotune.launch import LocalLauncher, TrialJob  # noqa: E402
from zerotune.trials._settings import MeasureSettings  # noqa: E402
from zerotune.trials._trial import TrialResult, TrialSpec, TrialState  # noqa: E402


def job(out: Path, name: str, stage: int, args, *, warm: bool, max_seconds: float, precision: float) -> TrialJob:
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
    }
    (d / "ds_config.json").write_text(json.dumps(cfg))
    return TrialJob(
        spec=TrialSpec(stage=stage, micro_batch=4),
        trial_dir=d,
        script=str(ROOT / "examples" / "gpt.py"),
        script_args=["--model", args.model, "--deepspeed_config", str(d / "ds_config.json")],
        local_rank_arg=True,
        num_gpus=args.num_gpus,
        budget=None,
        warmup_steps=2,
        min_steps=3,
        config=cfg,
        warm=warm,
        measure=MeasureSettings(max_measure_seconds=max_seconds, precision=precision),
    )


def overhead(r: TrialResult) -> float:
    return r.wall_time - (r.measurement.timed_seconds if r.measurement else 0.0)


def check(r: TrialResult) -> TrialResult:
    if r.state is not TrialState.OK:
        sys.exit(f"{r.name} ({r.start}) failed: {r.state.value} {r.reason}")
    return r


def side_by_side(out: Path, args) -> tuple[float, int, int]:
    warm_launcher, cold_launcher = LocalLauncher(device=args.device), LocalLauncher(device=args.device)
    cold_over, warm_over, agree, n, speed = [], [], 0, 0, []
    try:
        for rep in range(args.reps):
            for stage in args.stages:
                # Cold first in even rounds, warm first in odd ones: a machine that drifts (a lent
                # GPU node's host ran 20% slower a minute later) does not always favour one.
                runs = {}
                for warm in (False, True) if rep % 2 == 0 else (True, False):
                    launcher, kind = (warm_launcher, "warm") if warm else (cold_launcher, "cold")
                    runs[kind] = check(
                        launcher.run(
                            job(
                                out / "pairs",
                                f"{kind}_z{stage}_{rep}",
                                stage,
                                args,
                                warm=warm,
                                max_seconds=10,
                                precision=0.03,
                            )
                        )
                    )
                c, w = runs["cold"], runs["warm"]
                cold_over.append(overhead(c))
                if w.warm:  # the group's first trial paid the launch: not a warm trial's overhead
                    warm_over.append(overhead(w))
                ct, wt = c.measurement.throughput, w.measurement.throughput
                speed.append(wt / ct)
                ok = abs(ct - wt) <= c.measurement.throughput_ci95 + w.measurement.throughput_ci95
                agree, n = agree + ok, n + 1
                print(
                    f"  z{stage} rep {rep + 1}: cold {ct:.2f} ± {c.measurement.throughput_ci95:.2f} "
                    f"({overhead(c):.1f} s overhead), warm {wt:.2f} ± {w.measurement.throughput_ci95:.2f} "
                    f"({overhead(w):.1f} s overhead, {w.start}); agree: {'yes' if ok else 'NO'}; "
                    f"peak cold {(c.max_peak or 0) / 2**20:.0f} MiB, warm {(w.max_peak or 0) / 2**20:.0f} MiB",
                    flush=True,
                )
    finally:
        warm_launcher.close()
    ratio = statistics.median(warm_over) / statistics.median(cold_over)
    print(
        f"overhead per trial: cold median {statistics.median(cold_over):.1f} s, warm median "
        f"{statistics.median(warm_over):.1f} s; throughput warm/cold: median {statistics.median(speed):.2f} "
        f"(range {min(speed):.2f}-{max(speed):.2f})",
        flush=True,
    )
    return ratio, agree, n


def tune(out: Path, args, cold: bool) -> tuple[float, dict]:
    res = out / ("tune_cold" if cold else "tune_warm")
    cmd = [
        str(BIN / "zerotune"),
        "tune",
        "--num-gpus",
        str(args.num_gpus),
        "--results-dir",
        str(res),
        "--overwrite",
        "--quiet",
        *(["--cold-trials"] if cold else []),
        str(ROOT / "examples" / "gpt.py"),
        "--model",
        args.model,
        "--deepspeed_config",
        str(ROOT / "examples" / "ds_config.json"),
    ]
    start = time.monotonic()
    with open(out / f"{res.name}.log", "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"zerotune tune failed; see {out / res.name}.log")
    results = json.loads((res / "results.json").read_text())
    return time.monotonic() - start, results


def same_choice(out: Path, args) -> tuple[str, float]:
    cold_time, cold = tune(out, args, cold=True)
    warm_time, warm = tune(out, args, cold=False)
    c, w = cold["best"], warm["best"]
    print(f"choice: cold {c} in {cold_time:.0f} s, warm {w} in {warm_time:.0f} s", flush=True)
    verdict = "yes" if c == w else compare_choices(out, args, c, w)
    print(f"same choice: {verdict}", flush=True)
    return verdict, warm_time / cold_time


def compare_choices(out: Path, args, cold_best: str, warm_best: str, rounds: int = 3) -> str:
    """Two different choices, measured again side by side: cold, interleaved (A B A B A B), so
    that the machine's drift falls on both alike. "within noise" where the means of the rounds
    differ by less than their 95% intervals (t over the rounds) together."""
    launcher = LocalLauncher(device=args.device)
    runs: dict[str, list[float]] = {cold_best: [], warm_best: []}
    for r in range(rounds):
        for name in (cold_best, warm_best):
            cfg = json.loads((out / "tune_cold" / name / "ds_config.json").read_text())
            d = out / "compare" / f"{name}_{r}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "ds_config.json").write_text(json.dumps(cfg))
            spec = TrialSpec(
                stage=cfg["zero_optimization"]["stage"],
                micro_batch=cfg["train_micro_batch_size_per_gpu"],
                grad_accum=cfg["gradient_accumulation_steps"],
            )
            job = TrialJob(
                spec=spec,
                trial_dir=d,
                script=str(ROOT / "examples" / "gpt.py"),
                script_args=["--model", args.model, "--deepspeed_config", str(d / "ds_config.json")],
                local_rank_arg=True,
                num_gpus=args.num_gpus,
                budget=None,
                warmup_steps=2,
                min_steps=3,
                config=cfg,
                measure=MeasureSettings(max_measure_seconds=10, precision=0.03),
            )
            runs[name].append(check(launcher.run(job)).measurement.throughput)
            print(f"  round {r + 1}: {name} {runs[name][-1]:.2f} samples/s", flush=True)
    t95 = {2: 4.303, 3: 3.182, 4: 2.776}.get(rounds - 1, 2.0)
    mean = {n: statistics.mean(v) for n, v in runs.items()}
    half = {n: t95 * statistics.stdev(v) / len(v) ** 0.5 for n, v in runs.items()}
    for n in runs:
        print(f"  {n}: {mean[n]:.2f} ± {half[n]:.2f} samples/s over {rounds} interleaved cold runs", flush=True)
    if abs(mean[cold_best] - mean[warm_best]) <= half[cold_best] + half[warm_best]:
        return "within noise"
    faster = max(mean, key=mean.get)
    return f"no ({faster} faster by {abs(mean[cold_best] / mean[warm_best] - 1):.1%})"


def soak(out: Path, args) -> tuple[int, float, float | None]:
    launcher = LocalLauncher(device=args.device, warm_cap=args.soak + 1)
    rng = random.Random(0)
    stages = [s for s in (0, 1, 2, 3) for _ in range((args.soak + 3) // 4)][: args.soak]
    rng.shuffle(stages)
    clean, seen, counts, rss_base, growth, seq = 0, set(), None, {}, 0.0, 0
    dev_base: dict[int, int] = {}
    dev_growth: float | None = None  # stays None on CPU, where done files hold no device reading
    try:
        for i, stage in enumerate(stages):
            r = check(
                launcher.run(
                    job(out / "soak", f"t{i:02d}_z{stage}", stage, args, warm=True, max_seconds=1.0, precision=0.5)
                )
            )
            seq = 0 if not r.warm else seq + 1  # a cold start is a new group, its orders counted from 0
            pool = max((out / "soak" / "_warm").glob("slot0-*"), key=lambda p: int(p.name.split("-")[1]))
            done = [json.loads((pool / f"done{seq}.rank{k}.json").read_text()) for k in range(args.num_gpus)]
            clean += all(d["clean"] for d in done) and not r.retired
            now = (done[0]["threads"], done[0]["fds"])
            if stage in seen and now != counts:
                print(f"  trial {i} (z{stage}): threads, fds {now} differ from {counts}", flush=True)
            counts = now if stage not in seen or counts is None else counts
            seen.add(stage)
            rss_base.setdefault(stage, done[0]["rss"])
            dev = done[0].get("device_in_use")
            if dev is not None:
                dev_base.setdefault(stage, dev)
            if len(seen) == 4:
                growth = max(growth, (done[0]["rss"] - max(rss_base.values())) / 2**20)
                if dev is not None:
                    dev_growth = max(dev_growth or 0.0, (dev - max(dev_base.values())) / 2**20)
            peak = r.max_peak or 0
            print(
                f"  soak {i + 1}/{len(stages)} z{stage}: {r.start}; rss {done[0]['rss'] / 2**20:.0f} MiB, "
                + (f"device in use {dev / 2**20:.1f} MiB, " if dev is not None else "")
                + f"trial peak {peak / 2**20:.0f} MiB, threads {now[0]}, fds {now[1]}",
                flush=True,
            )
    finally:
        launcher.close()
    return clean, growth, dev_growth


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=["tiny", "small", "medium"])
    p.add_argument("--num-gpus", type=int, default=2)
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: trials on this node's GPUs (DS_ACCELERATOR left to DeepSpeed)",
    )
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--soak", type=int, default=30)
    p.add_argument(
        "--stages",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[0, 1, 2, 3],
        help="stages measured cold and warm side by side, in this order (default 0,1,2,3)",
    )
    p.add_argument("--skip-choice", action="store_true", help="skip the two full tunings")
    p.add_argument("--only-choice", action="store_true", help="only the two full tunings (part 2)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "warm_vs_cold"))
    args = p.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    elif os.environ.get("DS_ACCELERATOR") == "cpu":
        p.error("--device cuda with DS_ACCELERATOR=cpu: unset it")
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print(f"model={args.model} processes={args.num_gpus}", flush=True)
    if args.only_choice:
        verdict, time_ratio = same_choice(out, args)
        print(f"warm_vs_cold: same_choice={verdict} time_ratio={time_ratio:.2f}")
        return
    ratio, agree, n = side_by_side(out, args)
    verdict, time_ratio = ("skipped", float("nan")) if args.skip_choice else same_choice(out, args)
    clean, growth, dev_growth = soak(out, args)
    print(
        f"warm_vs_cold: overhead_ratio={ratio:.2f} agree={agree}/{n} same_choice={verdict} "
        f"time_ratio={time_ratio:.2f} soak_clean={clean}/{args.soak} rss_growth_mb={growth:.0f}"
        + (f" device_growth_mb={dev_growth:.1f}" if dev_growth is not None else "")
    )
    save(
        "warm_vs_cold",
        {
            "overhead_ratio": round(ratio, 3),
            "agree": agree,
            "configs": n,
            "same_choice": verdict,
            "time_ratio": None if time_ratio != time_ratio else round(time_ratio, 3),
            "soak_clean": clean,
            "rss_growth_mb": round(growth),
            "device_growth_mb": dev_growth,
        },
        {"model": args.model, "num_gpus": args.num_gpus, "device": args.device, "soak": args.soak},
    )


if __name__ == "__main__":
    main()
