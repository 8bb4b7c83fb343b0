"""The tutorials: every notebook of notebooks/, executed at build time in smoke mode and rendered with its outputs.

Smoke mode is the one the tests use (``RELAYLENS_SMOKE=1``: a tiny random model, two records; tests/test_notebooks.py
executes the same way), so the build needs no model download and the outputs show what the code does today, not
results. Executed copies are cached in ``build/docs-notebooks/`` under a hash of the notebook, of every source file
it can reach (the package, the analyses) and of the Python and key package versions, so a rebuild with nothing
changed executes nothing; any change re-executes. tests/test_notebooks.py checks these fresh copies instead of
executing the notebooks a second time (``make test`` builds the site first).
Notebooks that need executing run two at a time. A cell error fails the build.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "docs-notebooks"
SOURCES = ("relaylens",)  # the package, relaylens/analyses/ included
WIDGET = "application/vnd.jupyter.widget-view+json"


def source_hash(notebook: Path) -> str:
    digest = hashlib.sha256(notebook.read_bytes())
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".j2", ".json", ".jsonl"):
                digest.update(path.relative_to(ROOT).as_posix().encode())
                digest.update(path.read_bytes())
    digest.update(sys.version.encode())
    from importlib.metadata import PackageNotFoundError, version

    for package in ("torch", "transformers", "numpy", "pandas", "matplotlib", "nbclient", "ipykernel"):
        try:
            digest.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            pass
    return digest.hexdigest()[:20]


def fresh_copy(notebook: Path) -> Path | None:
    """The executed copy of ``notebook`` a docs build left in the cache, if it is fresh (same notebook, same sources,
    same Python and package versions), else None."""
    path = CACHE / f"{notebook.stem}-{source_hash(notebook)}.ipynb"
    return path if path.is_file() else None


def execute(notebook: str, target: str) -> str:
    """Execute one notebook in smoke mode (a fresh kernel, working directory build/docs-notebooks/work) into
    ``target``."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["RELAYLENS_SMOKE"] = "1"
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    work = CACHE / "work" / Path(notebook).stem
    work.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    tmp = Path(target).with_suffix(".tmp")
    nbformat.write(nb, str(tmp))
    tmp.replace(target)
    return target


def executed(paths: list[Path]) -> dict[Path, Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    targets = {p: CACHE / f"{p.stem}-{source_hash(p)}.ipynb" for p in paths}
    todo = [p for p, t in targets.items() if not t.exists()]
    if todo:
        for stale in CACHE.glob("*.ipynb"):
            if stale not in targets.values():
                stale.unlink()
        with ProcessPoolExecutor(max_workers=min(2, len(todo))) as pool:
            list(pool.map(execute, [str(p) for p in todo], [str(targets[p]) for p in todo]))
    return targets


def pages(folder: Path, warn) -> dict[str, str]:
    import nbformat

    paths = sorted(folder.glob("*.ipynb"))
    out = {}
    for path, done in executed(paths).items():
        nb = nbformat.read(str(done), as_version=4)
        out[f"tutorials/{path.stem}.md"] = render(nb, path, warn)
    return out


def render(nb, path: Path, warn) -> str:
    lines = []
    title_done = False
    for index, cell in enumerate(nb.cells):
        source = cell.source
        if cell.cell_type == "markdown":
            if not title_done and source.lstrip().startswith("# "):
                head, _, rest = source.lstrip().partition("\n")
                lines += [head, "", _note(path), "", rest.strip(), ""]
                title_done = True
            else:
                lines += [source, ""]
            continue
        if cell.cell_type != "code":
            continue
        if not title_done:
            lines += [f"# {path.stem}", "", _note(path), ""]
            title_done = True
        lines += _fenced("python", source)
        for output in cell.get("outputs", []):
            lines += _output(output, f"{path.name} cell {index}", warn)
    return "\n".join(lines) + "\n"


def _note(path: Path) -> str:
    return (f'!!! info "Executed at build time in smoke mode"\n    This page is [`notebooks/{path.name}`]({path.name}) '
            "(download it to run it), executed when the site was built with `RELAYLENS_SMOKE=1`: a tiny random "
            "model and two records, as in the tests. The outputs show what the code does, not results: run it "
            "without `RELAYLENS_SMOKE` for the embedded SmolLM2.")


def _output(output, where: str, warn) -> list[str]:
    kind = output.get("output_type")
    if kind == "stream":
        text = _ansi(output.get("text", "")).rstrip()
        return _fenced("text", text) if text else []
    if kind == "error":
        warn(f"{where}: {output.get('ename')}: {output.get('evalue')}")
        return []
    data = output.get("data", {})
    if WIDGET in data:  # a progress bar: a live widget in Jupyter, nothing to show on a static page
        return []
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            payload = data[mime] if isinstance(data[mime], str) else base64.b64encode(data[mime]).decode()
            return [f'<img class="nb-output" alt="output of {html.escape(where)}" '
                    f'src="data:{mime};base64,{payload.strip()}">', ""]
    if "image/svg+xml" in data:
        return [f'<div class="nb-output">{data["image/svg+xml"]}</div>', ""]
    if "text/html" in data:
        body = data["text/html"].strip()
        if not re.sub(r"<[^>]+>", "", body).strip():  # an empty rich-console frame
            return []
        return ['<div class="nb-output" markdown="0">', body, "</div>", ""]
    if "text/plain" in data:
        return _fenced("text", _ansi(data["text/plain"]).rstrip())
    return []


def _fenced(language: str, text: str) -> list[str]:
    """``text`` in a fenced block that it cannot close: the fence is longer than any run of backticks in it (an
    output printing a dataset string with three backticks and HTML stays text), and no line of it is a snippet
    include (:func:`_no_snippets`)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{language}", _no_snippets(text), fence, ""]


def _no_snippets(text: str) -> str:
    """``text`` with every line pymdownx.snippets would read as an include or a section marker escaped by one ``;``
    (which snippets removes again): the line shows as written, and includes nothing."""
    from pymdownx.snippets import SnippetPreprocessor

    lines = []
    for line in text.split("\n"):
        found = SnippetPreprocessor.RE_ALL_SNIPPETS.match(line) or SnippetPreprocessor.RE_SNIPPET_SECTION.match(line)
        if found:
            line = line[:found.start("escape")] + ";" + line[found.start("escape"):]
        lines.append(line)
    return "\n".join(lines)


def _ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
