"""The documentation site as a reader's browser shows it: MkDocs builds it (strict: a broken
link or a docstring the API reference cannot read fails), a local server serves it, and headless
Chromium (Debian's chromium) renders its pages, its generated references and its search."""

import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


SEEN: dict[str, threading.Event] = {}
"""Per waiting page: set once the page has shown what the test waits for."""


class Server(http.server.SimpleHTTPRequestHandler):
    """The built site, plus the two addresses a waiting page (see waiting_copy) uses: each
    ``/__tick?<id>`` answers after up to 0.2 s of real time, at once after ``/__done?<id>``.
    Headless Chromium's virtual time stands still while a request is pending and jumps ahead
    when the page is idle, so a page that ticks gives the search's web worker (which virtual
    time does not wait for) real time to answer, and its own timers virtual time to run."""

    def do_GET(self):
        kind, _, key = self.path.partition("?")
        if kind in ("/__tick", "/__done"):
            event = SEEN.setdefault(key, threading.Event())
            event.set() if kind == "/__done" else event.wait(0.2)
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def waiting_copy(out: Path, page: str, selector: str, pattern: str) -> str:
    """A copy of the built ``page`` that ticks (see Server) until its element ``selector``
    shows text matching the regex ``pattern``; its address on the site."""
    key = f"w{len(SEEN)}"
    script = (
        "<script>let seen=false;"
        f"new MutationObserver(()=>{{const e=document.querySelector('{selector}');"
        f"if(!seen&&e&&/{pattern}/.test(e.textContent)){{seen=true;fetch('/__done?{key}')}}}})"
        ".observe(document.body,{subtree:true,childList:true,characterData:true});"
        f"(function tick(){{if(!seen)fetch('/__tick?{key}').then(()=>setTimeout(tick,50))}})()</script></body>"
    )
    source = out / page
    SEEN[key] = threading.Event()
    copy = source.with_name(f"_{key}_{source.name}")
    copy.write_text(source.read_text().replace("</body>", script))
    return str(copy.relative_to(out))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    handler = functools.partial(Server, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def rendered(url: str, until: str = "<body") -> str:
    """The page's DOM once it holds ``until``: a search runs in a web worker that a loaded
    machine starts late, so the page is asked again, with more time each try."""
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (make test-setup installs it)")
    for budget in (10_000, 30_000, 90_000):
        with tempfile.TemporaryDirectory() as profile:  # a fresh browser: no cache, no stored state
            out = subprocess.run(
                [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget}", "--dump-dom", url],
                capture_output=True,
                text=True,
                timeout=300,
            )
        if re.search(until, out.stdout):
            return out.stdout
    raise AssertionError(f"{url} never showed {until!r}: {out.stdout[-1500:]} {out.stderr[-1500:]}")


def test_every_page_of_the_nav_is_built(site):
    out, _ = site
    import yaml

    def pages(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    for page in pages(nav):
        html = out / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert html.exists(), page


def test_the_cli_reference_is_made_from_the_parsers(site):
    from zerotune.cli import COMMANDS

    _, url = site
    page = rendered(f"{url}/reference/cli/")
    for name in COMMANDS:
        assert f"usage: zerotune {name}" in page
    assert "--tie-margin" in page and "--max-measure-seconds" in page


def test_the_autotuning_reference_lists_every_key_with_its_default(site):
    from zerotune.request import AutotuningConfig

    _, url = site
    page = rendered(f"{url}/reference/autotuning/")
    for name in AutotuningConfig.model_fields:
        assert f"<code>{name}</code>" in page
    assert '<code>"autotuning_results"</code>' in page


def test_the_api_reference_renders_the_public_classes(site):
    _, url = site
    page = rendered(f"{url}/reference/python-api/")
    for name in ("Autotuner", "ClusterSettings", "MeasureSettings", "SearchSettings", "load_results", "Target"):
        assert re.search(rf'id="zerotune\.[\w.]*{name}"', page), name
    text = re.sub(r"<[^>]+>", "", page)
    # The docstrings' Args: sections are read as parameter tables, not left as raw text.
    assert "tie_margin" in text and "Parameters:" in text and "Args:" not in text


def test_search_finds_the_pages_that_explain_a_term(site):
    out, url = site
    probe = waiting_copy(out, "index.html", ".md-search-result__meta", r"\d+ matching document")
    page = rendered(f"{url}/{probe}?q=warm+trials", until=r'md-search-result__meta">\d+ matching document')
    found = re.search(r'md-search-result__meta">(\d+) matching document', page)
    assert found and int(found.group(1)) >= 2, page[-2000:]
    assert page.count("md-search-result__item") >= 2
