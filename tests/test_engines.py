"""FSDP2 as a second engine (fake launcher): its trials for Hugging Face Trainer and Accelerate
scripts, its search, the choice across engines only where they train the same numbers, and
its outputs."""

import json
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT
from fakes import FakeLauncher, FakeMachine
from test_hf_trainer import TRAINER_SCRIPT, hf_config
from zerotune import Autotuner
from zerotune._errors import ConfigError
from zerotune.launch import Node
from zerotune.request import numerics, parse_engines
from zerotune.trials import TrialSpec
from zerotune.units import GIB

yaml = pytest.importorskip("yaml")


@pytest.fixture
def trainer_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINER_SCRIPT)
    return script


def hf_command(script, config, *extra):
    return [
        str(script),
        "--deepspeed",
        str(config),
        "--output_dir",
        "out",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
        *extra,
    ]


def tune_hf(tmp_path, script, node, machine=None, config=None, engines="deepspeed,fsdp", extra=()):
    launcher = FakeLauncher(machine or FakeMachine())
    tuner = Autotuner(
        hf_command(script, config or hf_config(tmp_path), *extra),
        num_gpus=2,
        memory_per_device="8GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=node,
        engines=engines,
    )
    return tuner, tuner.tune(), launcher


def test_fsdp_specs_are_named_by_what_they_do_and_read_back():
    spec = TrialSpec(stage=3, micro_batch=4, grad_accum=2, engine="fsdp", overrides=(("fsdp.offload", True),))
    assert spec.name == "fsdp-reshard_mb4_gas2_off=on" and spec.setting == "FSDP2 reshard"
    assert TrialSpec(stage=2, micro_batch=4, engine="fsdp").name == "fsdp-keep_mb4_gas1"
    assert TrialSpec.from_dict(spec.to_dict()) == spec
    assert "engine" not in TrialSpec(stage=2, micro_batch=4).to_dict()  # DeepSpeed's stored specs stay as they were
    with pytest.raises(ValueError, match="stage"):
        TrialSpec.from_dict({"stage": 1, "micro_batch": 4, "engine": "fsdp"})
    with pytest.raises(ValueError, match="engine"):
        TrialSpec.from_dict({"stage": 1, "micro_batch": 4, "engine": "megatron"})


def test_engines_are_read_from_a_list_or_commas():
    assert parse_engines("deepspeed,fsdp") == ("deepspeed", "fsdp") == parse_engines(["deepspeed", "fsdp"])
    assert parse_engines(None) is None
    for bad in ("", "zero3", "deepspeed,fdsp"):
        with pytest.raises(ConfigError, match="--engines"):
            parse_engines(bad)


def test_a_trainer_script_is_tuned_across_both_engines_and_fsdp2_wins(tmp_path, trainer_script, gpu_node):
    tuner, result, launcher = tune_hf(tmp_path, trainer_script, gpu_node)
    fsdp_jobs = [j for j in launcher.jobs if j.spec.engine == "fsdp"]
    assert fsdp_jobs and any(j.spec.engine == "deepspeed" for j in launcher.jobs)
    for job in fsdp_jobs:
        args = job.script_args
        assert "--deepspeed" not in args and args[-3:-1] == ["--fsdp", "--fsdp_config"]
        config = json.loads(open(args[-1]).read())
        assert args[-1].endswith(f"{job.spec.name}/fsdp_config.json")
        assert config["version"] == 2 and config["reshard_after_forward"] == (job.spec.stage == 3)
        mb = int(args[args.index("--per_device_train_batch_size") + 1])
        assert (mb, job.spec.micro_batch * job.spec.grad_accum * 2) == (job.spec.micro_batch, 32)
        assert job.probe_fields["engine"] == "fsdp" and not job.warm  # Accelerate keeps a process's setup
    assert result.best.spec.engine == "fsdp" and result.best.spec.stage == 2  # the fake's fastest
    optimal = json.loads((tmp_path / "r" / "fsdp_config_optimal.json").read_text())
    assert optimal == {
        "version": 2,
        "reshard_after_forward": False,
        "cpu_offload": False,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    assert not (tmp_path / "r" / "ds_config_optimal.json").exists()
    words = shlex.split((tmp_path / "r" / "cmd_optimal.txt").read_text())
    assert words[0] == "torchrun" and words[-3:] == [
        "--fsdp",
        "--fsdp_config",
        str(tmp_path / "r" / "fsdp_config_optimal.json"),
    ]
    assert "--deepspeed" not in words and words[words.index("--per_device_train_batch_size") + 1] == str(
        result.best.spec.micro_batch
    )
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "FSDP2 keep" in summary and "ZeRO-1" in summary  # the table by engine and stage
    engines = [line for line in summary.splitlines() if line.startswith("engine ")]
    assert engines[0].startswith("engine DeepSpeed: best z") and "lost to fsdp-keep" in engines[0]
    assert engines[1].startswith("engine FSDP2: best fsdp-keep") and engines[1].endswith("chosen")
    assert all("master fp32, compute fp32, reduce fp32" in line for line in engines)
    assert "losses agree within 0.0001" in summary


def test_losses_that_disagree_leave_fsdp2_unranked_however_fast(tmp_path, trainer_script, gpu_node):
    machine = FakeMachine(fsdp_losses=[8.0, 7.99, 7.98, 7.97])  # trains other numbers than DeepSpeed
    tuner, result, _ = tune_hf(tmp_path, trainer_script, gpu_node, machine=machine)
    assert result.best.spec.engine == "deepspeed"
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "engines: FSDP2 not ranked: its first 4 steps' losses differ from DeepSpeed's beyond 0.0001" in summary
    line = next(x for x in summary.splitlines() if x.startswith("engine FSDP2"))
    assert "not ranked" in line


def test_a_dtype_mismatch_is_named_and_fsdp2_is_not_ranked(tmp_path, trainer_script, gpu_node):
    # DeepSpeed reduces gradients in fp32 here, FSDP2 under Accelerate in the compute dtype (bf16).
    config = hf_config(tmp_path, communication_data_type="fp32")
    tuner, result, launcher = tune_hf(tmp_path, trainer_script, gpu_node, config=config, extra=("--bf16",))
    assert all(j.spec.engine == "deepspeed" for j in launcher.jobs) and result.best.spec.engine == "deepspeed"
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert (
        "FSDP2 not measured: it would train other numbers (DeepSpeed trains master fp32, compute bf16, reduce "
        "fp32; FSDP2 trains master fp32, compute bf16, reduce bf16)" in summary
    )


def test_numerics_follow_each_engines_rules():
    assert numerics("deepspeed", {"bf16": {"enabled": True}}) == {"master": "fp32", "compute": "bf16", "reduce": "bf16"}
    assert numerics("deepspeed", {"fp16": {"enabled": True}, "communication_data_type": "fp32"})["reduce"] == "fp32"
    assert numerics("fsdp", {"mixed_precision": "bf16"}) == {"master": "fp32", "compute": "bf16", "reduce": "bf16"}
    assert numerics("fsdp", {"mixed_precision": "no"}) == numerics("deepspeed", {})


def test_fsdp2_alone_and_its_offload_where_nothing_else_fits(tmp_path, trainer_script, gpu_node):
    # Every configuration without offload runs out of memory: FSDP2 offloads all its states.
    machine = FakeMachine(static={s: 9 * GIB for s in range(4)})
    launcher = FakeLauncher(machine)
    tuner = Autotuner(
        hf_command(trainer_script, hf_config(tmp_path)),
        num_gpus=2,
        memory_per_device="8GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
        engines="fsdp",
    )
    result = tuner.tune()
    assert {j.spec.engine for j in launcher.jobs} == {"fsdp"}
    assert result.best.spec.overrides == (("fsdp.offload", True),) and result.best.spec.stage == 3
    assert json.loads((tmp_path / "r" / "fsdp_config_optimal.json").read_text())["cpu_offload"] is True


def test_a_cpu_command_carries_the_lift_that_lets_accelerate_run_fsdp2(tmp_path, trainer_script):
    cpu = Node("cpu", 0, 0, 64 * GIB)
    tune_hf(tmp_path, trainer_script, cpu)
    line = (tmp_path / "r" / "cmd_optimal.txt").read_text()
    site = tmp_path / "r" / "_accelerate_cpu"
    assert "ACCELERATE_USE_CPU=true" in line and f"PYTHONPATH={site}" in line
    assert "install_accelerate_cpu()" in (site / "sitecustomize.py").read_text()


def test_accelerate_trials_switch_to_fsdp2_through_the_config_and_the_probe(tmp_path, gpu_node, monkeypatch):
    from test_accelerate_job import SCRIPT

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": [1, 2]}}))
    acc = {
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "use_cpu": True,
        "deepspeed_config": {"deepspeed_config_file": "ds.json"},
        "num_machines": 1,
        "num_processes": 2,
    }
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    launcher = FakeLauncher()
    cmd = ["accelerate", "launch", "--config_file", "acc.yaml", "train.py", "--per_device_train_batch_size", "8"]
    tuner = Autotuner(cmd, memory_per_device="8GiB", results_dir=tmp_path / "r", launcher=launcher, node=gpu_node,
                      engines=["deepspeed", "fsdp"], fsdp_wrap="Block")  # fmt: skip
    result = tuner.tune()
    job = next(j for j in launcher.jobs if j.spec.engine == "fsdp")
    launch = yaml.safe_load((tmp_path / "r" / "_accelerate" / "launch-fsdp.yaml").read_text())
    assert launch["distributed_type"] == "FSDP" and "use_cpu" not in launch and "deepspeed_config" not in launch
    assert launch["fsdp_config"]["fsdp_version"] == 2 and launch["mixed_precision"] == "bf16"
    env = job.probe_fields["env"]
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(job.spec.stage == 3).lower()
    assert result.best.spec.engine == "fsdp"
    optimal = yaml.safe_load((tmp_path / "r" / "accelerate_config_optimal.yaml").read_text())
    assert optimal["distributed_type"] == "FSDP" and optimal["fsdp_config"]["fsdp_reshard_after_forward"] is False
    assert "accelerate_config_optimal.yaml" in (tmp_path / "r" / "cmd_optimal.txt").read_text()


def test_a_program_that_picks_its_engine_in_code_refuses_fsdp_with_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import deepspeed\n")
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    out = subprocess.run(
        [sys.executable, "-m", "zerotune.cli", "tune", "--engines", "fsdp", "--results-dir", str(tmp_path / "r"),
         str(script), "--deepspeed_config", str(cfg)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "chooses its engine in its own code" in out.stderr and "--engines deepspeed" in out.stderr


def test_the_lightning_strategy_names_why_it_tunes_deepspeed_only():
    pytest.importorskip("lightning")
    from zerotune.lightning import AutotuneDeepSpeedStrategy

    with pytest.raises(ConfigError, match="configure_model"):
        AutotuneDeepSpeedStrategy(engines="deepspeed,fsdp")
    assert AutotuneDeepSpeedStrategy(engines=["deepspeed"]).tuning is not None


def test_fsdp2_memory_counts_its_shards_and_the_unsharded_units():
    from zerotune.models import MemorySetup, estimate

    p, dp = 7_000_000_000, 8
    common = dict(num_params=p, largest_layer=p // 32, dp=dp, precision="bf16", engine="fsdp")
    keep = estimate(MemorySetup(stage=2, **common), 1)
    reshard = estimate(MemorySetup(stage=3, **common), 1)
    offload = estimate(MemorySetup(stage=3, offload_optimizer="cpu", offload_param="cpu", **common), 1)
    # fp32 shards of parameters, gradients and Adam's two moments: 16 bytes a parameter over the ranks.
    assert reshard.device["optimizer"] == 8 * p / dp and reshard.device["params"] == 2 * 2 * p / 32 + 4 * p / dp
    assert keep.device["params"] == 2 * p + 4 * p / dp  # every unit gathered in bf16 between the passes
    assert offload.host_total == 16 * p / dp and offload.device_total < reshard.device_total < keep.device_total
    out = subprocess.run(
        [sys.executable, "-m", "zerotune.cli", "estimate", "--params", "7B", "--num-gpus", "8", "--device-memory",
         "80GiB", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert {r["setting"] for r in rows} >= {"ZeRO-3", "FSDP2 keep", "FSDP2 reshard"}


def test_a_trainer_command_configured_for_fsdp_is_tuned_with_fsdp2_and_deepspeed_on_request(
    tmp_path, trainer_script, gpu_node
):
    own = tmp_path / "fsdp.json"
    own.write_text(
        json.dumps({"version": 2, "reshard_after_forward": True, "transformer_layer_cls_to_wrap": ["GPT2Block"]})
    )
    cmd = [str(trainer_script), "--fsdp", "full_shard auto_wrap", "--fsdp_config", str(own), "--output_dir", "out",
           "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", "--bf16"]  # fmt: skip
    launcher = FakeLauncher()
    tuner = Autotuner(cmd, num_gpus=2, memory_per_device="8GiB", results_dir=tmp_path / "r", launcher=launcher,
                      node=gpu_node)  # fmt: skip
    tuner.tune()
    assert launcher.jobs and {j.spec.engine for j in launcher.jobs} == {"fsdp"}  # the engine it is configured for
    args = launcher.jobs[0].script_args
    assert str(own) not in args and "full_shard auto_wrap" not in args and args.count("--fsdp") == 1
    config = json.loads(open(args[-1]).read())
    assert config["transformer_layer_cls_to_wrap"] == ["GPT2Block"] and config["mixed_precision"] == "bf16"

    launcher = FakeLauncher()
    Autotuner(cmd, num_gpus=2, memory_per_device="8GiB", results_dir=tmp_path / "both", launcher=launcher,
              node=gpu_node, engines="deepspeed,fsdp").tune()  # fmt: skip
    ds = [j for j in launcher.jobs if j.spec.engine == "deepspeed"]
    assert ds and {j.spec.stage for j in ds} <= {1, 2, 3}
    for job in ds:
        assert "--fsdp" not in job.script_args and "--fsdp_config" not in job.script_args
        assert job.script_args[-2] == "--deepspeed" and job.config["train_micro_batch_size_per_gpu"] == "auto"


def test_an_accelerate_config_for_fsdp2_is_tuned_and_keeps_the_users_fsdp_keys(tmp_path, gpu_node, monkeypatch):
    from test_accelerate_job import SCRIPT

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    acc = {
        "distributed_type": "FSDP",
        "mixed_precision": "no",
        "fsdp_config": {"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT",
                        "fsdp_activation_checkpointing": True, "fsdp_transformer_layer_cls_to_wrap": "Block"},
        "num_machines": 1,
        "num_processes": 2,
    }  # fmt: skip
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    cmd = ["accelerate", "launch", "--config_file", "acc.yaml", "train.py", "--per_device_train_batch_size", "8"]
    launcher = FakeLauncher()
    tuner = Autotuner(cmd, memory_per_device="8GiB", results_dir=tmp_path / "r", launcher=launcher, node=gpu_node,
                      engines="fsdp,deepspeed")  # fmt: skip
    tuner.tune()
    fsdp_yaml = yaml.safe_load((tmp_path / "r" / "_accelerate" / "launch-fsdp.yaml").read_text())["fsdp_config"]
    assert fsdp_yaml["fsdp_state_dict_type"] == "FULL_STATE_DICT" and fsdp_yaml["fsdp_activation_checkpointing"]
    assert fsdp_yaml["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    ds_yaml = yaml.safe_load((tmp_path / "r" / "_accelerate" / "launch.yaml").read_text())
    assert ds_yaml["distributed_type"] == "DEEPSPEED" and "fsdp_config" not in ds_yaml
    assert {j.spec.engine for j in launcher.jobs} == {"deepspeed", "fsdp"}

    acc["fsdp_config"]["fsdp_version"] = 1
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    with pytest.raises(ConfigError, match="fsdp_version: 2"):
        Autotuner(cmd, results_dir=tmp_path / "r1", launcher=FakeLauncher(), node=gpu_node)


def test_fsdp2_units_by_parameter_count(tmp_path, trainer_script, gpu_node):
    from zerotune.request import parse_wrap

    assert parse_wrap("10M") == ((), 10_000_000) and parse_wrap("Block,Attn") == (("Block", "Attn"), None)
    with pytest.raises(ConfigError, match="neither a class name nor a parameter count"):
        parse_wrap("12-layers")
    launcher = FakeLauncher()
    Autotuner(hf_command(trainer_script, hf_config(tmp_path)), num_gpus=2, memory_per_device="8GiB",
              results_dir=tmp_path / "r", launcher=launcher, node=gpu_node, engines="fsdp", fsdp_wrap="1e7").tune()  # fmt: skip
    config = json.loads(open(launcher.jobs[0].script_args[-1]).read())
    assert config["auto_wrap_policy"] == "SIZE_BASED_WRAP" and config["min_num_params"] == 10_000_000
    optimal = json.loads((tmp_path / "r" / "fsdp_config_optimal.json").read_text())
    assert optimal["min_num_params"] == 10_000_000


def test_a_script_that_shards_itself_is_out_of_scope_with_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from torch.distributed.fsdp import fully_shard\nfully_shard(model)\n")
    out = subprocess.run(
        [sys.executable, "-m", "zerotune.cli", "tune", "--results-dir", str(tmp_path / "r"), str(script)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "applies fully_shard itself" in out.stderr and not (tmp_path / "r").exists()
