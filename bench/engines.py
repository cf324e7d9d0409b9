"""DeepSpeed ZeRO against PyTorch FSDP2 on the bundled GPT, through the Accelerate example (CPU).

zerotune tunes the example across both engines (``--engines deepspeed,fsdp``); then the best
configuration of each engine is measured again, independently, in alternating order (A B, B A,
...), each a fresh trial in processes of its own, and the median of each is reported with their
ratio. The loss agreement is the tuning's: the first steps' losses of a DeepSpeed and an FSDP2
trial of the same micro-batch, each relative to its first step (see zerotune.tuning's engine
comparison). The tuning's cost is its wall time and trials.

    DS_ACCELERATOR=cpu python bench/engines.py [--model small] [--reps 4]

Last line: engines: fsdp_over_deepspeed=<ratio> deepspeed=<samples/s> fsdp=<samples/s> loss_gap=<g> tuning_seconds=<s> trials=<n>
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
BIN = Path(sys.executable).parent
LOSS = "the first "


def command(work: Path, args) -> list[str]:
    """``accelerate launch`` of the example, with its Accelerate config pointing at its ds_config."""
    import yaml

    acc = yaml.safe_load((ROOT / "examples" / "accelerate_deepspeed.yaml").read_text())
    acc["deepspeed_config"]["deepspeed_config_file"] = str(ROOT / "examples" / "ds_config_accelerate.json")
    acc["num_processes"] = args.num_gpus
    (work / "acc.yaml").write_text(yaml.safe_dump(acc))
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(work / "acc.yaml"),
        str(ROOT / "examples" / "accelerate_train.py"),
        "--model",
        args.model,
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
        "--max_train_steps",
        "100000",
    ]


def tune(work: Path, cmd: list[str], env: dict) -> tuple[float, dict, str]:
    res = work / "tuning"
    argv = [str(BIN / "zerotune"), "tune", "--engines", "deepspeed,fsdp", "--fsdp-wrap", "Block", "--quiet",
            "--results-dir", str(res), *cmd]  # fmt: skip
    start = time.monotonic()
    with open(work / "tuning.log", "w") as log:
        code = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"the tuning failed (status {code}); see {work / 'tuning.log'}")
    return time.monotonic() - start, json.loads((res / "results.json").read_text()), (res / "summary.txt").read_text()


def best_per_engine(results: dict) -> dict[str, dict]:
    ok = [t for t in results["trials"] if t["state"] == "ok"]
    out = {}
    for engine in ("deepspeed", "fsdp"):
        mine = [t for t in ok if t["spec"].get("engine", "deepspeed") == engine]
        if not mine:
            sys.exit(f"no {engine} trial succeeded; see the tuning's summary")
        out[engine] = max(mine, key=lambda t: t["throughput"])
    return out


def measure(spec: dict, cmd: list[str], work: Path, name: str) -> float:
    """A fresh trial of ``spec`` alone (zerotune's own measurement, cold processes): samples/s."""
    from zerotune import Autotuner
    from zerotune.search import OwnConfigSearch
    from zerotune.trials import TrialSpec
    from zerotune.tuning import SearchSettings

    tuner = Autotuner(
        cmd,
        results_dir=work / "remeasure" / name,
        overwrite=True,
        search=SearchSettings(
            searcher=OwnConfigSearch(TrialSpec.from_dict(spec)), engines="deepspeed,fsdp", fsdp_wrap="Block"
        ),  # fmt: skip
        warm_trials=False,
        precision=0.02,
        max_measure_seconds=20.0,
    )
    result = tuner.tune()
    return result.best.metric("throughput")


def loss_gap(summary: str) -> str:
    """The tuning's loss comparison: the largest gap it read, or why there is none."""
    text = " ".join(summary.split())
    for part in text.split("note: ")[1:]:
        if part.startswith("engines:") and "losses" in part:
            if "at most " in part:
                return part.split("at most ", 1)[1].split(" ", 1)[0]
    return "not compared"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=["tiny", "small", "medium"])
    p.add_argument("--num-gpus", type=int, default=2)
    p.add_argument("--reps", type=int, default=4)
    args = p.parse_args()
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    os.environ.update(env)
    work = Path(tempfile.mkdtemp(prefix="zerotune-engines-"))
    os.chdir(work)
    cmd = command(work, args)
    seconds, results, summary = tune(work, cmd, env)
    trials = sum(1 for t in results["trials"] if t["state"] != "pruned")
    best = best_per_engine(results)
    print(f"tuned in {seconds:.0f} s, {trials} trials; best DeepSpeed {best['deepspeed']['name']}, "
          f"best FSDP2 {best['fsdp']['name']}, chosen {results['best']}", flush=True)  # fmt: skip
    figures: dict[str, list[float]] = {"deepspeed": [], "fsdp": []}
    for rep in range(args.reps):
        order = ["deepspeed", "fsdp"] if rep % 2 == 0 else ["fsdp", "deepspeed"]
        for engine in order:
            value = measure(best[engine]["spec"], cmd, work, f"{engine}{rep}")
            figures[engine].append(value)
            print(f"  round {rep + 1}: {engine} {best[engine]['name']} {value:.1f} samples/s", flush=True)
    ds, fs = statistics.median(figures["deepspeed"]), statistics.median(figures["fsdp"])
    gap = loss_gap(summary)
    try:
        gap = float(gap)  # a number where the tuning compared the losses
    except ValueError:
        pass
    out = {
        "fsdp_over_deepspeed": round(fs / ds, 3),
        "deepspeed": round(ds, 1),
        "fsdp": round(fs, 1),
        "deepspeed_config": best["deepspeed"]["name"],
        "fsdp_config": best["fsdp"]["name"],
        "chosen": results["best"],
        "loss_gap": gap,
        "tuning_seconds": round(seconds, 1),
        "trials": trials,
    }
    save("engines", out, {"model": args.model, "num_gpus": args.num_gpus, "reps": args.reps})
    print(
        f"engines: fsdp_over_deepspeed={fs / ds:.2f} deepspeed={ds:.1f} fsdp={fs:.1f} loss_gap={gap} "
        f"tuning_seconds={seconds:.0f} trials={trials}"
    )


if __name__ == "__main__":
    main()
