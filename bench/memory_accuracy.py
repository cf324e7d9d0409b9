"""Memory-model accuracy on the bundled GPT (CPU, 2 processes): measured peak per rank against
zerotune's prediction and DeepSpeed's own estimate, for stages 0-3 x micro-batches, plus offload.

Every configuration runs as a real trial (zerotune's launcher and probe; on CPU the peak is the
rank's peak RSS). For each stage / offload variant, zerotune's model is calibrated only from the
first two trials in the order zerotune's search runs them (the geometric middle of the range, then
the jump to the largest), and every other micro-batch is held out and predicted. It also counts
how many held-out peaks lie under the prediction plus its uncertainty margin, the limit the search
keeps under the budget. ``--reuse`` recomputes from the trials an earlier run left. DeepSpeed's
estimate for the same configuration: ``estimate_zero2/3_model_states_mem_needs`` for stages 2-3
(with offload, device plus the host share of one rank, since on CPU both are the same memory), and
its autotuner's model-state formula for stages 0-1; neither counts activations or the runtime.

    python bench/memory_accuracy.py [--model small] [--micro-batches 2,4,6,8,16,32]

Last line: memory_accuracy: median_err=<pct> max_err=<pct> deepspeed_median_err=<pct> n=<count>
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
VARIANTS = [
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (3, "none", "none"),
    (2, "cpu", "none"),
    (3, "cpu", "cpu"),
]


def ds_config(stage: int, mb: int, off_opt: str, off_param: str) -> dict:
    zero: dict = {"stage": stage}
    if off_opt != "none":
        zero["offload_optimizer"] = {"device": off_opt}
    if off_param != "none":
        zero["offload_param"] = {"device": off_param}
    return {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "zero_optimization": zero,
    }


def run_trial(cfg: dict, name: str, out: Path, args):
    from zerotune.launch import LocalLauncher, TrialJob
    from zerotune.trials._settings import MeasureSettings
    from zerotune.trials._trial import TrialSpec, TrialState

    d = out / name
    spec = TrialSpec(stage=cfg["zero_optimization"]["stage"], micro_batch=cfg["train_micro_batch_size_per_gpu"])
    if args.reuse and (d / "rank1.json").exists():  # measured by an earlier run: recompute the figures only
        from zerotune.launch._collect import collect

        result = collect(
            spec=spec,
            trial_dir=d,
            world=2,
            returncode=0,
            timed_out=False,
            timeout=600,
            wall_time=0,
            budget=None,
            min_steps=3,
            rel_ci=0.5,
        )
        if result.state is TrialState.OK:
            return result
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "ds_config.json").write_text(json.dumps(cfg))
    job = TrialJob(
        spec=spec,
        trial_dir=d,
        script=str(ROOT / "examples" / "gpt.py"),
        script_args=["--model", args.model, "--deepspeed_config", str(d / "ds_config.json")],
        local_rank_arg=True,
        num_gpus=2,
        budget=None,
        warmup_steps=2,
        min_steps=3,
        measure=MeasureSettings(max_measure_seconds=3.0, precision=0.5),
    )
    result = LocalLauncher(device="cpu").run(job)
    if result.state is not TrialState.OK:
        sys.exit(f"{name} failed: {result.state.value} {result.reason} (see {d})")
    return result


def deepspeed_estimate(stage: int, off_opt: str, off_param: str, num_params: int, largest: int, dp: int) -> float:
    """DeepSpeed's figure for one rank (see the module docstring)."""
    import logging

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    if stage >= 2:
        if stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as est

            cpu, gpu = est(num_params, dp, 1, cpu_offload=off_opt != "none")
        else:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as est

            cpu, gpu, _ = est(
                num_params,
                largest,
                dp,
                1,
                cpu_offload=off_opt != "none",
                cpu_offload_params=off_param != "none",
                zero_init=True,
            )
        return gpu + (cpu / dp if off_opt != "none" else 0)
    # DeepSpeed's autotuner, fp32: params 4, gradients 4, Adam 8 bytes; stage 1 partitions the optimizer.
    return (4 + 4 + (8 / dp if stage == 1 else 8)) * num_params


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=["tiny", "small", "medium"])
    p.add_argument("--micro-batches", default="2,4,6,8,16,32")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory_accuracy"))
    p.add_argument("--reuse", action="store_true", help="reuse trials an earlier run left in --out")
    args = p.parse_args()
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from zerotune.models._memory import MemoryModel
    from zerotune.models._memory_terms import MemorySetup

    mbs = sorted(int(m) for m in args.micro_batches.split(","))
    if len(mbs) < 3:
        sys.exit("give at least 3 micro-batches: 2 calibrate, the rest are held out")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, ours, theirs, covered = [], [], [], []
    print(f"model {args.model}, 2 CPU processes, micro-batches {mbs}; trials in {out}", flush=True)
    print(f"{'config':28} {'measured':>10} {'zerotune':>10} {'err':>7} {'deepspeed':>10} {'err':>7}", flush=True)
    for stage, off_opt, off_param in VARIANTS:

        def setup_for(s, n, stage=stage, off_opt=off_opt, off_param=off_param):
            return MemorySetup(
                num_params=n,
                dp=2,
                stage=s,
                offload_optimizer=off_opt,
                offload_param=off_param,
                reduce_bucket_size=5e8,
                allgather_bucket_size=5e8,
                prefetch_bucket_size=5e7,
            )

        model = MemoryModel(dp=2, mixed_precision=False, setup_for=setup_for)
        middle = mbs[len(mbs) // 2]
        order = [middle, mbs[-1]] + [m for m in mbs if m not in (middle, mbs[-1])]
        for i, mb in enumerate(order):
            name = (
                f"z{stage}_mb{mb}"
                + ("_oo=cpu" if off_opt != "none" else "")
                + ("_op=cpu" if off_param != "none" else "")
            )
            result = run_trial(ds_config(stage, mb, off_opt, off_param), name, out, args)
            measured = result.max_peak
            if i < 2:  # calibration
                model.observe(result)
                print(f"{name:28} {measured / 2**20:9.0f}M {'(calibration)':>18}", flush=True)
                continue
            fit = model.fit(stage)
            predicted = fit.predict(mb)
            covered.append(measured <= fit.upper(mb))
            ds = deepspeed_estimate(stage, off_opt, off_param, result.num_params, result.num_params // 10, 2)
            err, ds_err = abs(predicted - measured) / measured, abs(ds - measured) / measured
            ours.append(err)
            theirs.append(ds_err)
            rows.append({"config": name, "measured": measured, "predicted": predicted, "deepspeed": ds})
            print(
                f"{name:28} {measured / 2**20:9.0f}M {predicted / 2**20:9.0f}M {err:6.1%} {ds / 2**20:9.0f}M "
                f"{ds_err:6.1%}",
                flush=True,
            )
    (out / "memory_accuracy.json").write_text(json.dumps(rows, indent=2))
    print(f"held-out peaks under the prediction's upper bound (the search's limit): {sum(covered)}/{len(covered)}")
    print(
        f"memory_accuracy: median_err={statistics.median(ours) * 100:.1f}% max_err={max(ours) * 100:.1f}% "
        f"deepspeed_median_err={statistics.median(theirs) * 100:.1f}% n={len(ours)}"
    )
    save(
        "memory_accuracy",
        {
            "median_err": round(statistics.median(ours), 4),
            "max_err": round(max(ours), 4),
            "deepspeed_median_err": round(statistics.median(theirs), 4),
            "under_bound": sum(covered),
            "configs": len(ours),
        },
        {},
    )


if __name__ == "__main__":
    main()
