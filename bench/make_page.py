"""Makes docs/benchmarks.md and the README's benchmark table from the committed records of
benchmark runs (bench/records/<bench>/*.json, written by each bench script): the median and
range of each figure over the runs, and the machine they ran on. Never typed by hand.

    python bench/make_page.py           # write both
    python bench/make_page.py --check   # exit 1 where either is not what the records make
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
README_START, README_END = "<!-- bench:start (made by bench/make_page.py) -->", "<!-- bench:end -->"

BENCHES = {
    "vs_deepspeed": (
        "`bench/vs_deepspeed.py` (`make bench`)",
        "DeepSpeed's own autotuner and `zerotune tune` over the same space (all stages, fast mode, "
        "micro-batch 2-32, global batch 64) on the bundled 12.7M GPT, 2 processes; both choices then "
        "re-measured side by side in alternating order (median of 4)",
        [
            "time_ratio",
            "throughput_ratio",
            "zerotune_seconds",
            "deepspeed_seconds",
            "zerotune_trials",
            "deepspeed_trials",
        ],
    ),
    "faults": (
        "`bench/faults.py`",
        "a tuning survives each injected fault (a crash, a segfault, a hang, a CUDA OOM, a rank killed from outside, "
        "a daemon, a taken port, a full disk, SIGKILL and Ctrl-C of the tuner), then hostile input against the CLI",
        ["injected", "survived", "lost_results", "orphans", "hostile_tried", "hostile_tracebacks", "hostile_escaped"],
    ),
    "warm_vs_cold": (
        "`bench/warm_vs_cold.py`",
        "the same configs in warm and in fresh processes (throughput and peak memory side by side), the choice "
        "made both ways, and a soak of warm trials; `--device cuda` on a GPU",
        ["overhead_ratio", "agree", "configs", "time_ratio", "soak_clean", "rss_growth_mb"],
    ),
    "memory_accuracy": (
        "`bench/memory_accuracy.py`",
        "the memory model's predictions against measured peaks, and DeepSpeed's own estimate",
        ["median_err", "max_err", "deepspeed_median_err", "under_bound", "configs"],
    ),
    "search_efficiency": (
        "`bench/search_efficiency.py`",
        "trials each knob searcher spends to come within 3% of the best, over seeds",
        ["model_based", "random", "grid", "oracle"],
    ),
    "lightning_overhead": (
        "`bench/lightning_overhead.py`",
        "the Lightning strategy against Lightning's own DeepSpeed strategy, and the tuned config's speed-up",
        ["overhead_ratio", "tuned_speedup"],
    ),
    "engines": (
        "`bench/engines.py`",
        "DeepSpeed ZeRO against PyTorch FSDP2 on the bundled 12.7M GPT through the Accelerate example, 2 processes: "
        "`zerotune tune --engines deepspeed,fsdp`, then each engine's best re-measured side by side in alternating "
        "order (median of 4); the first steps' loss gap the tuning read",
        ["fsdp_over_deepspeed", "deepspeed", "fsdp", "loss_gap", "tuning_seconds", "trials"],
    ),
    "cluster_sim": (
        "`bench/cluster_sim.py`",
        "simulation: zerotune's real search, scheduler and confirmation on a simulated cluster of 8 to 1,024 H100s "
        "(a 7B job on 1 node, a 70B job on 4 nodes per trial), beside DeepSpeed's autotuner's scheduling rule",
        ["worst_ratio_at_64_plus", "worst_gap_zerotune_at_64_plus", "worst_gap_deepspeed_at_64_plus"],
    ),
}
"""Per bench: how it runs, what it compares, the figures shown (its records hold more)."""


def records(bench: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((RECORDS / bench).glob("*.json"))]


def summary(values: list[Any]) -> str:
    """The median and range of a figure over runs, or its one value."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return "-"

    def fmt(v: float) -> str:  # counts whole; a figure to three significant digits or so
        if all(isinstance(n, int) for n in numbers):
            return f"{v:g}"
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"

    median = statistics.median(numbers)
    if len(numbers) == 1 or min(numbers) == max(numbers):
        return fmt(median)
    return f"{fmt(median)} ({fmt(min(numbers))}-{fmt(max(numbers))})"


def machines(runs: list[dict[str, Any]]) -> str:
    seen = dict.fromkeys(
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB" + (f", {m['gpu']}" if m.get("gpu") else "")
        for m in (r["machine"] for r in runs)
    )
    return "; ".join(seen)


def figures_cell(bench: str, runs: list[dict[str, Any]], shown: list[str]) -> str:
    if not runs:
        return f"no committed run yet: `DS_ACCELERATOR=cpu .venv/bin/python bench/{bench}.py`"
    return "<br>".join(f"{name} {summary([r['figures'].get(name) for r in runs])}" for name in shown)


def page() -> str:
    lines = [
        "# Benchmarks",
        "",
        "Speed and memory targets live here, never in timed tests. Every benchmark measures what it",
        "compares side by side in one run, because these machines are noisy; each run is committed as",
        "a record in `bench/records/`, and this page gives the median of each figure over the runs,",
        "with their range. A run's seconds vary with the hour: compare ratios, not seconds.",
        "",
        "| benchmark | what it compares | runs | figures: median (range) | machine |",
        "|---|---|---|---|---|",
    ]
    for bench, (how, what, shown) in BENCHES.items():
        runs = records(bench)
        lines.append(f"| {how} | {what} | {len(runs)} | {figures_cell(bench, runs, shown)} | {machines(runs) or '-'} |")
    lines += simulation_table()
    lines += [
        "",
        "`bench/gpu_check.sh` checks the GPU paths on a real GPU (CUDA memory statistics, a real CUDA",
        "out-of-memory error, warm against cold trials, the memory budget, nothing left behind) and",
        "prints what it found.",
    ]
    return "\n".join(lines) + "\n"


def readme_table() -> str:
    runs = records("vs_deepspeed")
    if not runs:
        return "No committed run of `bench/vs_deepspeed.py` yet."
    f = lambda name: summary([r["figures"].get(name) for r in runs])  # noqa: E731
    same = sum(bool(r["figures"].get("same_config")) for r in runs)
    return "\n".join(
        [
            f"DeepSpeed's autotuner and zerotune on the bundled 12.7M GPT, 2 processes on {machines(runs)};",
            f"median (range) over {len(runs)} committed run(s) of `make bench` ([all benchmarks](docs/benchmarks.md)):",
            "",
            "| tuner | trials | tuning time | re-measured throughput |",
            "|---|---|---|---|",
            f"| DeepSpeed's autotuner | {f('deepspeed_trials')} | {f('deepspeed_seconds')} s "
            f"| {f('deepspeed_throughput')} samples/s |",
            f"| zerotune | {f('zerotune_trials')} | {f('zerotune_seconds')} s ({f('time_ratio')} of it) "
            f"| {f('zerotune_throughput')} samples/s ({f('throughput_ratio')} of it) |",
            "",
            f"Both chose the same configuration in {same} of {len(runs)} run(s).",
            *simulation_table(),
        ]
    )


def simulation_table() -> list[str]:
    """The latest cluster_sim record's rows (a simulation with fixed seeds: its runs differ only
    where the code does)."""
    runs = records("cluster_sim")
    if not runs:
        return []
    run = runs[-1]
    lines = [
        "",
        f"Simulated clusters (`bench/cluster_sim.py`, {run['settings']['seeds']} draws per row; makespan, "
        "GPU-hours and trials: medians; gap: the chosen configuration's to the best of the simulated space, "
        "the worst draw):",
        "",
        "| job | GPUs | trials at once | zerotune: makespan, GPU-hours, trials, gap "
        "| DeepSpeed's rule: makespan, GPU-hours, trials, gap | makespan ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in run["figures"]["rows"]:
        cells = [
            f"{r[f'{who}_makespan_h'] * 60:.0f} min, {r[f'{who}_gpu_hours']:.0f}, {r[f'{who}_trials']:g}, "
            f"{r[f'{who}_gap']:.1%}"
            for who in ("zerotune", "deepspeed")
        ]
        lines.append(
            f"| {r['job']} | {r['gpus']} | {r['slots']} | {cells[0]} | {cells[1]} | {r['makespan_ratio']:.2f} |"
        )
    return lines


def readme(text: str) -> str:
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    return text[:start] + "\n" + readme_table() + "\n" + text[end:]


def main() -> int:
    want = {PAGE: page(), README: readme(README.read_text())}
    if "--check" in sys.argv:
        stale = [str(p.relative_to(ROOT)) for p, text in want.items() if p.read_text() != text]
        if stale:
            print(f"not made from bench/records: {', '.join(stale)}; run python bench/make_page.py")
        return 1 if stale else 0
    for path, text in want.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
