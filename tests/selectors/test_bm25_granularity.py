"""BM25's default granularity (issue 54, item 1): whole sessions when one fits the budget, else turns, per record;
the selection names the unit it used, the manifest the rule; and oracle-like records run with no selector option."""

from __future__ import annotations

import json

import pytest
import torch

from relaylens.datasets.spans import RenderedPrompt, Span
from relaylens.errors import BudgetError
from relaylens.experiments.specs import ExperimentSpec
from relaylens.selectors import BM25, make_selector
from relaylens.selectors.bm25 import AUTO_RULE
from relaylens.selectors.synthetic import random_prefill

PREFIX, HEADER = 12, 6
TEXTS = [("user", "my dog Biscuit loves the park"), ("assistant", "parks are fun"), ("user", "we cook pasta"),
         ("assistant", "pasta is good"), ("user", "my dog eats biscuits"), ("assistant", "dogs like treats")]


def make_prompt(turn_tokens: int, sessions: int = 3, turns_per_session: int = 2) -> RenderedPrompt:
    """``sessions`` sessions of a header and ``turns_per_session`` turns of ``turn_tokens`` tokens each."""
    spans, turns, pos = [], [], PREFIX
    for si in range(sessions):
        start = pos
        pos += HEADER
        texts = []
        for ti in range(turns_per_session):
            role, text = TEXTS[(si * turns_per_session + ti) % len(TEXTS)]
            turns.append(Span("turn", len(turns), f"s{si}", pos, pos + turn_tokens, False, role, text))
            texts.append(f"{role}: {text}")
            pos += turn_tokens
        spans.append(Span("session", si, f"s{si}", start, pos, False, None, "\n".join(texts)))
    return RenderedPrompt("rec", torch.zeros(pos, dtype=torch.long), torch.zeros(4, dtype=torch.long), "", "",
                          "What does my dog love?", tuple(spans), tuple(turns))


def _same(a, b) -> bool:
    return torch.equal(a.positions, b.positions) and torch.equal(a.valid, b.valid)


def test_default_is_auto_and_recorded_in_the_class():
    assert BM25().granularity == "auto" and make_selector("bm25").granularity == "auto"


def test_auto_ranks_sessions_when_one_fits():
    prompt = make_prompt(turn_tokens=10)  # sessions of 26 tokens, history 90
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    auto = BM25().select(pre, prompt, 30)
    session = BM25(granularity="session").select(pre, prompt, 30)
    assert _same(auto, session)
    assert auto.info["granularity"] == "session" and auto.info["granularity_rule"] == "auto"
    assert session.info["granularity_rule"] == "session"


def test_auto_falls_back_to_turns_when_no_session_fits():
    prompt = make_prompt(turn_tokens=40)  # sessions of 86 tokens, turns of 40, history 270: 20% = 54 tokens
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    with pytest.raises(BudgetError, match="fits no whole session"):
        BM25(granularity="session").select(pre, prompt, 0.2)  # the old default: every such record skipped
    auto = BM25().select(pre, prompt, 0.2)
    assert auto.info["granularity"] == "turn" and auto.info["granularity_rule"] == "auto"
    assert _same(auto, BM25(granularity="turn").select(pre, prompt, 0.2))


def test_fallback_keeps_whole_turns_within_the_budget():
    prompt = make_prompt(turn_tokens=20)  # sessions of 46 tokens, turns of 20, history 150
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    sel = BM25(fill_zero_score=False).select(pre, prompt, 0.3)  # K = 45: no session, two turns
    assert sel.info["granularity"] == "turn" and sel.info["budget"] == 45
    kept = sel.positions[0, 0][sel.valid[0, 0]]
    assert kept.numel() == 40 and sel.info["units_kept"] == [0, 4]  # the two "my dog" turns, whole
    assert all(prompt.turns[i].start in kept.tolist() for i in sel.info["units_kept"])


def test_turns_that_do_not_fit_either_say_so():
    prompt = make_prompt(turn_tokens=40)
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    with pytest.raises(BudgetError, match="fits no whole turn .*packing=truncate"):
        BM25(granularity="turn").select(pre, prompt, 20)


def test_auto_cuts_the_top_turn_when_no_whole_turn_fits():
    """auto's last resort (a short history's 10% holds no whole real turn): the top-ranked turn's leading tokens,
    exactly the budget, as packing=truncate keeps them; the selection names the packing it used."""
    prompt = make_prompt(turn_tokens=40)
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    auto = BM25(fill_zero_score=False).select(pre, prompt, 20)
    explicit = BM25(granularity="turn", packing="truncate", fill_zero_score=False).select(pre, prompt, 20)
    assert auto.info["granularity"] == "turn" and auto.info["packing"] == "truncate"
    assert torch.equal(auto.positions, explicit.positions) and int(auto.counts.max()) == 20
    top = prompt.turns[auto.info["units_kept"][0]]
    assert auto.positions[0, 0][auto.valid[0, 0]].tolist() == list(range(top.start, top.start + 20))
    assert "packing" not in BM25(fill_zero_score=False).select(pre, prompt, 45).info  # a whole turn fits: no cut


def test_auto_counts_a_kept_prefix_against_the_room_for_sessions():
    prompt = make_prompt(turn_tokens=10)  # sessions of 26 tokens after a 12-token prefix
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    assert BM25().resolve_granularity(prompt, 30) == "session"
    assert BM25(keep_prefix=True).resolve_granularity(prompt, 30) == "turn"  # 30 - 12 = 18 < 26
    assert BM25(keep_prefix=True).select(pre, prompt, 30).info["granularity"] == "turn"


def test_explicit_granularities_are_left_alone():
    prompt = make_prompt(turn_tokens=40)
    assert BM25(granularity="session").resolve_granularity(prompt, 10) == "session"
    assert BM25(granularity="turn").resolve_granularity(make_prompt(turn_tokens=10), 1000) == "turn"


def test_the_manifest_records_the_rule_only_for_auto():
    base = ExperimentSpec("x", selectors=("bm25", "snapkv"), budgets=(0.1,), conditions=("original",))
    assert base.to_dict()["regime"]["bm25_units"] == AUTO_RULE
    auto = base.replace(selector_options={"bm25": {"granularity": "auto"}})
    assert auto.to_dict()["regime"]["bm25_units"] == AUTO_RULE
    for fixed in ({"bm25": {"granularity": "turn"}}, {"bm25": {"granularity": "session", "k1": 1.2}}):
        assert "bm25_units" not in base.replace(selector_options=fixed).to_dict()["regime"]
    assert "bm25_units" not in base.replace(selectors=("snapkv",)).to_dict()["regime"]


def test_oracle_records_run_with_no_selector_option(tmp_path):
    """The issue's case at tiny scale: records holding only their evidence session (LongMemEval oracle), whose budget
    fits no whole session, run with plain ``bm25`` and answer every record. (25%: these sessions have 4-6 turns, so
    that a turn fits as it does at 10% of a real oracle history.)"""
    from relaylens.datasets import bundled_sample_path, load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    records = []
    for r in json.loads(bundled_sample_path().read_text())[:3]:
        keep = [i for i, sid in enumerate(r["haystack_session_ids"]) if sid in r["answer_session_ids"]]
        records.append({**r, **{k: [r[k][i] for i in keep] for k in ("haystack_session_ids", "haystack_dates",
                                                                     "haystack_sessions")}})
    data = tmp_path / "oracle.json"
    data.write_text(json.dumps(records))
    spec = load_analysis("coordinate_ablation").spec.replace(selectors=("bm25",), budgets=(0.25,),
                                                             conditions=("original", "relay"), max_new_tokens=2)
    assert "bm25" not in spec.selector_options
    out = run_analysis(spec, RunConfig(model="tiny", data=str(data), out=str(tmp_path / "run"), window_size=8),
                       progress=False, model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    tables = load_tables(out)
    assert tables["skipped"].empty, tables["skipped"].to_dict("records")
    assert sorted(tables["answers"].record_id.unique()) == sorted(r["question_id"] for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["spec"]["regime"]["bm25_units"] == AUTO_RULE
    prompt = render_prompt(load_records(data)[0], tiny_tokenizer(), mode="completion")
    pre = random_prefill(length=prompt.history_length, num_layers=2, num_kv_heads=2, window=8)
    with pytest.raises(BudgetError, match="fits no whole session"):  # the old default on the same records
        BM25(granularity="session").select(pre, prompt, 0.25)
