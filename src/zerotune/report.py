"""Outputs of a tuning: summary.txt, ds_config_optimal.json, cmd_optimal.txt; and the real run."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .ranking import fmt_metric
from .result import TuningResult
from .store import write_atomic, write_json
from .units import format_size

if TYPE_CHECKING:
    from .tuner import Autotuner


def _env_prefix(tuner: "Autotuner") -> list[str]:
    from .launch import trial_env

    env = trial_env(tuner.num_gpus, tuner.node.device)
    return [f"{k}={env[k]}" for k in ("DS_ACCELERATOR", "OMP_NUM_THREADS") if tuner.node.device == "cpu" and k in env]


def _runner_accepts(argv: list[str], script: str, args: list[str], device: str) -> bool:
    """Whether DeepSpeed's runner would hand ``args`` to the script untouched (its argparse
    takes abbreviations, so a script flag like --n can be read as its own --num_nodes)."""
    import logging
    import os

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # Importing DeepSpeed probes for an accelerator (and warns) unless told; tell it only for the
    # import, so that this process's environment is left as the caller had it.
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ.setdefault("DS_ACCELERATOR", device)
    try:
        from deepspeed.launcher.runner import parse_args
    except ImportError:
        return True
    finally:
        if saved is None:
            os.environ.pop("DS_ACCELERATOR", None)
    try:
        parsed = parse_args(argv)
    except SystemExit:
        return False
    return parsed.user_script == script and list(parsed.user_args) == list(args)


def shell_command(tuner: "Autotuner", args: list[str]) -> str:
    """A command to paste in a shell, on the topology the tuning measured (one node, or the
    hostfile's nodes with its launcher): DeepSpeed's runner when it passes the args through
    untouched, else torchrun. Every word is quoted for the shell."""
    script = tuner.command.script
    words = tuner.cluster.launch_words(script, args,
                                       lambda runner: _runner_accepts(runner, script, args, tuner.node.device))
    return tuner.cluster.shell_line(_env_prefix(tuner), words)


def write_optimal_config(config: dict[str, Any], path: Path) -> Path:
    write_json(path, config)
    return path


def summary_text(result: TuningResult) -> str:
    rows = result.summary_rows()
    head = ["stage", "trials", "ok", "oom", "failed", "pruned", "best " + result.metric, "best trial"]
    table = [[str(r["stage"]), str(r["trials"]), str(r["ok"]), str(r["oom"]), str(r["failed"]), str(r["pruned"]),
              r["best"], r["best_trial"]] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    lines.append("")
    if result.best is not None:
        b = result.best
        lines.append(f"best: {b.name}  {fmt_metric(result.metric, b)}  peak memory {format_size(b.max_peak)} "
                     f"per rank (budget {format_size(b.budget)})")
    else:
        lines.append("best: none (no trial succeeded)")
    lines.append(f"trials: {len(result.trials)} ({result.launched} run now), tuning time {result.wall_time:.0f} s")
    lines += [f"note: {n}" for n in result.notes]
    lines.append("")
    lines.append("trial".ljust(24) + "state".ljust(9) + "metric".ljust(30) + "steps".ljust(16) + "peak/rank".ljust(12)
                 + "why not chosen")
    for t in result.trials:
        lines.append(t.name.ljust(24) + t.state.value.ljust(9) + fmt_metric(result.metric, t).ljust(30)
                     + _steps(t).ljust(16) + format_size(t.max_peak).ljust(12) + result.why_lost(t))
    return "\n".join(lines) + "\n"


def _steps(t) -> str:
    m = t.measurement
    if m is None:
        return "-"
    flag = " stopped early" if m.early_stop else ("" if m.stable else " capped")
    return f"{m.steps_measured}{flag}"


def write_outputs(tuner: "Autotuner") -> None:
    result = tuner.result
    assert result is not None
    root = result.results_dir
    write_atomic(root / "summary.txt", summary_text(result))
    write_json(root / "results.json", {"metric": result.metric, "best": result.best.name if result.best else None,
                                       "trials": [t.to_dict() for t in result.trials], "notes": result.notes})
    if result.best_config is None:
        tuner.record.clear_outputs()  # an earlier tuning's choice must not stand beside "best: none"
        return
    optimal = write_optimal_config(result.best_config, root / "ds_config_optimal.json")
    if tuner.lightning is not None:
        from .lightning_job import write_cache

        write_atomic(root / "cmd_optimal.txt", lightning_command(tuner, optimal))
        write_cache(tuner.lightning, result)
        return
    args = tuner.command.trial_args(str(optimal.resolve()), tuner.mapped_args(result.best.spec))
    write_atomic(root / "cmd_optimal.txt", shell_command(tuner, args) + "\n")


def lightning_command(tuner: "Autotuner", optimal: Path) -> str:
    """A Lightning script reads the config from PL_DEEPSPEED_CONFIG_PATH and starts its own processes."""
    from .lightning_job import trainer_settings

    job, best = tuner.lightning, tuner.result.best_config
    words = ["python", tuner.command.script,
             *tuner.command.trial_args(None, tuner.mapped_args(tuner.result.best.spec))]
    line = " ".join(_env_prefix(tuner) + [f"PL_DEEPSPEED_CONFIG_PATH={shlex.quote(str(optimal.resolve()))}"]
                    + [shlex.quote(w) for w in words]) + "\n"
    if job.strategy == "AutotuneDeepSpeedStrategy":
        return line
    mb, gas = trainer_settings(best, job.world_size)
    return (f"# {job.strategy} takes the stage and ZeRO settings from this config, but not the batch: set "
            f"batch_size={mb} and Trainer(accumulate_grad_batches={gas}) in the script, or use "
            "strategy=\"deepspeed_autotune\" (zerotune.lightning), which sets both from the config.\n" + line)


def run_training(tuner: "Autotuner", config_path: Path, extra_env: dict[str, str] | None = None) -> int:
    """The user's real training with ``config_path``, started by the trials' launcher on the
    topology the tuning measured (every node of a hostfile), its output streamed here. Returns
    the exit status."""
    lightning = tuner.lightning is not None
    args = tuner.command.trial_args(None if lightning else str(config_path.resolve()),
                                    tuner.mapped_args(tuner.result.best.spec))
    spec_path = tuner.results_dir / "run_probe.json"
    write_json(spec_path, {"mode": "run", "script": tuner.command.script, "args": args,
                           "local_rank_arg": tuner.command.takes_local_rank(),
                           "lightning_config": str(config_path.resolve()) if lightning else None})
    code = tuner.launcher.run_program(spec_path, tuner.num_gpus, extra_env or {})
    sys.stdout.flush()
    return code
