"""Answering at all vs answering right: the table's numbers against hand-computed ones, and the runner's
first-token end-of-answer probability against a question pass recomputed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relaylens.reporting.figures.answering import answering_table, needs_answering
from relaylens.results.tables import example_tables


def _tables():
    """4 records x (original, relay); original answers empty for r0 and r1, relay for none; contains 0/1 by hand."""
    t = example_tables(records=4, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    answers = t["answers"].copy()
    empty = {("r0", "original"), ("r1", "original")}
    answers["answer"] = [("" if (r, c) in empty else "Biscuit") for r, c in zip(answers.record_id, answers.condition)]
    answers["first_token_eos_prob"] = [0.9 if (r, c) in empty else 0.1 for r,
                                       c in zip(answers.record_id, answers.condition)]
    answers["cluster_id"] = answers["record_id"]
    scores = t["scores"][t["scores"].metric == "contains"].copy()
    right = {("r2", "original"), ("r0", "relay"), ("r1", "relay"), ("r2", "relay")}
    scores["value"] = [1.0 if (r, c) in right else 0.0 for r, c in zip(scores.record_id, scores.condition)]
    scores["cluster_id"] = scores["record_id"]
    return {"answers": answers, "scores": scores, "probes": t["probes"], "metrics": ["contains"]}


def test_answering_table_matches_hand_computed_numbers():
    tables = _tables()
    ids = sorted(tables["answers"].record_id.unique())
    assert ids == ["r0", "r1", "r2", "r3"]
    table = answering_table(tables).set_index("condition")
    orig, relay = table.loc["original"], table.loc["relay"]
    assert orig["n"] == relay["n"] == 4
    assert orig["empty_rate"] == pytest.approx(0.5) and relay["empty_rate"] == pytest.approx(0.0)
    assert orig["first_token_eos_prob"] == pytest.approx(0.5) and relay["first_token_eos_prob"] == pytest.approx(0.1)
    assert orig["accuracy"] == pytest.approx(0.25) and relay["accuracy"] == pytest.approx(0.75)
    assert orig["accuracy_nonempty"] == pytest.approx(0.5)  # r2 right, r3 wrong
    assert relay["accuracy_nonempty"] == pytest.approx(0.75)
    assert relay["accuracy_delta"] == pytest.approx(0.5) and relay["empty_rate_delta"] == pytest.approx(-0.5)
    assert relay["accuracy_nonempty_delta"] == pytest.approx(0.0)  # pairs where both answered: r2 (1,1), r3 (0,0)
    assert math.isnan(orig["accuracy_delta"])


def test_old_runs_without_the_probability_are_named():
    tables = _tables()
    tables["answers"] = tables["answers"].assign(first_token_eos_prob=np.nan)
    assert "first_token_eos_prob" in needs_answering(tables)
    assert needs_answering(_tables()) is None


def test_runner_records_the_first_token_end_probability(tmp_path):
    """Every answer row carries the probability the final question token gives the end-of-answer ids; recomputed
    here from an independent question pass (run_condition) for one row."""
    import torch

    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import generate_records, write_records
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import ExperimentSpec
    from relaylens.generation.rows import default_eos_ids
    from relaylens.generation.single import run_condition
    from relaylens.model.prefill import prefill_history
    from relaylens.results.store import load_tables
    from relaylens.selectors import make_selector
    from relaylens.testing import tiny_model, tiny_tokenizer

    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    data = write_records(generate_records(2, seed=5, history_tokens=900), tmp_path / "d.json")
    spec = ExperimentSpec("t", selectors=("streaming",), budgets=(0.25,), conditions=("original", "relay"),
                          limit=2, max_new_tokens=2, prompt_mode="chat", protect_instructions=False)
    run = run_analysis(spec, RunConfig(data=str(data), out=str(tmp_path / "run")), progress=False,
                       model_and_tokenizer=(model, tok))
    answers = load_tables(run)["answers"]
    assert answers["first_token_eos_prob"].between(0, 1).all()
    record = load_records(data)[0]
    prompt = render_prompt(record, tok, mode="chat")
    prefill = prefill_history(model, prompt.history_ids, window_size=32)
    sel = make_selector("streaming").select(prefill, prompt, 0.25)
    out = run_condition(model, prefill, sel, "relay", prompt.question_ids, max_new_tokens=0)
    expected = torch.softmax(out.last_logits.double(), -1)[sorted(default_eos_ids(model, tok))].sum().item()
    got = answers[(answers.record_id == record.record_id) & (answers.condition == "relay")]["first_token_eos_prob"]
    assert float(got.iloc[0]) == pytest.approx(expected, rel=1e-6)
