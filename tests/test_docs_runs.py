"""``<!-- relaylens:run figures/NAME -->`` on a cross-run folder: the runs committed in its subfolders become one
row of facts each, then the folder's cross-run figures and tables; a folder that is neither kind is a warning (which
``mkdocs --strict`` turns into a failed build)."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

import generate  # noqa: E402 - docs/hooks/, the site build's page generator


def _manifest(data: str, limit: int) -> dict:
    return {"analysis": "history_length", "model": {"spec": "tiny"}, "created_at": "2026-12-02T10:00:00",
            "git_commit": "abcdef1234567", "versions": {"torch": "t", "transformers": "x"},
            "config": {"spec": {"selectors": ["bm25", "snapkv"], "budgets": [0.1], "conditions": ["original", "relay"],
                                "prompt_mode": "chat"}, "run": {"data": data, "limit": limit}}}


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    return tmp_path


def test_cross_run_folder_lists_each_run_then_the_cross_run_files(site):
    folder = site / "figures" / "gain"
    for name, data, limit in (("4096", "d4.json.gz", 48), ("2048", "d2.json.gz", 50)):
        (folder / name).mkdir(parents=True)
        (folder / name / "manifest.json").write_text(json.dumps(_manifest(data, limit)))
    (folder / "stray").mkdir()  # no manifest: not a run
    (folder / "history_length_table.md").write_text("| a |\n|---|\n| 1 |\n")
    (folder / "index.json").write_text(json.dumps({"analysis": "cross-run", "entries": [], "files": [
        "history_length.png", "history_length.svg", "history_length_table.csv", "history_length_table.md"]}))
    warnings = []
    text = generate.run_section("figures/gain", "results.md", warnings.append)
    assert warnings == []
    rows = [line for line in text.splitlines() if line.startswith("| `figures/gain/")]
    assert [r.split("|")[1].strip() for r in rows] == ["`figures/gain/2048/`", "`figures/gain/4096/`"]
    assert "`d2.json.gz` (50 records)" in rows[0] and "`d4.json.gz` (48 records)" in rows[1]
    assert "![history_length.png of figures/gain](figures/gain/history_length.png)" in text
    assert '??? abstract "The table `figures/gain/history_length_table.md`"' in text and "    | 1 |" in text
    assert "stray" not in text


@pytest.mark.parametrize("index", [None, {"analysis": "cross-run", "files": []}, {"analysis": "ordering"}])
def test_a_folder_without_runs_is_a_warning(site, index):
    folder = site / "figures" / "empty"
    folder.mkdir(parents=True)
    if index is not None:
        (folder / "index.json").write_text(json.dumps(index))
        if index["analysis"] == "ordering":
            (folder / "sub").mkdir()
            (folder / "sub" / "manifest.json").write_text(json.dumps(_manifest("d", 1)))
    warnings = []
    assert generate.run_section("figures/empty", "results.md", warnings.append) == ""
    assert len(warnings) == 1 and "no manifest.json there" in warnings[0]


class _Tags(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_run_data_reaches_the_page_as_text(site):
    """Issue 41, item 3: categories, condition labels (``learned:DIR``), file names, model and data paths with HTML,
    backticks, pipes, links, attribute lists or snippet includes in a committed run are shown as text: no tag, no
    event handler, no link and no included file comes from the data; listed names outside the folder are left out
    with a warning. (The browser proof: tests/browser/test_docs_escaping_browser.py.)"""
    from support.docs_shared import PAYLOADS, hostile_run, site_markdown

    folder = hostile_run(site)
    warnings = []
    page = _Tags()
    page.feed(site_markdown(generate.run_section(folder, "results.md", warnings.append)))
    assert len(warnings) == 3 and all("not a file of the folder; left out" in w for w in warnings), warnings
    live = [(tag, attrs) for tag, attrs in page.tags
            if any(a.startswith("on") for a in attrs) or (tag == "img" and attrs.get("src") == "x")
            or str(attrs.get("href", "")).startswith("javascript:") or tag in ("script", "iframe")]
    assert not live, live
    text = "".join(page.text)
    assert PAYLOADS["html"] in text and "learned:" + PAYLOADS["html"] in text, "the data is shown, as text"
    assert "toolkit for studying" not in text, "a snippet include in the data pulled in README.md"
    assert [tag for tag, _ in page.tags].count("img") == 1  # the figure itself, under its escaped name
