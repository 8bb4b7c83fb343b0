"""Browser tier of the documentation site: the site `make docs` built into site/ (``make test`` builds it first).

* the home page renders in headless Chromium, opened from the file system, with no console errors;
* the search box finds "RoPERelay" and "PyramidKV" (Material's search, its index built locally, run through the
  ``?q=`` query the search box fills in; from file:// through the vendored Web Worker shim);
* every internal link and anchor of every page resolves (an offline link checker over site/);
* nothing is loaded from the network: no ``src``/stylesheet/preload reference and no CSS ``url()`` is remote
  (plain outbound ``<a href>`` links in prose are allowed).

Without a built site the tests are skipped locally and fail under ``CI=true`` (``make test`` always builds it).
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from support.browser import chromium, console_errors, not_blank, run_chromium  # tests/ helpers

pytestmark = pytest.mark.browser

SITE = Path(__file__).resolve().parents[2] / "site"
REMOTE = re.compile(r"^(?:https?:)?//", re.I)


@pytest.fixture(scope="module")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        reason = "site/ is not built: run `make docs` (make test builds it before the tests)"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true requires the built site; {reason}", pytrace=False)
        pytest.skip(reason)
    return SITE


class Links(HTMLParser):
    """Every link-like attribute of a page, and every id it defines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for attribute in ("href", "src"):
            if attrs.get(attribute) is not None:
                kind = f"{tag}[rel={attrs.get('rel', '')}]" if tag == "link" else tag
                self.refs.append((kind, attribute, attrs[attribute]))


def parse(page: Path) -> Links:
    parser = Links()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return parser


def broken_links(root: Path) -> list[str]:
    pages = {p: parse(p) for p in root.rglob("*.html")}
    problems = []
    for page, links in pages.items():
        for tag, attribute, value in links.refs:
            if REMOTE.match(value) or value.startswith(("mailto:", "data:", "javascript:")):
                continue
            parts = urlsplit(value)
            base = root if parts.path.startswith("/") else page.parent  # 404.html links from the site root
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else page
            where = f"{page.relative_to(root)}: {tag} {attribute}={value!r}"
            if not target.exists():
                problems.append(f"{where}: no such file")
            elif parts.fragment and target.suffix == ".html" and target in pages \
                    and unquote(parts.fragment) not in pages[target].ids:
                problems.append(f"{where}: no anchor #{parts.fragment}")
    return problems


def remote_assets(root: Path) -> list[str]:
    problems = []
    for page in root.rglob("*.html"):
        for tag, attribute, value in parse(page).refs:
            if REMOTE.match(value) and tag != "a":
                problems.append(f"{page.relative_to(root)}: {tag} {attribute}={value!r} loads from the network")
    for sheet in root.rglob("*.css"):
        for url in re.findall(r"url\(\s*['\"]?((?:https?:)?//[^)'\"]+)",
                              sheet.read_text(encoding="utf-8", errors="replace")):
            problems.append(f"{sheet.relative_to(root)}: url({url}) loads from the network")
    return problems


def test_home_page_renders(site, tmp_path):
    binary = chromium()
    dom = run_chromium(binary, site / "index.html", tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    assert "RoPERelay" in dom.stdout and 'class="md-nav' in dom.stdout and "Where to go" in dom.stdout
    shot = tmp_path / "home.png"
    rendered = run_chromium(binary, site / "index.html", tmp_path, f"--screenshot={shot}")
    assert rendered.returncode == 0 and shot.exists(), rendered.stderr[-2000:]
    colours, non_white = not_blank(shot)
    assert colours > 50 and non_white > 0.05, f"blank-looking home page: {colours} colours, {non_white:.3f} non-white"


@pytest.mark.parametrize("term", ["RoPERelay", "PyramidKV"])
def test_search_finds(site, tmp_path, term):
    page = site / "index.html"
    result = run_chromium(chromium(), page, tmp_path, "--virtual-time-budget=20000", "--dump-dom",
                          query=f"q={term}")
    assert result.returncode == 0, result.stderr[-2000:]
    meta = re.search(r'class="md-search-result__meta">([^<]*)<', result.stdout)
    assert meta and re.match(r"\d+ matching document", meta.group(1)), (meta and meta.group(1)) or result.stdout[-3000:]
    hits = re.findall(r"<mark>([^<]*)</mark>", result.stdout)
    assert any(term.lower() in hit.lower() for hit in hits), hits[:20]


def test_internal_links_resolve(site):
    problems = broken_links(site)
    assert not problems, "\n".join(problems[:50])


def test_nothing_loads_from_the_network(site):
    problems = remote_assets(site)
    assert not problems, "\n".join(problems[:50])


def test_link_checks_catch_planted_mistakes(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html#here">x</a><a href="gone.html">y</a>'
                                     '<a href="b.html#nowhere">z</a>'
                                     '<a href="https://example.org/">out</a><script src="https://cdn.example/x.js"></script>'
                                     '<link rel="stylesheet" href="//cdn.example/x.css">')
    (tmp_path / "b.html").write_text('<h2 id="here">h</h2>')
    (tmp_path / "c.css").write_text("body{background:url(https://fonts.example/f.woff)}")
    broken = broken_links(tmp_path)
    assert len(broken) == 2 and "gone.html" in broken[0] + broken[1] and "#nowhere" in broken[0] + broken[1], broken
    remote = remote_assets(tmp_path)
    assert len(remote) == 3 and not any("example.org" in p for p in remote), remote
