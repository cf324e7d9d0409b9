"""The bundled example runs without zerotune as its docstring says: the plain `deepspeed`
command read from examples/gpt.py's docstring trains on CPU (2 processes, gloo), and the GPU
example config is one zerotune reads as a search space."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration


def docstring_command(script, starts: str) -> list[str]:
    text = (ROOT / "examples" / script).read_text().split('"""')[1].replace("\\\n", " ")
    (line,) = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(starts)]
    return shlex.split(line)


def test_the_plain_deepspeed_command_of_the_gpt_example_trains(tmp_path):
    argv = docstring_command("gpt.py", "deepspeed ")
    assert "ds_config_fixed.json" in " ".join(argv)
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
    }
    done = subprocess.run(
        [*argv, "--model", "tiny", "--steps", "3", "--log-every", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 3" in done.stdout + done.stderr, done.stdout[-2000:]


def test_the_gpu_example_config_is_a_search_space_zerotune_reads():
    from zerotune.request import parse_request

    config = json.loads((ROOT / "examples" / "ds_config_gpu.json").read_text())
    request = parse_request(config, world_size=8)
    assert request.stages == [1, 2, 3] and request.global_batch == 256
    assert config["bf16"]["enabled"] and config["zero_optimization"]["offload_optimizer"]["device"] == ["none", "cpu"]
