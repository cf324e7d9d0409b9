"""A benchmark run as data: each bench script ends by saving its figures, with the version,
commit and machine they were measured on, as one JSON file under bench/records/<bench>/. The
benchmarks page and the README's table are made from those files (bench/make_page.py), never
typed."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records"


def machine() -> dict[str, Any]:
    """What the figures depend on of where they ran: CPU model and cores, memory, GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu = None
    try:
        gpu = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory / 2**30), "gpu": gpu}


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if done.returncode == 0 else None
    except OSError:
        return None


def save(bench: str, figures: dict[str, Any], settings: dict[str, Any]) -> Path:
    """Write one run's ``figures`` (numbers, or short strings) measured with ``settings`` (the
    bench's options) to bench/records/<bench>/<UTC time>.json; returns its path."""
    import zerotune

    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "bench": bench,
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "zerotune": zerotune.__version__,
        "commit": _commit(),
        "machine": machine(),
        "settings": settings,
        "figures": figures,
    }
    path = RECORDS / bench / f"{now.strftime('%Y%m%dT%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"record: {path.relative_to(ROOT)}", flush=True)
    return path
