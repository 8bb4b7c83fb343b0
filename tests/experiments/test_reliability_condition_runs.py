"""Issue 41 (round 4), conditions inside real runs on a tiny model: every documented scoped condition runs in an
analysis with probes, teacher forcing, sensitivity and phase replay (item 11), and a condition that cannot place a
record (past the rotary range, or a key moved past the question) is skipped and recorded the same way for
``geometry(...)``, ``query_only(...)`` and ``move=`` (item 13), never an abort."""

from __future__ import annotations

import json

import pytest

from relaylens.experiments.config import RunConfig
from relaylens.experiments.runner import run_analysis
from relaylens.experiments.specs import load_analysis
from relaylens.results.store import load_tables


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("condition_runs")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=800)))
    return root, data, tiny_tokenizer(), {v: tiny_model(v, max_position_embeddings=4096) for v in ("llama", "gemma3")}


def _run(workspace, out, conditions=("original",), replay=(), variant="llama", **changes):
    root, data, tokenizer, models = workspace
    spec = load_analysis("evidence_reading").spec.replace(
        **{"selectors": ("bm25",), "budgets": (0.4,), "max_new_tokens": 2, "conditions": conditions,
           "replay_conditions": replay, "sensitivity": True, "attribution": False, **changes})
    config = RunConfig(model="tiny", data=str(data), limit=1, out=str(root / out), window_size=4)
    return load_tables(run_analysis(spec, config, progress=False, model_and_tokenizer=(models[variant], tokenizer)))


@pytest.mark.parametrize("condition, variant", [
    ("relay@heads=0.0@move=1@base=relay", "llama"),  # the finite shift of the sensitivity readout: a key at distance 0
    ("relay@heads=1.1@move=1", "llama"),
    ("geometry(b=2,s=0.5,alpha=0.5)@layers=0", "llama"),
    ("relay@layer_type=*", "llama"),                 # one layer type: expands to nothing
    ("relay@layer_type=*", "gemma3"),
    ("relay@layers=0@move=-3", "gemma3"),
])
def test_scoped_conditions_run_in_an_analysis_with_probes_and_replay(workspace, condition, variant):
    tables = _run(workspace, f"scoped-{abs(hash((condition, variant)))}", ("original", condition), (condition,),
                  variant)
    assert not len(tables.get("skipped", [])) and "original" in set(tables["answers"]["condition"])
    replay = tables["probes"].query("source == 'replay'")
    assert condition.endswith("=*") or len(replay), condition


@pytest.mark.parametrize("condition, reason", [
    ("query_only(5000)", "too_long"),
    ("geometry(b=5000)", "too_long"),
    ("relay@layers=0@move=-5000", "too_long"),
    ("geometry(b=2)@layers=0@move=-5000", "too_long"),
    ("relay@move=2", "position"),
])
def test_conditions_that_cannot_place_a_record_skip_it_the_same_way(workspace, condition, reason):
    tables = _run(workspace, f"unplaceable-{abs(hash(condition))}", ("original", condition), probes=False,
                  teacher_forcing=False, sensitivity=False)
    skipped = tables["skipped"]
    assert list(skipped["reason"]) == [reason] and not len(tables["answers"])
    assert "\n" not in skipped["detail"].iloc[0]
