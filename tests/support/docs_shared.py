"""A committed run whose data carries HTML and Markdown payloads, and the site's Markdown rendering, for the docs
escaping tests (tests/test_docs_runs.py and tests/browser/test_docs_escaping_browser.py; not a test module)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

PWN = "document.body.setAttribute('data-pwned',1)"  # what every payload runs, if it ever runs
PAYLOADS = {
    "html": f'<img src=x onerror="{PWN}">',
    "backtick": f'x`<img src=x onerror="{PWN}">`',
    "fence": f'```\n<img src=x onerror="{PWN}">',
    "link": f"[click](javascript:{PWN})",
    "attr": "{: onclick=\"" + PWN + "\" }",
    "table": f'a | <img src=x onerror="{PWN}"> |',
}


def hostile_run(root: Path) -> str:
    """Write ``figures/hostile`` under ``root`` (its manifest, index.json, a table and a figure, every piece of data
    carrying a payload) and return the folder name for ``<!-- relaylens:run figures/hostile -->``."""
    folder = root / "figures" / "hostile"
    folder.mkdir(parents=True)
    html = PAYLOADS["html"]
    manifest = {"analysis": PAYLOADS["backtick"], "model": {"spec": html}, "created_at": html,
                "git_commit": PAYLOADS["backtick"], "versions": {"torch": html, "transformers": PAYLOADS["attr"]},
                "config": {"spec": {"selectors": [html, PAYLOADS["link"]], "budgets": [0.1, html],
                                    "conditions": [f"learned:{html}", PAYLOADS["backtick"], "relay"],
                                    "prompt_mode": PAYLOADS["fence"]},
                           "run": {"data": f"data/{html}.json", "limit": html}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    figure = f"figure{html.replace('/', '')}.png"  # a file name holding the payload (no path separator)
    (folder / figure).write_bytes(b"\x89PNG\r\n\x1a\n")
    table = (f"**Table: {html}**\n\n| category | condition | value |\n|---|---|---|\n"
             f"| {html} | {PAYLOADS['backtick']} | 0.5 |\n| {PAYLOADS['table'].replace('|', chr(92) + '|')} | "
             f"{PAYLOADS['attr']} | 1 |\n\nnote: {PAYLOADS['link']} {html}\n--8<-- \"README.md\"\n")
    (folder / "table1.md").write_text(table)
    files = [figure, "table1.md", "../../../README.md", ".hidden.md", "missing.md"]
    (folder / "index.json").write_text(json.dumps({"analysis": "ordering", "files": files}))
    return "figures/hostile"


def site_markdown(markdown_text: str) -> str:
    """``markdown_text`` rendered to HTML with the site's own Markdown extensions (mkdocs.yml)."""
    import markdown

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    names, options = [], {}
    for entry in config["markdown_extensions"]:
        name, settings = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        names.append(name)
        if settings:
            options[name] = settings
    return markdown.markdown(markdown_text, extensions=names, extension_configs=options)
