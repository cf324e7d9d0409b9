"""Whether DeepSpeed's runner hands a script's arguments through: the quick answer from its
option names agrees with its own parser wherever it answers."""

import pytest

from zerotune.launch._deepspeed_runner import _parsed_untouched, may_be_taken, runner_accepts, runner_options

ARGS = [
    ["--model", "small", "--deepspeed_config", "ds.json"],
    ["--n", "3"],
    ["--num", "2"],
    ["--nu=2"],
    ["--no"],
    ["-i", "x"],
    ["-ix"],
    ["-H=f"],
    ["-q"],
    ["--h"],
    ["--", "x"],
    ["-1", "-0.5"],
    ["--lr", "-3"],
    ["-", "x"],
    ["--quiet_mode"],
    ["--master"],
    ["--mast=1"],
    ["--local_rank=0"],
    ["--deepspeed"],
    ["--batch-size", "8"],
    ["-m", "gpt"],
    ["--log", "x"],
    ["x", "--help"],
]


def test_the_runners_options_are_read_without_importing_deepspeed():
    import sys

    runner_options.cache_clear()
    had = "deepspeed" in sys.modules
    options = runner_options()
    assert {"--num_gpus", "--num_nodes", "--hostfile", "-H", "-i", "--help"} <= options
    assert ("deepspeed" in sys.modules) == had


@pytest.mark.parametrize("args", ARGS, ids=lambda a: " ".join(a))
def test_the_quick_answer_agrees_with_deepspeeds_parser(args):
    argv = ["--num_gpus", "2", "train.py", *args]
    exact = _parsed_untouched(argv, "train.py", args, "cpu")
    if not any(may_be_taken(a, runner_options()) for a in args):
        assert exact, f"{args} was judged safe without a parse, but DeepSpeed's runner changes or refuses it"
    assert runner_accepts(argv, "train.py", args, "cpu") == exact


def test_flags_that_deepspeed_would_take_are_parsed():
    options = runner_options()
    assert may_be_taken("--n", options) and may_be_taken("-ifoo", options) and may_be_taken("--", options)
    assert not may_be_taken("--model", options) and not may_be_taken("small", options)
    assert not runner_accepts(["--num_gpus", "2", "t.py", "--n", "3"], "t.py", ["--n", "3"], "cpu")
