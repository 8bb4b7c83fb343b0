"""The notebooks as Jupyter users see them: executed in a real kernel, their outputs hold no warnings.

Every notebook is executed with nbclient (the same machinery Jupyter uses); a cell error fails the test, and so does
any output a user would read as a warning: a stderr stream (warnings, tqdm's text fallback, "IProgress not found"),
or output text mentioning a warning, ``install "ipywidgets"`` or a traceback. Progress bars must render as widgets
(ipywidgets is in the ``notebooks``/``dev`` extras) or not at all.

CI runs them in smoke mode (``RELAYLENS_SMOKE=1``: tiny random model, two records). Set ``RELAYLENS_NOTEBOOKS_REAL=1``
to execute them with the embedded SmolLM2 instead (minutes on a CPU).

The documentation build (``make docs``, which ``make test`` runs first) executes the same notebooks the same way for
the tutorials and caches each executed copy under a hash of the notebook, the package sources and the Python and
package versions (docs/hooks/executed_notebooks.py). In smoke mode a fresh copy is checked instead of executing the
notebook again; without one (no docs build, or anything changed since) the notebook is executed here.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
WARNING_TEXT = re.compile(r"warn|IProgress|ipywidgets|Traceback|deprecat", re.IGNORECASE)


def warnings_in(notebook) -> list[str]:
    """``cell N: text`` for every output of an executed notebook that reads as a warning."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                text = "".join(output.get("text", ""))
                if output.get("name") == "stderr" or WARNING_TEXT.search(text):
                    found.append(f"cell {index} ({output.get('name')}): {text.strip()[:300]}")
            elif kind == "error":
                found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
            elif kind in ("display_data", "execute_result"):
                text = "".join(output.get("data", {}).get("text/plain", ""))
                if WARNING_TEXT.search(text):
                    found.append(f"cell {index} ({kind}): {text.strip()[:300]}")
    return found


def test_scan_catches_warnings():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text='install "ipywidgets" for Jupyter support')]
    assert warnings_in(nb)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="Loading: 100%|####| 3/3")]
    assert warnings_in(nb)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="3 records\n")]
    assert not warnings_in(nb)


def _docs_build_copy(path: Path) -> Path | None:
    sys.path.insert(0, str(path.parent.parent / "docs" / "hooks"))
    try:
        import executed_notebooks  # docs/hooks/executed_notebooks.py: the site's executor and its cache
    finally:
        sys.path.pop(0)
    return executed_notebooks.fresh_copy(path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_without_warnings(path, monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    real = os.environ.get("RELAYLENS_NOTEBOOKS_REAL") == "1"
    if not real:
        monkeypatch.setenv("RELAYLENS_SMOKE", "1")
        executed = _docs_build_copy(path)
        if executed is not None:  # executed by `make docs` in this very state of the code: check its outputs
            found = warnings_in(nbformat.read(executed, as_version=4))
            assert not found, "\n".join(found)
            return
    monkeypatch.setenv("PYTHONPATH", str(path.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(tmp_path)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    found = warnings_in(notebook)
    assert not found, "\n".join(found)
