"""Evidence reading with attribution decodes a record's conditions as one batch (issue 54, item 3): the same answer
tokens and the same probe and attribution rows as the one-row path (``probe_condition(grad=True)`` per row, which
decodes each row alone after its autograd question pass)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from relaylens.datasets import bundled_sample_path, load_records
from relaylens.datasets.prompting import render_prompt
from relaylens.experiments.walk import answer_tokens
from relaylens.model.prefill import prefill_history
from relaylens.probes.attribution import ATTRIBUTION_READOUTS
from relaylens.probes.readouts import probe_condition, probe_rows
from relaylens.selectors import make_selector
from relaylens.testing import tiny_model, tiny_tokenizer

CONDITIONS = ("original", "half_gap", "relay")


@pytest.fixture(scope="module")
def case():
    """A tiny Llama, one annotated sample record (its first two sessions), and two selections of its history."""
    model, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    record = next(r for r in load_records(bundled_sample_path()) if r.answers and not r.is_abstention)
    prompt = render_prompt(record, tokenizer, mode="completion")
    evidence = prompt.evidence_mask("turn")
    assert bool(evidence.any())
    prefill = prefill_history(model, prompt.history_ids, window_size=32)
    selections = [make_selector(name).select(prefill, prompt, 0.2) for name in ("snapkv", "bm25")]
    answer = answer_tokens(tokenizer, record, "completion")
    assert len(answer) > 1
    return model, tokenizer, prompt, prefill, evidence, selections, answer


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    keys = [c for c in a.columns if c != "value"]
    assert a[keys].reset_index(drop=True).equals(b[keys].reset_index(drop=True))  # same rows in the same order
    torch.testing.assert_close(torch.tensor(a.value.to_numpy()), torch.tensor(b.value.to_numpy()), rtol=1e-5,
                               atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("stop", ["none", "eos"])
def test_batched_attribution_rows_equal_the_one_row_path(case, stop):
    model, tokenizer, prompt, prefill, evidence, selections, answer = case
    kwargs = dict(max_new_tokens=12, tokenizer=tokenizer, eos_token_ids=set() if stop == "none" else None,
                  teacher_token=answer[0], grad=True, next_answer_token=answer[1])
    rows = [(selection, condition) for selection in selections for condition in CONDITIONS]
    one = [probe_condition(model, prefill, selection, condition, prompt.question_ids, evidence, **kwargs)
           for selection, condition in rows]
    batched = probe_rows(model, prefill, rows, prompt.question_ids, evidence, **kwargs)
    assert len(batched) == len(one) == 6
    for old, new in zip(one, batched):
        assert new.condition == old.condition
        assert new.generation.token_ids == old.generation.token_ids  # the same answer, token for token
        assert (new.generation.text, new.generation.stop_reason) == (old.generation.text, old.generation.stop_reason)
        assert new.generation.positions == old.generation.positions
        assert new.generation.question_start == old.generation.question_start
        torch.testing.assert_close(new.generation.last_logits, old.generation.last_logits)
        _frames_equal(new.readouts, old.readouts)
        assert set(ATTRIBUTION_READOUTS) <= set(new.readouts.metric)
        assert set(new.readouts.probe_point) == {"question_final", "first_answer_token"}
        assert new.generation.head_inputs is None and new.generation.teacher_logits is None  # graph freed
    if stop == "none":
        assert all(len(p.generation.token_ids) == 12 for p in batched)  # decoding really ran in the batch


def test_grad_needs_the_teacher_token(case):
    model, tokenizer, prompt, prefill, evidence, selections, _ = case
    with pytest.raises(ValueError, match="teacher_token"):
        probe_rows(model, prefill, [(selections[0], "relay")], prompt.question_ids, evidence, grad=True,
                   max_new_tokens=2)


def test_process_record_batches_attribution_rows(case):
    """The runner's evidence_reading path: one batch of every row (``batch_rows`` unset) gives the answers and probe
    rows of one row at a time (``batch_rows=1``)."""
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.record_rows import process_record
    from relaylens.experiments.specs import load_analysis
    from relaylens.experiments.units import UnitWork
    from relaylens.experiments.walk import PrefillReuse, RecordWork, RunWalk

    model, tokenizer, prompt, prefill, evidence, selections, _ = case
    record = next(r for r in load_records(bundled_sample_path()) if r.record_id == prompt.record_id)
    spec = load_analysis("evidence_reading").spec.replace(max_new_tokens=6, prompt_mode="completion",
                                                          replay_conditions=("original", "relay"))
    assert spec.attribution and spec.teacher_forcing
    units = [UnitWork(name, 0.2, selection, 0.0) for name, selection in zip(("snapkv", "bm25"), selections)]
    out = {}
    for batch_rows in (None, 1):
        walk = RunWalk.start(model, tokenizer, spec, RunConfig(batch_rows=batch_rows), reuse=PrefillReuse(False))
        out[batch_rows] = list(process_record(walk, RecordWork(record, prompt, prefill, 0.0, units)))
    for (u1, answers1, scores1, probes1, _), (u2, answers2, scores2, probes2, _) in zip(out[None], out[1]):
        assert u1.selector == u2.selector
        assert [a["answer"] for a in answers1] == [a["answer"] for a in answers2]
        assert [a["new_tokens"] for a in answers1] == [a["new_tokens"] for a in answers2]
        assert {a["batch_rows"] for a in answers1} == {6} and {a["batch_rows"] for a in answers2} == {1}
        _frames_equal(probes1, probes2)
        assert set(ATTRIBUTION_READOUTS) <= set(probes1.metric)
