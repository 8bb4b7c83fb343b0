"""The TransformerLens export, issue 52: it selects as ``relaylens run`` does (framing protected by default, item 9),
runs the selectors that need more than window queries (H2O's column sums, Scissorhands' query window) and takes
``NAME:key=value`` selectors (item 15), and exports CircuitsVis's current ``attention_heads`` (item 22)."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from relaylens.integrations.tl_export import record_activations
from relaylens.testing import tiny_model, tiny_tokenizer

pytest.importorskip("transformer_lens.model_bridge")


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    from relaylens.datasets import load_records
    from relaylens.datasets.synthetic import generate_records

    data = tmp_path_factory.mktemp("tl_round5") / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=0, history_tokens=800)))
    return load_records(data)[0]


def _run_selection(model, tokenizer, record, selector: str, budget: float, protect: bool):
    """The selection ``relaylens run`` makes for this record: its own prefill and unit selection code, with the
    run's defaults (``RunConfig``) and the analysis's framing setting."""
    from relaylens.datasets.prompting import render_prompt
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.units import prefill_record, select_units
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.selectors import make_selector

    prompt = render_prompt(record, tokenizer, mode="completion")
    chosen = make_selector(selector)
    prefill = prefill_record(model, prompt, RunConfig(), [chosen])
    prepared = {selector: chosen.prepare(model, prefill, prompt, RotaryFactors.from_model(model))}
    units, too_short = select_units(prefill, prompt, [(selector, budget)], prepared, protect)
    assert not too_short
    return units[0].selection


def test_the_export_of_a_run_record_shows_the_runs_selection(record):
    """Before the fix the export always evicted the framing: another selection (and M) than the run's."""
    from relaylens.analyses.coordinate_ablation import ANALYSIS

    assert ANALYSIS.spec.protect_instructions  # the run's default: the paper's regime
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    expected = _run_selection(model, tokenizer, record, "snapkv", 0.1, protect=True)
    run = record_activations(model, tokenizer, record, selector="snapkv", budget=0.1, condition="relay")
    assert torch.equal(run.selection.counts, expected.counts)
    assert torch.equal(run.selection.positions[run.selection.valid], expected.positions[expected.valid])
    assert run.question_positions[0].item() == expected.max_count  # M as the run has it
    evicted = record_activations(model, tokenizer, record, selector="snapkv", budget=0.1, condition="relay",
                                 protect_instructions=False)
    reference = _run_selection(model, tokenizer, record, "snapkv", 0.1, protect=False)
    assert torch.equal(evicted.selection.positions[evicted.selection.valid], reference.positions[reference.valid])
    assert not torch.equal(evicted.selection.counts, expected.counts) or not torch.equal(
        evicted.selection.positions[evicted.selection.valid], expected.positions[expected.valid])


@pytest.mark.parametrize("selector", ["h2o", "scissorhands", "h2o:recent_size=4", "scissorhands:recent=2"])
def test_selectors_with_their_own_prefill_needs_and_options(record, selector):
    """H2O needs column sums, Scissorhands a query window; both failed, and NAME:key=value was 'unknown'."""
    from relaylens.selectors.arguments import parse_selector_arg

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    run = record_activations(model, tokenizer, record, selector=selector, budget=0.2, condition="relay")
    name = parse_selector_arg(selector)[0]
    expected = _run_selection(model, tokenizer, record, name, 0.2, protect=True) if ":" not in selector else None
    if expected is not None:
        assert torch.equal(run.selection.positions[run.selection.valid], expected.positions[expected.valid])
    assert run.question_positions[0].item() == run.selection.max_count
    assert len(run.attention_export(layer=1, kv_head=0).labels) == int(run.selection.counts[1, 0])


def test_a_selector_option_is_applied_and_a_bad_one_refused(record):
    from relaylens.errors import RelaylensError

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    small, large = (record_activations(model, tokenizer, record, selector=f"streaming:n_sink={sink}", budget=0.2,
                                       protect_instructions=False)  # the framing would hold the first tokens anyway
                    for sink in (1, 8))
    assert not torch.equal(small.selection.positions, large.selection.positions)
    with pytest.raises(RelaylensError, match="has no hyperparameter"):
        record_activations(model, tokenizer, record, selector="snapkv:bogus=1")


def test_the_circuitsvis_export_targets_attention_heads(record):
    """``attention_heads`` (CircuitsVis's current view) renders every query head, one head too; the superseded
    ``attention_patterns`` is not exported; ``attention_pattern`` (one head) still renders."""
    circuitsvis = pytest.importorskip("circuitsvis")
    from circuitsvis.attention import attention_heads, attention_pattern

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    run = record_activations(model, tokenizer, record, selector="snapkv", budget=0.2, condition="relay")
    view = run.attention_export(layer=1, kv_head=1)
    assert not hasattr(view, "attention_patterns")
    every, one = view.attention_heads(), view.attention_heads(head=view.q_heads[1])
    accepted = set(inspect.signature(attention_heads).parameters)
    assert set(every) <= accepted and set(one) <= accepted
    assert len(every["attention"]) == len(view.q_heads) and len(one["attention"]) == 1
    assert one["attention"][0][-1][:-1] == view.weights(view.q_heads[1])
    assert one["attention_head_names"] == [f"L1H{view.q_heads[1]}"]
    for function, kwargs in ((attention_heads, every), (attention_heads, one), (attention_pattern,
                                                                                 view.attention_pattern())):
        html = function(**kwargs).local_src
        assert json.dumps(view.labels[0]) in html, circuitsvis.__version__


def test_a_learned_geometry_is_checked_as_the_run_checks_it(record, tmp_path):
    """Item 8: the export ran any learned geometry whose layer and head counts fit."""
    from relaylens.errors import RelaylensError
    from relaylens.model.loading import model_fingerprint

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    fit = {"selector": "snapkv", "budget": 0.2, "selector_options": {}, "protect_instructions": True,
           "prompt_mode": "completion", "granularity": "turn", "window_mode": "condition"}
    doc = {"format": 2, "parameters": {"b": 1.0, "s": 0.9, "alpha": 1.0}, "num_layers": 2, "num_kv_heads": 2,
           "model": {"spec": "tiny", "weights_hash": model_fingerprint(model)}, "selector": "snapkv", "budget": 0.2,
           "fit": fit, "train_records": ["x"], "test_records": ["y"]}
    (tmp_path / "learned_geometry.json").write_text(json.dumps(doc))
    condition = f"learned:{tmp_path}"
    run = record_activations(model, tokenizer, record, selector="snapkv", budget=0.2, condition=condition)
    assert run.condition == condition
    for kwargs, field in (({"budget": 0.1}, "budget"), ({"protect_instructions": False}, "protect_instructions"),
                          ({"granularity": "session"}, "granularity"), ({"selector": "snapkv:window=8"},
                                                                         "selector_options")):
        with pytest.raises(RelaylensError, match=f"fitted under other settings: {field}"):
            record_activations(model, tokenizer, record, **({"selector": "snapkv", "budget": 0.2} | kwargs),
                               condition=condition)
    with pytest.raises(RelaylensError, match="was learned on model"):
        record_activations(tiny_model("llama", seed=1), tokenizer, record, budget=0.2, condition=condition)
