"""The benchmarks page and the README's benchmark table are made from the committed records of
benchmark runs (bench/make_page.py), never typed: what is committed is what the records make."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import make_page  # noqa: E402


def test_the_committed_page_and_table_are_what_the_records_make():
    assert make_page.PAGE.read_text() == make_page.page(), "run python bench/make_page.py"
    assert make_page.README.read_text() == make_page.readme(make_page.README.read_text())


def test_every_record_names_its_machine_version_and_figures():
    for path in make_page.RECORDS.glob("*/*.json"):
        record = json.loads(path.read_text())
        assert record["bench"] == path.parent.name and record["bench"] in make_page.BENCHES, path
        assert {"cpu", "cores", "memory_gib"} <= set(record["machine"]) and record["zerotune"], path
        assert record["figures"] and all(isinstance(k, str) for k in record["figures"]), path


def test_a_figure_is_summarised_by_its_median_and_range():
    assert make_page.summary([0.22, 0.51, 0.16]) == "0.22 (0.16-0.51)"
    assert make_page.summary([5, 5]) == "5"
    assert make_page.summary([9, 7, 8]) == "8 (7-9)"
    assert make_page.summary([1.0]) == "1.00" and make_page.summary([210.1, 180.4]) == "195 (180-210)"
    assert make_page.summary([55.38]) == "55.4"
    assert make_page.summary([None, "skipped"]) == "-"
