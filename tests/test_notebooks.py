"""The notebooks as Jupyter users see them: executed in a real kernel, their outputs hold no warnings.

Every notebook is executed with nbclient (the same machinery Jupyter uses); a cell error fails the test, and so does
any output a user would read as a warning: a stderr stream (warnings, tqdm's text fallback, "IProgress not found"),
or output text mentioning a warning, ``install "ipywidgets"`` or a traceback. Progress bars must render as widgets
(ipywidgets is in the ``notebooks``/``dev`` extras) or not at all.

CI runs them in smoke mode (``RELAYLENS_SMOKE=1``: tiny random model, two records). Set ``RELAYLENS_NOTEBOOKS_REAL=1``
to execute them with the embedded SmolLM2 instead (minutes on a CPU).
"""

from __future__ import annotations

import os
import re
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
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text='install "ipywidgets" for Jupyter support')]
    assert warnings_in(nb)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="Loading: 100%|####| 3/3")]
    assert warnings_in(nb)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="3 records\n")]
    assert not warnings_in(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_without_warnings(path, monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    if os.environ.get("RELAYLENS_NOTEBOOKS_REAL") != "1":
        monkeypatch.setenv("RELAYLENS_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", str(path.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(tmp_path)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    found = warnings_in(notebook)
    assert not found, "\n".join(found)
