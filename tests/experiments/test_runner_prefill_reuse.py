"""Prefill reuse per history: records over one conversation prefill it once, with the same tables as prefilling per
record, a prefill that nothing writes into, a resumable run and the saved time recorded."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import relaylens.experiments.walk as walk
from relaylens.experiments.config import RunConfig
from relaylens.experiments.runner import run_analysis
from relaylens.experiments.specs import ExperimentSpec
from relaylens.experiments.walk import PREFILL_REUSE_FILE
from relaylens.results.store import RunStore, UnitKey, load_tables
from relaylens.results.tables import TIMING_COLUMNS
from relaylens.testing import tiny_model, tiny_tokenizer

SPEC = ExperimentSpec("prefill_reuse", selectors=("snapkv", "bm25", "finch", "h2o"), budgets=(0.3,),
                      conditions=("original", "relay"), max_new_tokens=3, prompt_mode="completion", probes=True)
# finch: a question pass over the reused prefill per record; h2o: the prefill's column sums
LINES = ["I adopted a cat named Pixel.", "I went hiking in the Alps.", "My sister lives in Lisbon.",
         "We painted the kitchen blue.", "The concert was on a Friday.", "I bake bread every Sunday."]


def _conversation(cid: str, a: str, b: str, questions: list[tuple]) -> dict:
    sessions = {}
    for s in (1, 2):
        sessions[f"session_{s}_date_time"] = f"10:00 am on {s} May, 2023"
        sessions[f"session_{s}"] = [{"speaker": (a, b)[j % 2], "dia_id": f"D{s}:{j + 1}",
                                     "text": f"{LINES[(j + 3 * s) % len(LINES)]} (session {s}, turn {j + 1})"}
                                    for j in range(6)]
    qa = [{"question": q, ("adversarial_answer" if c == 5 else "answer"): ans, "evidence": ev, "category": c}
          for q, ans, ev, c in questions]
    return {"sample_id": cid, "conversation": {"speaker_a": a, "speaker_b": b, **sessions}, "qa": qa}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("locomo") / "locomo.json"
    path.write_text(json.dumps([
        _conversation("conv-a", "Ana", "Ben", [("What is the cat called?", "Pixel", ["D1:1"], 4),
                                               ("Where did Ben hike?", "the Alps", ["D1:2"], 4),
                                               ("What did they paint?", "kitchen, blue", ["D2:1", "D2:2"], 1),
                                               ("What is Ben's dog called?", "Rex", ["D1:1"], 5)]),
        _conversation("conv-b", "Cy", "Di", [("Where does the sister live?", "Lisbon", ["D1:3"], 4),
                                             ("When was the concert?", "Friday", ["D2:5"], 2)]),
    ]))
    return path


def _run(data, out, monkeypatch, reuse: bool, force: bool = False):
    if reuse:
        monkeypatch.delenv("RELAYLENS_NO_PREFILL_REUSE", raising=False)
    else:
        monkeypatch.setenv("RELAYLENS_NO_PREFILL_REUSE", "1")
    config = RunConfig(data=str(data), out=str(out), force=force)
    return run_analysis(SPEC, config, progress=False, model_and_tokenizer=(tiny_model("llama", seed=0),
                                                                          tiny_tokenizer()))


def _comparable(run_dir) -> dict[str, pd.DataFrame]:
    out = {}
    for name, frame in load_tables(run_dir).items():
        frame = frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])
        out[name] = frame.sort_values(list(frame.columns)).reset_index(drop=True) if len(frame) else frame
    return out


def _assert_same_tables(a, b):
    assert set(a) == set(b)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """A run with reuse (recording every prefill it computed, with copies of its tensors) and one without."""
    root = tmp_path_factory.mktemp("runs")
    computed = []
    original = walk.prefill_record

    def recording(model, prompt, config, selectors):
        prefill = original(model, prompt, config, selectors)
        tensors = [*prefill.keys, *prefill.values, *(prefill.window_queries or []), *(prefill.column_sums or [])]
        computed.append((prompt.record_id, prefill, [t.clone() for t in tensors]))
        return prefill

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(walk, "prefill_record", recording)
        reused = _run(data, root / "reuse", mp, reuse=True)
        reused_prefills = list(computed)
        computed.clear()
        plain = _run(data, root / "plain", mp, reuse=False)
        plain_prefills = list(computed)
    return reused, reused_prefills, plain, plain_prefills


def test_one_prefill_per_history_and_the_same_tables(runs):
    reused, reused_prefills, plain, plain_prefills = runs
    assert [rid for rid, _, _ in reused_prefills] == ["conv-a:q0000", "conv-b:q0000"]  # one per conversation
    assert len(plain_prefills) == 6  # disabled: one per record
    _assert_same_tables(_comparable(reused), _comparable(plain))
    tables = load_tables(reused)
    assert len(tables["answers"]) == 6 * 4 * 2 and not tables["probes"].empty  # records x selectors x conditions
    assert "locomo_f1" in set(tables["scores"]["metric"])
    note = json.loads((reused / PREFILL_REUSE_FILE).read_text())
    assert note["prefills"] == 2 and note["reused"] == 4 and note["saved_s"] > 0
    assert not (plain / PREFILL_REUSE_FILE).exists()


def test_questions_of_one_history_are_walked_together_whatever_the_record_order(runs, data, tmp_path, monkeypatch):
    """--record-order interleave deals the questions round-robin over categories, which separates a conversation's
    questions; the walk still computes each history's questions in a row, so each history is prefilled once, and the
    tables are the file-order run's."""
    from relaylens.datasets import load_records
    from relaylens.datasets.ordering import order_records

    _, _, plain, _ = runs
    interleaved = [r.record_id.split(":")[0] for r in order_records(load_records(data), "interleave")]
    assert any(a != b for a, b in zip(interleaved, interleaved[1:] + interleaved[:1])) and \
        interleaved != sorted(interleaved)  # the order really separates the conversations
    monkeypatch.delenv("RELAYLENS_NO_PREFILL_REUSE", raising=False)
    out = run_analysis(SPEC, RunConfig(data=str(data), out=str(tmp_path / "mixed"), record_order="interleave"),
                       progress=False, model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    note = json.loads((out / PREFILL_REUSE_FILE).read_text())
    assert note["prefills"] == 2 and note["reused"] == 4
    _assert_same_tables(_comparable(out), _comparable(plain))


def test_the_reused_prefill_is_never_written_into(runs):
    _, reused_prefills, _, _ = runs
    for rid, prefill, before in reused_prefills:  # after every question of its conversation ran on it
        after = [*prefill.keys, *prefill.values, *(prefill.window_queries or []), *(prefill.column_sums or [])]
        assert len(after) == len(before)
        assert all(torch.equal(a, b) for a, b in zip(after, before)), f"the prefill of {rid} was modified in place"


def test_resume_recomputes_missing_units_with_the_same_tables(runs, data, monkeypatch):
    reused, _, plain, _ = runs
    store = RunStore.open(reused)
    for rid in ("conv-a:q0002", "conv-b:q0001"):  # mid-conversation and last records lose their units
        for selector in SPEC.selectors:
            store.remove_unit(UnitKey(rid, selector, 0.3))
    _run(data, reused, monkeypatch, reuse=True, force=True)  # force: the source hash moves while the suite runs
    _assert_same_tables(_comparable(reused), _comparable(plain))
    note = json.loads((reused / PREFILL_REUSE_FILE).read_text())
    assert note["prefills"] == 4 and note["reused"] == 4  # the resumed records prefilled their histories again


def test_reuse_needs_the_same_tokens_and_capture_and_sums_its_note(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    computed = []

    def fake_prefill(model, prompt, config, selectors):
        computed.append(prompt.record_id)
        return object()

    monkeypatch.setattr(walk, "prefill_record", fake_prefill)

    def prompt(rid, ids):
        return SimpleNamespace(record_id=rid, history_ids=torch.tensor(ids), history_length=len(ids))

    reuse, narrow, wide = walk.PrefillReuse(), RunConfig(window_size=2), RunConfig(window_size=3)
    first = reuse.prefill(None, prompt("r1", [1, 2, 3, 4]), narrow, [])
    assert reuse.prefill(None, prompt("r2", [1, 2, 3, 4]), narrow, []) is first  # same tokens, same capture
    reuse.prefill(None, prompt("r3", [1, 2, 3, 5]), narrow, [])  # other tokens
    reuse.prefill(None, prompt("r4", [1, 2, 3, 5]), wide, [])  # same tokens, a wider query window
    reuse.prefill(None, prompt("r5", [1, 2, 3]), wide, [])  # a prefix of the history is another history
    assert computed == ["r1", "r3", "r4", "r5"] and (reuse.prefills, reuse.reused) == (4, 1)
    assert reuse.finish(tmp_path, say=True) == {"prefills": 4, "reused": 1, "saved_s": round(reuse.saved_s, 3)}
    assert "history prefill reused for 1 record(s)" in capsys.readouterr().err
    off = walk.PrefillReuse(enabled=False)
    off.prefill(None, prompt("r1", [1, 2, 3, 4]), narrow, [])
    off.prefill(None, prompt("r2", [1, 2, 3, 4]), narrow, [])
    assert off.reused == 0 and computed[-2:] == ["r1", "r2"]
    assert off.finish(tmp_path)["prefills"] == 6  # an existing note keeps counting
    assert walk.PrefillReuse().finish(tmp_path / "none") is None  # nothing reused, no note: nothing written
