"""Batched rows on the real embedded SmolLM2: a record's selectors x conditions decode to the same tokens as one by
one."""

from __future__ import annotations

import pytest

from relaylens.generation.rows import Row, run_rows
from relaylens.generation.single import run_condition
from relaylens.probes.readouts import probe_condition, probe_rows

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def record_rows(smollm2):
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import bundled_sample_path
    from relaylens.model.prefill import prefill_history
    from relaylens.selectors import make_selector

    model, tokenizer = smollm2
    prompt = render_prompt(load_records(bundled_sample_path())[0], tokenizer, mode="completion")
    prefill = prefill_history(model, prompt.history_ids)
    selections = [make_selector(name).select(prefill, prompt, 0.1) for name in ("snapkv", "pyramidkv", "bm25")]
    assert not selections[1].is_uniform, "PyramidKV keeps a different count per layer: the batch is ragged"
    conditions = ("original", "relay", "key_only", "query_only(512)", "half_gap", "score_order", "random_order(1)")
    rows = [(sel, cond) for sel in selections for cond in conditions]
    return model, tokenizer, prompt, prefill, rows


def test_smollm2_batched_tokens_equal_sequential(record_rows):
    model, tokenizer, prompt, prefill, rows = record_rows
    common = dict(max_new_tokens=12, tokenizer=tokenizer, stop_at_newline=True)
    sequential = [run_condition(model, prefill, sel, cond, prompt.question_ids, **common) for sel, cond in rows]
    batched = run_rows(model, prefill, [Row(sel, cond) for sel, cond in rows], prompt.question_ids, **common)
    for (_, cond), one, many in zip(rows, sequential, batched):
        assert (many.token_ids, many.stop_reason, many.text) == (one.token_ids, one.stop_reason, one.text), cond
        assert float((many.last_logits - one.last_logits).abs().max()) <= 1e-4, cond


def test_smollm2_batched_readouts_equal_sequential(record_rows):
    model, tokenizer, prompt, prefill, rows = record_rows
    evidence = prompt.evidence_mask("session")
    chosen = rows[::4]
    sequential = [probe_condition(model, prefill, sel, cond, prompt.question_ids, evidence, teacher_token=42,
                                  max_new_tokens=2) for sel, cond in chosen]
    batched = probe_rows(model, prefill, chosen, prompt.question_ids, evidence, teacher_token=42, max_new_tokens=2)
    for (_, cond), one, many in zip(chosen, sequential, batched):
        assert many.generation.token_ids == one.generation.token_ids
        # observed passes attend row by row and feed the teacher token with the question, so the rows' readouts are
        # computed with the shapes of a sequential run (bitwise equal on this CPU); the bound is 1e-5
        difference = (one.readouts["value"] - many.readouts["value"]).abs().fillna(0)
        scale = one.readouts["value"].abs().fillna(0).clip(lower=1.0)  # value-weighted norms reach ~10
        assert float((difference / scale).max()) <= 1e-5, cond
        assert one.readouts[["layer", "head", "metric",
                             "probe_point"]].equals(many.readouts[["layer", "head", "metric", "probe_point"]])
