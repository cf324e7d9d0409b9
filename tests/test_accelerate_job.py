"""Accelerate scripts (fake launcher): the `accelerate launch` command split, the Accelerate
config read and normalized, trials started by Accelerate's launcher, outputs in Accelerate's form."""

import json
import shlex

import pytest

yaml = pytest.importorskip("yaml")

from fakes import FakeLauncher  # noqa: E402
from zerotune import Autotuner  # noqa: E402
from zerotune._errors import ConfigError  # noqa: E402
from zerotune.launch._process import ranks_argv  # noqa: E402
from zerotune.targets._accelerate import AccelerateLaunch, AccelerateTarget, ds_config_of  # noqa: E402

SCRIPT = """import argparse
p = argparse.ArgumentParser()
p.add_argument("--per_device_train_batch_size", type=int, default=8)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "zero_optimization": {"stage": [1, 2]},
            }
        )
    )
    acc = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "no",
        "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": False},
        "num_machines": 1,
        "num_processes": 2,
        "machine_rank": 0,
    }
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    return tmp_path


def command(*extra):
    return [
        "accelerate",
        "launch",
        "--config_file",
        "acc.yaml",
        *extra,
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
    ]


def test_the_command_is_split_at_the_script():
    launch = AccelerateLaunch.split(command("--main_process_port", "1234", "--mixed_precision=no"))
    assert launch.script_command[0] == "train.py" and launch.option("--config_file") == "acc.yaml"
    assert launch.kept_options() == ["--mixed_precision=no"]  # config file and port are zerotune's to set
    with pytest.raises(ConfigError, match="no training script"):
        AccelerateLaunch.split(["accelerate", "launch", "--config_file", "acc.yaml"])
    with pytest.raises(ConfigError, match="-m"):
        AccelerateLaunch.split(["accelerate", "launch", "-m", "pkg.train"])


def test_tuned_through_accelerate_launch_and_written_in_its_form(project, gpu_node):
    launcher = FakeLauncher()
    tuner = Autotuner(command(), memory_per_device="6GiB", results_dir=project / "r", launcher=launcher, node=gpu_node)
    assert isinstance(tuner.target, AccelerateTarget) and tuner.num_gpus == 2  # num_processes of the config
    assert tuner.request.global_batch == 8 * 2 * 2
    result = tuner.tune()
    job = launcher.jobs[0]
    assert job.program_launcher.options[:2] == ("--config_file", str(project / "r" / "_accelerate" / "launch.yaml"))
    argv = ranks_argv(job.program_launcher, 2, 29500)
    assert argv[1:3] == ["-m", "accelerate.commands.launch"] and argv[-2:] == ["--module", "zerotune.probe"]
    launch_yaml = yaml.safe_load((project / "r" / "_accelerate" / "launch.yaml").read_text())
    assert "mixed_precision" not in launch_yaml  # Accelerate refuses it beside a deepspeed_config_file
    # The probe points Accelerate at the trial's own ds_config; the script gets its batch options.
    assert job.probe_fields["env"]["ACCELERATE_DEEPSPEED_CONFIG_FILE"].endswith(f"{job.spec.name}/ds_config.json")
    args = job.script_args
    assert "--deepspeed_config" not in args
    assert args[args.index("--per_device_train_batch_size") + 1] == str(job.spec.micro_batch)
    assert job.config["train_micro_batch_size_per_gpu"] == "auto"  # Accelerate fills it from the DataLoader

    root = project / "r"
    optimal_yaml = yaml.safe_load((root / "accelerate_config_optimal.yaml").read_text())
    assert optimal_yaml["deepspeed_config"]["deepspeed_config_file"] == str(root / "ds_config_optimal.json")
    assert optimal_yaml["num_processes"] == 2 and optimal_yaml["distributed_type"] == "DEEPSPEED"
    words = shlex.split((root / "cmd_optimal.txt").read_text())
    assert words[:4] == ["accelerate", "launch", "--config_file", str(root / "accelerate_config_optimal.yaml")]
    assert words[words.index("--per_device_train_batch_size") + 1] == str(result.best.spec.micro_batch)
    assert (
        json.loads((root / "ds_config_optimal.json").read_text())["zero_optimization"]["stage"]
        == result.best.spec.stage
    )


def test_inline_deepspeed_keys_become_a_ds_config(project):
    data = {
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "deepspeed_config": {
            "zero_stage": 3,
            "offload_optimizer_device": "cpu",
            "offload_param_device": "none",
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
        },
    }
    cfg = ds_config_of(project / "acc.yaml", data, AccelerateLaunch.split(command()))
    assert cfg["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert cfg["gradient_accumulation_steps"] == 4 and cfg["gradient_clipping"] == 1.0
    assert cfg["bf16"] == {"enabled": True} and cfg["train_micro_batch_size_per_gpu"] == "auto"


def deepspeed_yaml(processes, plugin):
    """An edit that writes a DeepSpeed Accelerate config with these values, as YAML gives them."""
    return lambda p: (p / "acc.yaml").write_text(
        f"distributed_type: DEEPSPEED\nnum_processes: {processes}\ndeepspeed_config: {plugin}\n"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda p: (p / "acc.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n"),
            "uses neither DeepSpeed nor FSDP",
        ),
        (lambda p: (p / "acc.yaml").write_text("a: [1\n"), "not valid YAML"),
        (lambda p: (p / "acc.yaml").write_text("- 1\n"), "must be a mapping"),
        (lambda p: (p / "ds.json").unlink(), "does not exist here"),
        (lambda p: (p / "acc.yaml").unlink(), "does not exist"),
        (lambda p: (p / "train.py").write_text("import argparse\n"), "arg_mappings"),
        (deepspeed_yaml("two", "{deepspeed_config_file: ds.json}"), "num_processes"),
        (deepspeed_yaml(2, "{zero_stage: 7}"), "not a ZeRO stage"),
        (deepspeed_yaml(2, "{zero_stage: 2, gradient_clipping: lots}"), "gradient_clipping"),
        (deepspeed_yaml("true", "{deepspeed_config_file: ds.json}"), "num_processes"),
        (deepspeed_yaml(999999999, "{deepspeed_config_file: ds.json}"), "num_processes"),
        (deepspeed_yaml(2, "{zero_stage: 2, gradient_clipping: .nan}"), "gradient_clipping"),
    ],
)
def test_bad_accelerate_input_is_one_clear_error(project, gpu_node, edit, message):
    edit(project)
    with pytest.raises(ConfigError, match=message):
        Autotuner(
            command(), memory_per_device="6GiB", results_dir=project / "r", launcher=FakeLauncher(), node=gpu_node
        )


def test_processes_must_agree(project, gpu_node):
    with pytest.raises(ConfigError, match="num_processes"):
        Autotuner(command(), num_gpus=4, results_dir=project / "r", launcher=FakeLauncher(), node=gpu_node)
    with pytest.raises(ConfigError, match="inline|config file|--zero_stage"):
        Autotuner(command("--zero_stage", "2"), results_dir=project / "r", launcher=FakeLauncher(), node=gpu_node)


def test_identity_follows_the_launch_config_not_the_ds_config_path(project, gpu_node):
    def identity():
        return Autotuner(
            command(), memory_per_device="6GiB", results_dir=project / "r", launcher=FakeLauncher(), node=gpu_node
        ).target.identity()

    first = identity()
    data = yaml.safe_load((project / "acc.yaml").read_text())
    (project / "moved.json").write_text((project / "ds.json").read_text())
    data["deepspeed_config"]["deepspeed_config_file"] = "moved.json"
    (project / "acc.yaml").write_text(yaml.safe_dump(data))
    assert identity() == first  # the ds_config's content is each trial's own identity, not its path
    data["deepspeed_config"]["zero3_init_flag"] = True
    (project / "acc.yaml").write_text(yaml.safe_dump(data))
    assert identity() != first


def test_an_inline_deepspeed_plugin_is_tuned_and_written_as_a_file(project, gpu_node):
    acc = {
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "num_processes": 2,
        "num_machines": 1,
        "deepspeed_config": {"zero_stage": 2, "gradient_accumulation_steps": 2, "zero3_init_flag": False},
    }
    (project / "acc.yaml").write_text(yaml.safe_dump(acc))
    launcher = FakeLauncher()
    Autotuner(command(), memory_per_device="6GiB", results_dir=project / "r", launcher=launcher, node=gpu_node).tune()
    # The plugin's config trains as it stands: measured first (its stage, the script's batch
    # options), then the stage and micro-batch searched around it.
    assert launcher.jobs[0].spec.name == "z2_mb8_gas2" and {0, 1, 2} <= {job.spec.stage for job in launcher.jobs}
    assert all(job.config["bf16"] == {"enabled": True} for job in launcher.jobs)
    launch = yaml.safe_load((project / "r" / "_accelerate" / "launch.yaml").read_text())
    assert launch["deepspeed_config"] == {
        "zero3_init_flag": False,
        "deepspeed_config_file": launch["deepspeed_config"]["deepspeed_config_file"],
    }
    assert "mixed_precision" not in launch  # Accelerate refuses both beside a ds_config file
    optimal = yaml.safe_load((project / "r" / "accelerate_config_optimal.yaml").read_text())
    assert optimal["deepspeed_config"]["deepspeed_config_file"].endswith("ds_config_optimal.json")


def test_the_accelerate_config_is_the_target_s_output_recorded_and_overwritten(project, gpu_node):
    from zerotune.results._folder import discard, read_record

    root = project / "r"
    Autotuner(command(), memory_per_device="6GiB", results_dir=root, launcher=FakeLauncher(), node=gpu_node).tune()
    assert read_record(root)["target_outputs"] == ["accelerate_config_optimal.yaml"]
    (root / "mine.yaml").write_text("the user's")
    discard(root, read_record(root))  # what --overwrite removes
    assert not (root / "accelerate_config_optimal.yaml").exists() and not (root / "ds_config_optimal.json").exists()
    assert (root / "mine.yaml").read_text() == "the user's"
