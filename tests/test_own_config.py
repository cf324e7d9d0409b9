"""The config users already have: measured first as their own, compared with the choice (its
speed-up with an interval, the payback), searched around when it trains as it stands, and read
with DeepSpeed's meanings when it has an autotuning section."""

import json

from fakes import FakeLauncher, FakeMachine
from hostile import SCRIPT, run_cli
from zerotune import Autotuner, load_results
from zerotune.trials import TrialSpec, TrialState

PROD = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
    "bf16": {"enabled": False},
}
"""A production config: int stage and micro-batch, the global batch, no autotuning section."""


def tune(tmp_path, gpu_node, config, machine=None, **kw):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    launcher = FakeLauncher(machine or FakeMachine())
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(path)],
        num_gpus=2,
        memory_per_device="16GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
        **kw,
    )
    return tuner, tuner.tune()


def test_a_production_config_is_tuned_around_with_no_edit(tmp_path):
    # As a user runs it: `zerotune tune --num-gpus 2 train.py --deepspeed_config prod.json`.
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "prod.json").write_text(json.dumps(PROD))
    out = run_cli(
        ["tune", "--num-gpus", "2", "train.py", "--deepspeed_config", "prod.json"],
        tmp_path,
        tmp_path / "autotuning_results",
    )
    assert out.code == 0 and not out.traceback, out.err[-2000:]
    result = load_results(tmp_path / "autotuning_results")
    assert result.trials[0].name == "z2_mb4_gas8" and result.own.name == "z2_mb4_gas8"
    assert {t.spec.stage for t in result.trials} >= {0, 1, 2}  # the stage searched around it
    summary = (tmp_path / "autotuning_results" / "summary.txt").read_text()
    own = "\n".join(result.own.lines())
    assert "your config: z2_mb4_gas8" in summary and own.split("\n")[1] in summary
    assert result.own.speedup is not None and result.own.low < result.own.speedup < result.own.high
    assert result.own.payback_steps is not None and "payback: after" in summary
    best = json.loads((tmp_path / "autotuning_results" / "ds_config_optimal.json").read_text())
    # Only what was searched changed: the global batch, clipping, optimizer and precision stay.
    assert {k: best[k] for k in ("train_batch_size", "gradient_clipping", "optimizer", "bf16")} == {
        k: PROD[k] for k in ("train_batch_size", "gradient_clipping", "optimizer", "bf16")
    }
    assert best["zero_optimization"]["overlap_comm"] is True


def test_search_keeps_what_it_does_not_name(tmp_path, gpu_node):
    tuner, result = tune(tmp_path, gpu_node, PROD, search="micro-batch")
    assert {t.spec.stage for t in result.trials} == {2} and {t.spec.micro_batch for t in result.trials} > {4}
    assert result.best_config["zero_optimization"]["stage"] == 2


def test_a_deepspeed_int_micro_batch_is_where_the_search_starts_upwards(tmp_path, gpu_node):
    # DeepSpeed's autotuner runs the user's micro-batch first, then tunes upwards from it.
    config = {**PROD, "autotuning": {"enabled": True}}
    tuner, result = tune(tmp_path, gpu_node, config)
    ran = [t for t in result.trials if t.state is not TrialState.PRUNED]
    assert ran[0].spec == TrialSpec(stage=2, micro_batch=4, grad_accum=8)
    assert {t.spec.stage for t in result.trials} == {2}  # an int stage restricts, as DeepSpeed's does
    assert min(t.spec.micro_batch for t in result.trials) == 4 and max(t.spec.micro_batch for t in ran) > 4


def test_a_users_config_that_runs_out_of_memory_leaves_the_search_going(tmp_path, gpu_node):
    machine = FakeMachine(static={0: 30 * 2**30, 1: 3000 * 2**20, 2: 30 * 2**30, 3: 2000 * 2**20})
    tuner, result = tune(tmp_path, gpu_node, PROD, machine=machine)
    mine = result.trials[0]
    assert mine.name == "z2_mb4_gas8" and mine.state is TrialState.OOM
    assert result.best is not None and result.best.spec.stage in (1, 3)
    assert any("your config (z2_mb4_gas8) ended oom" in n for n in result.notes)
    assert result.own.lines()[0].startswith("your config: z2_mb4_gas8 ended oom")


def test_a_users_config_that_crashes_leaves_the_search_going(tmp_path, gpu_node):
    tuner, result = tune(tmp_path, gpu_node, PROD, machine=FakeMachine(crash={"z2_mb4_gas8"}))
    assert result.trials[0].state is TrialState.CRASHED and result.best is not None
    assert any("your config (z2_mb4_gas8) ended crashed" in n for n in result.notes)


def test_a_users_config_within_noise_of_the_pick_is_measured_again_beside_it(tmp_path, gpu_node):
    # Stages 1 and 2 within noise: the user's stage-2 config joins the confirmation, and the
    # speed-up over it is read from the interleaved figures.
    machine = FakeMachine(speed={0: 0.5, 1: 1.01, 2: 1.0, 3: 0.4}, rel_ci=0.04)
    tuner, result = tune(
        tmp_path, gpu_node, {**PROD, "zero_optimization": {"stage": 2}}, machine=machine, search="stage"
    )
    confirms = [j for j in tuner.launcher.jobs if j.trial_dir.name.startswith("confirm")]
    assert any(j.spec.name == "z2_mb4_gas8" for j in confirms)
    assert result.own.remeasured and result.own.fastest
    assert "your config is already the fastest within noise" in result.own.lines()[-1]


def test_the_hf_trainers_auto_batch_is_resolved_from_its_options_as_the_users_config(tmp_path, gpu_node):
    script = tmp_path / "hf.py"
    script.write_text(
        "from transformers import HfArgumentParser, TrainingArguments, Trainer\n"
        "args = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    )
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 1},
    }
    (tmp_path / "ds.json").write_text(json.dumps(config))
    command = [str(script), "--deepspeed", str(tmp_path / "ds.json"), "--output_dir", "o",
               "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"]  # fmt: skip
    launcher = FakeLauncher()
    tuner = Autotuner(
        command, num_gpus=2, memory_per_device="16GiB", results_dir=tmp_path / "r", launcher=launcher, node=gpu_node
    )
    assert tuner.trials.own_spec == TrialSpec(stage=1, micro_batch=8, grad_accum=2)
    result = tuner.tune()
    assert launcher.jobs[0].spec == tuner.trials.own_spec and result.own.name == "z1_mb8_gas2"
