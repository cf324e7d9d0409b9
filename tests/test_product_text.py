"""Product text states the present: no run identifiers, commit hashes, "stop N" or stories of
past bugs in the README, the docs, the examples, docstrings or comments. The evidence for a rule
is a test or a figure on the benchmarks page; the history is git's and CHANGELOG.md's."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = {
    "a stop number": re.compile(r"\bstop \d+\b", re.I),
    "a run identifier": re.compile(r"\bruns? \d+[a-z](?:-\d+)?\b|\bruns? \d+-\d+\b", re.I),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "a story of a past bug": re.compile(r"\b(?:the bug we had|used to|no longer|was fixed|we fixed)\b", re.I),
}


def product_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for folder, pattern in (("docs", "*.md"), ("src", "*.py"), ("examples", "*")):
        files += sorted(p for p in (ROOT / folder).rglob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return files


def findings(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, pattern in PATTERNS.items() for m in pattern.finditer(text)]


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_text_states_the_present(path):
    found = [
        f"line {i}: {f}"
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for f in findings(line)
    ]
    assert not found, found


@pytest.mark.parametrize(
    "planted",
    ["as measured at stop 12", "see run 34c-1", "runs 40-3 and 41", "fixed in d0e40dc", "it used to hang"],
)
def test_each_history_pattern_is_found(planted):
    assert findings(f"A rule, {planted}, stated.")
