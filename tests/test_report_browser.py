"""The report as a browser shows it: headless Chromium (Debian's chromium) loads report.html and
decodes every figure. Also writes docs/report.png, the README's screenshot, when asked."""

import os
import re
import shutil
import subprocess

import pytest

from fakes import FakeLauncher, FakeMachine
from zerotune import Autotuner
from zerotune.report._html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make setup installs it)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def report(tmp_path, make_config, gpu_node, script):
    cfg = make_config({"fast": False, "tuner_early_stopping": 3})
    Autotuner(
        [str(script), "--deepspeed_config", str(cfg)],
        num_gpus=2,
        memory_per_device="5GiB",
        launcher=FakeLauncher(FakeMachine()),
        node=gpu_node,
        results_dir=tmp_path / "results",
    ).tune()
    return write_report(tmp_path / "results")


def test_chromium_renders_every_figure(tmp_path, make_config, gpu_node, script):
    page = report(tmp_path, make_config, gpu_node, script)
    # A copy with a probe script: once loaded, the title lists each image's decoded width.
    probe = tmp_path / "probe.html"
    probe.write_text(
        page.read_text().replace(
            "</body>",
            "<script>window.onload=()=>{document.title='widths:'+[...document.images].map("
            "i=>i.id+'='+i.naturalWidth).join(',')}</script></body>",
        )
    )
    out = subprocess.run(
        [CHROMIUM, *FLAGS, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    title = re.search(r"<title>(.*?)</title>", out.stdout)
    assert title, out.stderr[-2000:]
    widths = dict(kv.split("=") for kv in title.group(1).removeprefix("widths:").split(","))
    assert set(widths) == {"throughput", "memory", "timeline"}
    assert all(int(w) > 300 for w in widths.values())  # each PNG decoded, not a broken image
    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, *FLAGS, "--window-size=1000,1400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.stat().st_size > 20_000  # a page with figures, not a blank one
    if os.environ.get("ZEROTUNE_WRITE_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZEROTUNE_WRITE_SCREENSHOT"])
