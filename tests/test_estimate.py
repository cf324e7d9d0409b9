"""`zerotune estimate`: model sizes from a count, a config.json or a factory; the table; bad input."""

import json

import pytest

from zerotune.cli import main
from zerotune.cli._estimate import from_factory, from_hf_config, parse_count


def run_json(capsys, *argv):
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_params_count_gives_a_row_per_stage_and_offload(capsys):
    out = run_json(capsys, "--params", "1.3B", "--num-gpus", "8", "--device-memory", "16GB")
    rows = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in out["rows"]}
    assert len(rows) == 8 and out["model"]["num_params"] == 1_300_000_000
    assert rows[(0, "none", "none")]["largest_micro_batch"] is None  # 20 bytes x 1.3B > 16 GB
    assert rows[(3, "none", "none")]["largest_micro_batch"] == "?"  # states fit; activations unknown
    dev = [rows[k]["device_bytes"] for k in [(0, "none", "none"), (1, "none", "none"), (2, "none", "none")]]
    assert dev == sorted(dev, reverse=True)  # each stage partitions more
    assert rows[(2, "cpu", "none")]["host_bytes_per_node"] > 0 == rows[(2, "none", "none")]["host_bytes_per_node"]


def test_hf_config_and_activations_give_micro_batches(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}))
    size = from_hf_config(cfg)
    assert 120e6 < size.num_params < 130e6  # GPT-2 small: 124M
    out = run_json(
        capsys, "--hf-config", str(cfg), "--num-gpus", "2", "--device-memory", "24GB", "--global-batch", "64"
    )
    fits = {(r["stage"], r["offload_optimizer"]): r["largest_micro_batch"] for r in out["rows"]}
    assert all(isinstance(v, int) and 32 % v == 0 for v in fits.values())  # divisors of 64 / 2


def test_factory_on_the_meta_device(tmp_path):
    (tmp_path / "mymodel.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 64))\n"
    )
    size = from_factory(f"{tmp_path / 'mymodel.py'}:build")
    assert size.num_params == 1000 * 64 + 64 * 64 + 64 and size.largest_layer == 64000


def test_table_prints(capsys):
    assert main(["estimate", "--params", "350M", "--num-gpus", "2", "--device-memory", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "optimizer+params" in out and "0.35B parameters, 2 devices" in out and "activations unknown" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--params", "-5"], "cannot read"),
        (["--params", "1.3Q"], "cannot read"),
        (["--params", "1e20"], "plausible"),
        (["--params", "1B", "--device-memory", "12XB"], "--device-memory"),
        (["--params", "1B", "--num-gpus", "0"], "--num-gpus"),
        (["--params", "1B", "--largest-layer", "2B"], "largest-layer"),
        (["--params", "1B", "--global-batch", "7"], "multiple"),
        (["--factory", "no_such_module_xyz:build"], "cannot be imported"),
        (["--factory", "nocolon"], "module:function"),
        (["--hf-config", "/nonexistent/config.json"], "does not exist"),
    ],
)
def test_bad_input_is_one_clear_error(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerotune: error:") and message in err and "Traceback" not in err


def test_parse_count():
    assert parse_count("1.3B", what="x") == 1_300_000_000 and parse_count("350m", what="x") == 350_000_000
    assert parse_count("7e9", what="x") == 7_000_000_000
