"""``relaylens run`` on a run that produced nothing (issue 54, item 2): every unit skipped -> exit 1 and one ``error:``
line naming the cause (the skip reasons counted) and the fix; some units skipped -> exit 0 and the count, as before."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny random Llama saved like a user's local model, and two LongMemEval-format records."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("run_exit")
    model_dir = root / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=800)))
    return root, model_dir, data


def _run(workspace, out: str, *budgets: str):
    root, model_dir, data = workspace
    budget_flags = [flag for b in budgets for flag in ("--budget", b)]
    command = [sys.executable, "-m", "relaylens.cli", "run", "coordinate_ablation", "--model", str(model_dir),
               "--data", str(data), "--limit", "2", "--max-new-tokens", "2", "--condition", "relay",
               "--selector", "bm25:granularity=session", *budget_flags, "--out", str(root / out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_a_run_whose_every_unit_was_skipped_exits_non_zero_with_one_line(workspace):
    result = _run(workspace, "nothing", "0.005")  # 4 states fit no whole session: every unit too_short
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    line = errors[0]
    assert "produced no answer" in line and "all 2 unit(s) of 2 record(s) were skipped" in line
    assert "(too_short: 2;" in line and "fits no whole session" in line  # the reasons counted, one example
    assert "Fix:" in line and "bm25:granularity=turn" in line and "--retry-skipped" in line
    assert "run directory" in result.stderr  # the run directory is still named (its skipped table is there)


def test_a_run_with_some_skips_exits_zero_and_counts_them(workspace):
    result = _run(workspace, "some", "0.005", "0.4")  # 0.005: skipped; 0.4: runs
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert not [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "skipped 2 unit(s) of 2 record(s):" in result.stdout
