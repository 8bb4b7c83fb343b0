"""MkDocs hooks of the relaylens site: every reference page is generated from code at build time, never copied.

Generated pages (added to the build by :func:`on_files`; none of them exists in ``docs/``):

* ``reference/cli.md``: every command, argument and option of the typer app ``relaylens.cli:app``;
* ``reference/api/*.md``: the public face (``relaylens.__all__``) and one page per stage subpackage (its contract
  docstring and its ``__all__``), rendered by mkdocstrings; a public name without a docstring is a build warning;
* ``reference/run-directory.md``: the run-directory layout and the table schemas of ``relaylens.results``;
* ``reference/errors.md``: every subclass of ``RelaylensError`` in the package;
* ``reference/environment.md``: every environment variable the code reads (found by :mod:`codescan`), described in
  ``docs/reference/environment.yml``; a variable read but not described, or described but never read, is a warning;
* ``tutorials/*.md``: the notebooks, executed in smoke mode (:mod:`executed_notebooks`).

Hand-written pages hold placeholders that expand from code: ``<!-- relaylens:presets -->`` (the preset table),
``<!-- relaylens:analyses -->`` (every analysis, its command and its cost) and ``<!-- relaylens:run figures/NAME -->``
(a committed run: its manifest, figures and tables). mkdocs --strict turns every warning logged here into a failure.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]

import executed_notebooks  # noqa: E402
import generate  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

log = logging.getLogger("mkdocs.plugins.relaylens")


def on_config(config, **kwargs):
    """The API section of the navigation lists the generated stage pages."""
    api = [{"Public face": "reference/api/index.md"}] + [
        {stage: f"reference/api/{stage}.md"} for stage in generate.API_PAGES]
    for section in config["nav"]:
        if isinstance(section, dict) and "Reference" in section:
            items = section["Reference"]
            for i, item in enumerate(items):
                if isinstance(item, dict) and "Python API" in item:
                    items[i] = {"Python API": api}
    return config


def on_files(files, config, **kwargs):
    pages = generate.pages(warn=log.warning)
    pages.update(executed_notebooks.pages(ROOT / "notebooks", warn=log.warning))
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    for path in sorted((ROOT / "figures").rglob("*")):  # the committed runs: figures and reports, as files of the site
        if path.suffix in (".png", ".svg", ".html") and path.is_file():
            files.append(File.generated(config, f"figures/{path.relative_to(ROOT / 'figures').as_posix()}",
                                        abs_src_path=str(path)))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):  # the notebooks themselves, to download
        files.append(File.generated(config, f"tutorials/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    return generate.expand(markdown, page.file.src_uri, warn=log.warning)
