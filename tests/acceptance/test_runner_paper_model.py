"""Real-model tier of test_runner_paper.py: running as the paper ran: skipped records (too long, too short)
recorded and not retried silently, CLI overrides."""

from __future__ import annotations

import json

import pytest
from support.runner_paper_shared import workspace_fixture  # noqa: F401 - pytest fixture (named workspace)
from support.runs import cli  # tests/ is on sys.path under pytest (tests/conftest.py)

from relaylens.results.store import load_tables

pytestmark = pytest.mark.model


@pytest.mark.slow
@pytest.mark.parametrize("analysis", ["main_table", "budget_curves", "coordinate_ablation", "ordering",
                                      "evidence_reading", "question_types", "alignment", "overhead", "full_kv"])


def test_every_paper_preset_runs_end_to_end(workspace, tmp_path, analysis):
    """``--preset paper --limit 2`` on a tiny model (decoding shortened to keep CI fast; the full 512-token runs are
    in the README's check); the manifest carries the paper's configuration."""
    from relaylens.experiments.presets import apply_preset
    from relaylens.experiments.specs import load_analysis

    root, model_dir, data = workspace
    out = tmp_path / analysis
    cli("run", analysis, "--preset", "paper", "--limit", "2", "--model", model_dir, "--data", data, "--out", out,
         "--max-new-tokens", "2")
    spec = json.loads((out / "manifest.json").read_text())["config"]["spec"]
    paper = apply_preset(load_analysis(analysis), "paper")
    assert spec["selectors"] == list(paper.selectors) and spec["budgets"] == list(paper.budgets)
    assert spec["conditions"] == list(paper.conditions) and spec["granularity"] == paper.granularity
    assert spec["prompt_mode"] == "chat"  # the tiny tokenizer has a chat template: auto chose chat
    tables = load_tables(out)
    assert len(tables["answers"]) + len(tables["skipped"]) > 0
