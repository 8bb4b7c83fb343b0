"""Token views of a real (tiny-model) run (issue 28, item 11): a view lost after its unit was committed (a failed
write, a deleted file) is written again when the same command resumes, and stale temp files are removed."""

from __future__ import annotations

import json

import pytest

from relaylens.results.store import RunStore
from relaylens.results.views import view_path


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("views")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=800)))
    return {"data": data, "model": tiny_model("llama", seed=0), "tokenizer": tiny_tokenizer()}


def _run(ws, out):
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis

    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())
    return run_analysis(spec, RunConfig(data=str(ws["data"]), out=str(out)), progress=False,
                        model_and_tokenizer=(ws["model"], ws["tokenizer"]))


def test_a_lost_view_is_written_again_on_resume(ws, tmp_path):
    out = _run(ws, tmp_path / "run")
    store = RunStore.open(out)
    views = sorted((out / "views").glob("*.json"))
    assert len(views) == len(store.unit_paths()) > 1
    lost = views[0]
    expected = json.loads(lost.read_text())
    lost.unlink()  # as a write that failed after the unit's commit leaves it
    views[1].write_text(views[1].read_text()[:40])  # and a damaged one
    (out / "views" / f"{lost.stem}.json.tmp").write_text("{")  # temp files of a killed writer
    (out / "views" / f".tmp-{lost.name}-12345").write_text("{")
    units = {p.name: p.read_bytes() for p in store.unit_paths()}
    _run(ws, out)  # the same command: resumes
    assert {p.name: p.read_bytes() for p in store.unit_paths()} == units, "committed units must not be recomputed"
    again = json.loads(view_path(out, expected).read_text())
    assert {k: again[k] for k in ("record_id", "selector", "budget", "tokens", "kept")} == \
        {k: expected[k] for k in ("record_id", "selector", "budget", "tokens", "kept")}
    assert json.loads(views[1].read_text())["record_id"]
    assert sorted(p.name for p in (out / "views").iterdir()) == sorted(p.name for p in views)
