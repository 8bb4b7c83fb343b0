"""Reports and figures (issue 14, items 2 and 3): written atomically, so a full disk keeps the previous good files,
and only one writer at a time per run directory.

The "full disk" is a file-size limit (``RLIMIT_FSIZE``, no privileges needed) on the real CLI process: a write past
the limit fails with ``EFBIG`` exactly where a full disk fails with ``ENOSPC``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
LIMIT = 16 * 1024  # bytes: below the size of report.html and of the figure files


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("outputs")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=800)))
    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2)
    return run_analysis(spec, RunConfig(model="tiny", data=str(data), out=str(root / "run")), progress=False,
                        model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))


def _cli(*args, limit: int | None = None):
    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "relaylens.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=ENV, preexec_fn=cap if limit else None)


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["report", "figures"])
def test_full_disk_keeps_the_previous_outputs_intact(run_dir, command):
    good = _cli(command, run_dir)
    assert good.returncode == 0, good.stderr[-2000:]
    before = _snapshot(run_dir)
    assert max(len(v) for k, v in before.items() if k.name != "manifest.json") > LIMIT  # the limit bites
    full = _cli(command, run_dir, limit=LIMIT)
    assert full.returncode == 2, full.stderr[-2000:]
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert "intact" in errors[0] and "Fix" in errors[0]
    after = _snapshot(run_dir)
    assert after == before, [str(k) for k in after if after[k] != before.get(k)] or "files added or removed"


@pytest.mark.parametrize("command", ["report", "figures"])
def test_report_and_figures_take_the_run_lock(run_dir, command):
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.results.locks import run_lock

    with run_lock(run_dir, "run"):
        result = CliRunner().invoke(app, [command, str(run_dir)])
    assert result.exit_code == 2, result.output
    assert f"pid {os.getpid()}" in result.stderr and "relaylens run" in result.stderr
