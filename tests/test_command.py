import pytest

from zerotune import ConfigError, LaunchError
from zerotune.targets._command import UserCommand


def cmd(script, *args):
    return UserCommand.parse([str(script), *args])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--deepspeed_config", "a.json", "--n", "3"], ["--deepspeed_config", "NEW", "--n", "3"]),
        (["--deepspeed_config=a.json"], ["--deepspeed_config=NEW"]),
        (["--deepspeed", "a.json", "--lr", "1"], ["--deepspeed", "NEW", "--lr", "1"]),
        (["--deepspeed", "--deepspeed_config", "a.json"], ["--deepspeed", "--deepspeed_config", "NEW"]),
    ],
)
def test_config_path_is_replaced_and_the_rest_untouched(script, args, expected):
    assert cmd(script, *args).trial_args("NEW") == expected


def test_arg_mappings_replace_or_append(script):
    c = cmd(script, "--deepspeed", "a.json", "--per_device_train_batch_size", "4")
    out = c.trial_args("NEW", {"--per_device_train_batch_size": "16", "--gradient_accumulation_steps": "2"})
    assert out == ["--deepspeed", "NEW", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2"]


def test_local_rank_detection(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("p.add_argument('--local_rank', type=int)\n")
    b = tmp_path / "b.py"
    b.write_text("import os\nprint(os.environ['RANK'])\n")
    assert UserCommand.parse([str(a)]).takes_local_rank()
    assert not UserCommand.parse([str(b)]).takes_local_rank()


def test_missing_script(tmp_path):
    with pytest.raises(LaunchError, match="does not exist"):
        UserCommand.parse([str(tmp_path / "nope.py")])


def test_not_python(tmp_path):
    p = tmp_path / "train.sh"
    p.write_text("")
    with pytest.raises(ConfigError, match="not a .py file"):
        UserCommand.parse([str(p)])
