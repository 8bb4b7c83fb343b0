"""Synthetic generator: determinism, schema round trip, answerability from evidence only, length targeting."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime

import pytest

from relaylens.datasets import load_records
from relaylens.datasets import synthetic_text as tx
from relaylens.datasets.longmemeval import QUESTION_TYPES
from relaylens.datasets.synthetic import (
    approx_token_count,
    bundled_sample_path,
    generate_records,
    generate_worlds,
    make_token_counter,
    synth_command,
)
from relaylens.datasets.synthetic_kinds import KINDS, Fact, Query, resolve
from relaylens.testing import tiny_tokenizer

N = 42  # six of each kind, every kind at every depth twice


@pytest.fixture(scope="module")
def worlds():
    return generate_worlds(N, seed=11, history_tokens=1500)


def test_deterministic_per_seed(worlds):
    again = generate_records(N, seed=11, history_tokens=1500)
    assert json.dumps([w.record for w in worlds]) == json.dumps(again)
    other = generate_records(7, seed=12, history_tokens=1500)
    assert json.dumps(other) != json.dumps(again[:7])


def test_round_trips_through_the_longmemeval_reader(worlds, tmp_path):
    path = tmp_path / "synth.json"
    path.write_text(json.dumps([w.record for w in worlds]))
    records = load_records(path)  # auto-detected as LongMemEval
    assert len(records) == N
    for w, rec in zip(worlds, records):
        assert rec.record_id == w.record["question_id"] and rec.source == "longmemeval"
        assert set(rec.evidence_session_ids) == set(w.evidence_ids) and rec.has_evidence_annotations
        assert rec.is_abstention == (w.kind == "abstention")


def test_every_kind_and_depth_appears(worlds):
    assert Counter(w.kind for w in worlds) == {k: N // len(KINDS) for k in KINDS}
    assert {w.record["question_type"] for w in worlds} == set(QUESTION_TYPES)
    assert Counter((w.kind, w.depth) for w in worlds) == {(k, d): 2 for k in KINDS for d in ("early", "middle", "late")}
    assert any(isinstance(w.record["answer"], int) for w in worlds)  # bare JSON numbers, like the real files


def test_id_date_and_label_conventions(worlds):
    for w in worlds:
        r = w.record
        assert re.fullmatch(r"(gpt4_)?[0-9a-f]{8}(_abs)?", r["question_id"])
        assert r["question_id"].endswith("_abs") == (w.kind == "abstention")
        ev = r["answer_session_ids"]
        pattern = r"answer_[0-9a-f]{8}" if len(ev) == 1 else r"answer_[0-9a-f]{8}_\d"
        assert all(re.fullmatch(pattern, s) for s in ev)
        for sid, session in zip(r["haystack_session_ids"], r["haystack_sessions"]):
            if sid in ev:
                assert all("has_answer" in t for t in session if t["role"] == "user")
                assert any(t.get("has_answer") for t in session)
            else:
                assert re.fullmatch(r"[0-9a-f]{8}_\d|sharegpt_[A-Za-z0-9]{7}_\d|ultrachat_\d{6}", sid)
                assert not any("has_answer" in t for t in session)
        dates = [datetime.strptime(d, "%Y/%m/%d (%a) %H:%M") for d in r["haystack_dates"]]
        assert dates == sorted(dates) and len(set(dates)) == len(dates)  # sorted by time, like _s
        assert [d.strftime("%Y/%m/%d (%a) %H:%M") for d in dates] == r["haystack_dates"]
        assert datetime.strptime(r["question_date"], "%Y/%m/%d (%a) %H:%M") > dates[-1]
        if w.kind == "knowledge-update":
            assert r["haystack_session_ids"].index(ev[0]) < r["haystack_session_ids"].index(ev[1])


def test_answer_comes_from_evidence_alone_and_no_single_filler(worlds):
    for w in worlds:
        answer = w.record["answer"]
        from_evidence = w.resolve_over(w.evidence_ids)
        if w.kind == "abstention":
            assert from_evidence is None and w.resolve_over(w.record["haystack_session_ids"]) is None
            continue
        assert from_evidence is not None
        assert str(from_evidence) in str(answer)  # the answer (or the preference rubric) is the computed value
        for sid in w.filler_ids:
            assert w.resolve_over([sid]) != from_evidence
        if w.query.op in ("sum", "days_between", "first_of") and len(w.evidence_ids) > 1:
            for sid in w.evidence_ids:  # partial evidence is not enough
                assert w.resolve_over([sid]) != from_evidence
        if w.query.op == "latest":  # the old value alone gives a stale answer
            assert w.resolve_over(w.evidence_ids[:1]) not in (None, from_evidence)


def test_facts_are_stated_by_the_text(worlds):
    for w in worlds:
        sessions = dict(zip(w.record["haystack_session_ids"], w.record["haystack_sessions"]))
        for sid, facts in w.session_facts.items():
            text = "\n".join(t["content"] for t in sessions[sid])
            for fact in facts:
                assert str(fact.value) in text, (sid, fact)


def test_distractors_and_near_misses(worlds):
    for w in worlds:
        sessions = dict(zip(w.record["haystack_session_ids"], w.record["haystack_sessions"]))
        filler_text = "\n".join(t["content"] for sid in w.filler_ids for t in sessions[sid])
        all_text = "\n".join(t["content"] for s in w.record["haystack_sessions"] for t in s)
        if w.kind == "abstention":
            assert w.banned and not tx.words_in(all_text, w.banned)
            continue
        filler_facts = [f for sid in w.filler_ids for f in w.session_facts[sid]]
        slot_family = w.query.slots[0].split(":")[0]
        assert any(f.slot.split(":")[0].startswith(slot_family) or f.slot.startswith(slot_family)
                   for f in filler_facts) \
            or w.query.op.startswith("days") or w.query.op == "first_of", w.query  # same-category distractors
        if w.query.op == "lookup":
            assert str(w.resolve_over(w.evidence_ids)) not in filler_text
        if w.query.op == "latest":  # the stale value is repeated in filler, the new value appears once
            slot = w.query.slots[0]
            old = next(f.value for f in w.session_facts[w.evidence_ids[0]] if f.slot == slot)
            assert filler_text.count(str(old)) >= 2


def test_no_context_baseline_is_near_chance():
    """Most frequent answer per question type, fitted on one seed, scored on another: near zero."""
    fit = generate_records(70, seed=5, history_tokens=1500)
    held_out = generate_records(70, seed=6, history_tokens=1500)
    by_type: dict[str, Counter] = {}
    for r in fit:
        by_type.setdefault(r["question_type"], Counter())[str(r["answer"])] += 1
    guess = {t: c.most_common(1)[0][0] for t, c in by_type.items()}
    accuracy = sum(guess[r["question_type"]] == str(r["answer"]) for r in held_out) / len(held_out)
    assert accuracy <= 0.10, accuracy
    # and no answer dominates its type in either set
    for r_set in (fit, held_out):
        for t in guess:
            answers = Counter(str(r["answer"]) for r in r_set if r["question_type"] == t)
            assert answers.most_common(1)[0][1] <= max(2, 0.35 * sum(answers.values())), (t, answers)


@pytest.mark.parametrize("tokenizer,target", [(None, 1500), (None, 4000), ("tiny", 8000)])
def test_history_hits_the_token_target(tokenizer, target):
    tok = tiny_tokenizer() if tokenizer == "tiny" else None
    counter = make_token_counter(tok)
    for w in generate_worlds(7, seed=2, history_tokens=target, token_count=tok):
        from relaylens.datasets.longmemeval import parse_record
        from relaylens.datasets.prompting import layout_prompt

        rec = parse_record(w.record, "<synthetic>", "x")
        measured = counter(layout_prompt(rec, "completion").history_text)
        assert measured == w.history_tokens
        assert abs(measured - target) <= 0.05 * target


def test_small_target_is_a_clear_error():
    with pytest.raises(ValueError, match="history_tokens=50 is too small"):
        generate_records(4, seed=0, history_tokens=50)


def test_resolve_ops():
    d1, d2, q = datetime(2023, 5, 1), datetime(2023, 5, 4), datetime(2023, 5, 11)
    s1 = (d1, [Fact("user", "event:a", "a"), Fact("user", "job", "X")])
    s2 = (d2, [Fact("user", "event:b", "b"), Fact("user", "job", "Y"), Fact("other", "job", "Z")])
    assert resolve(Query("latest", ("job",)), [s1, s2], q) == "Y"
    assert resolve(Query("days_ago", ("event:a",)), [s1, s2], q) == 10
    assert resolve(Query("days_between", ("event:a", "event:b")), [s1, s2], q) == 3
    assert resolve(Query("first_of", ("event:b", "event:a")), [s2, s1], q) == "a"
    assert resolve(Query("lookup", ("job",)), [s1, s2], q) is None  # ambiguous
    assert resolve(Query("absent", ("job",)), [s1, s2], q) is None


def test_counters_and_command(tmp_path):
    assert approx_token_count("I picked up 12 mugs.\n") == 7
    assert make_token_counter(len)("abc") == 3
    out = synth_command(n=3, seed=4, history_tokens=900, tokenizer=None, out=tmp_path / "s.json")
    assert load_records(out)[0].record_id == generate_records(3, 4, 900)[0]["question_id"]
    assert out.read_text().endswith("\n")


def test_bundled_sample_loads_and_is_reproducible(tmp_path):
    path = bundled_sample_path()
    records = load_records(path)
    assert 20 <= len(records) <= 30
    assert {r.question_type for r in records} == set(QUESTION_TYPES) and any(r.is_abstention for r in records)
    models = pytest.importorskip("relaylens.model.embedded")
    if not models.is_pulled("smollm2-135m-instruct"):
        pytest.skip("SmolLM2 tokenizer not pulled; `relaylens model pull` to check the sample byte for byte")
    from relaylens.datasets.synthetic import SAMPLE_ARGS, write_records
    from relaylens.model.loading import load_tokenizer

    regenerated = generate_records(SAMPLE_ARGS["n"], SAMPLE_ARGS["seed"], SAMPLE_ARGS["history_tokens"],
                                   token_count=load_tokenizer(SAMPLE_ARGS["tokenizer"]))
    tmp = write_records(regenerated, tmp_path / "sample_check.json")
    assert tmp.read_bytes() == path.read_bytes()
