"""Browser proof of issue 41, item 3: the documentation generator's section of a committed run whose data carries
HTML payloads (category, condition label ``learned:<img ...>``, file name, model and data paths, table notes) and a
notebook output that tries to close its code fence, rendered with the site's Markdown extensions and opened in
headless Chromium: no payload runs. A control page holding the bare payload proves that a payload that runs is seen."""

from __future__ import annotations

import re

import pytest
from support.browser import chromium, run_chromium  # tests/ helpers
from support.docs_shared import PAYLOADS, hostile_run, site_markdown

# isort: split
import executed_notebooks  # noqa: E402 - docs/hooks/, put on the path by support.docs_shared
import generate  # noqa: E402

pytestmark = pytest.mark.browser
RAN = re.compile(r"<body[^>]*data-pwned")


def _body_after_load(tmp_path, name: str, body: str) -> str:
    page = tmp_path / f"{name}.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>",
                    encoding="utf-8")
    result = run_chromium(chromium(), page, tmp_path, "--virtual-time-budget=5000", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_check_sees_a_payload_that_runs(tmp_path):
    assert RAN.search(_body_after_load(tmp_path, "control", PAYLOADS["html"]))


def test_no_payload_from_run_data_runs_in_the_site(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    folder = hostile_run(tmp_path)
    section = generate.run_section(folder, "results.md", lambda warning: None)
    output = "\n".join(executed_notebooks._fenced("text", f"record {PAYLOADS['fence']}\n```\n{PAYLOADS['html']}"))
    dom = _body_after_load(tmp_path, "results", site_markdown(section + "\n\n" + output))
    assert not RAN.search(dom), "a payload from the run's data ran in the page"
    assert "learned:&lt;img src=x" in dom, "the condition label is shown as text"
