"""BM25 unit retrieval: pinned scoring, whole units, first-fit into the budget, recency ties, granularity errors."""

from __future__ import annotations

import math
import re

import pytest
import torch

from relaylens.datasets.spans import RenderedPrompt, Span
from relaylens.errors import BudgetError, RecordError, RelaylensError, ShapeError
from relaylens.selectors import BM25
from relaylens.selectors.bm25 import bm25_scores, word_tokens
from relaylens.selectors.synthetic import random_prefill

# (session id, [(role, text), ...]); token length of a turn = 10 per turn, plus a 6-token session header
SESSIONS = [
    ("a", [("user", "I took my dog Biscuit to the park"), ("assistant", "Parks are great for a Vizsla")]),
    ("b", [("user", "What should I cook tonight"), ("assistant", "Try pasta with a dog-friendly sauce")]),
    ("c", [("user", "Biscuit my dog loves the beach"), ("assistant", "Beaches are fun"), ("user", "yes")]),
    ("d", [("user", "Book a train to Rome"), ("assistant", "Done")]),
]
PREFIX, HEADER, TURN = 12, 6, 10



def make_prompt(sessions=SESSIONS, question="What is the name of my dog?", with_turns=True) -> RenderedPrompt:
    spans, turns, pos = [], [], PREFIX
    for si, (sid, msgs) in enumerate(sessions):
        start = pos
        pos += HEADER
        for role, text in msgs:
            turns.append(Span("turn", len(turns), sid, pos, pos + TURN, False, role, text))
            pos += TURN
        spans.append(Span("session", si, sid, start, pos, False, None, "\n".join(f"{r}: {t}" for r, t in msgs)))
    ids = torch.zeros(pos, dtype=torch.long)
    return RenderedPrompt("rec", ids, torch.zeros(4, dtype=torch.long), "", "", question, tuple(spans),
                          tuple(turns) if with_turns else ())


def prefill_for(prompt: RenderedPrompt):
    return random_prefill(length=prompt.history_length, num_layers=3, num_kv_heads=2, window=8)


def lucene_bm25(query: list[str], docs: list[list[str]], k1=1.5, b=0.75) -> list[float]:
    """Written-out Lucene BM25 (what bm25s computes): idf = ln(1 + (N - df + .5)/(df + .5)) and, as Lucene >= 8, no
    (k1 + 1) factor in the term weight (a constant that does not change the ranking)."""
    n, avg = len(docs), sum(len(d) for d in docs) / len(docs)
    out = []
    for d in docs:
        s = 0.0
        for t in query:
            df = sum(1 for x in docs if t in x)
            if df == 0:
                continue
            tf = d.count(t)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            s += idf * tf / (tf + k1 * (1 - b + b * len(d) / avg))
        out.append(s)
    return out


def test_word_tokens_lowercase_keeps_short_words_and_stopwords():
    assert word_tokens("My DOG's name is Biscuit, a Vizsla!") == ["my", "dog", "s", "name", "is", "biscuit", "a",
                                                                  "vizsla"]


def test_scores_match_written_out_lucene_bm25():
    prompt = make_prompt()
    texts = [s.text for s in prompt.sessions]
    got = bm25_scores(prompt.question, texts).tolist()
    want = lucene_bm25(word_tokens(prompt.question), [word_tokens(t) for t in texts])
    assert got == pytest.approx(want, rel=1e-5)
    assert got[0] > 0 and got[2] > 0  # sessions mentioning "my dog"
    # k1 and b are really used
    assert bm25_scores(prompt.question, texts, k1=0.5).tolist() != pytest.approx(got)


def test_whole_sessions_first_fit_within_budget():
    prompt = make_prompt()
    pre = prefill_for(prompt)
    scores = bm25_scores(prompt.question, [s.text for s in prompt.sessions]).tolist()
    sizes = [s.length for s in prompt.sessions]  # [26, 26, 36, 26]
    for budget in (26, 40, 62, 70, 100, pre.history_length):
        sel = BM25().select(pre, prompt, budget)
        k = min(budget, pre.history_length)
        # reference first-fit over (score desc, recency)
        order = sorted(range(4), key=lambda i: (-scores[i], -i))
        chosen, used = [], 0
        for i in order:
            if used + sizes[i] <= k:
                chosen.append(i)
                used += sizes[i]
        assert sel.info["units_kept"] == sorted(chosen)
        want = [p for i in sorted(chosen) for p in range(prompt.sessions[i].start, prompt.sessions[i].end)]
        assert sel.positions[0, 0][sel.valid[0, 0]].tolist() == want
        assert sel.counts.max() <= k
        assert (sel.positions == sel.positions[:1, :1]).all() and (sel.valid == sel.valid[:1, :1]).all()
        for i in chosen:
            span = prompt.sessions[i]
            in_span = (sel.positions[0, 0] >= span.start) & (sel.positions[0, 0] < span.end) & sel.valid[0, 0]
            assert int(in_span.sum()) == span.length  # whole unit
            assert torch.allclose(sel.scores[0, 0][in_span], torch.tensor(scores[i]))


def test_skips_a_unit_that_does_not_fit_and_continues():
    prompt = make_prompt()
    sel = BM25().select(prefill_for(prompt), prompt, 62)
    # session c (36 tokens, best) + a (26) = 62 fit; nothing else
    assert sel.info["units_kept"] == [0, 2]
    sel = BM25().select(prefill_for(prompt), prompt, 61)
    # c (36) fits, a (26) would overflow: skipped, then b and d (26 each) do not fit either -> only c
    assert sel.info["units_kept"] == [2]


def test_ties_broken_by_recency():
    same = [("x", [("user", "dog")]), ("y", [("user", "dog")]), ("z", [("user", "cat")])]
    prompt = make_prompt(same, question="dog")
    sel = BM25(fill_zero_score=False).select(prefill_for(prompt), prompt, 16)
    assert sel.info["units_kept"] == [1]  # equal scores: the later session wins


def test_zero_score_fill_rule():
    prompt = make_prompt()
    with_fill = BM25().select(prefill_for(prompt), prompt, 1.0)
    without = BM25(fill_zero_score=False).select(prefill_for(prompt), prompt, 1.0)
    scores = bm25_scores(prompt.question, [s.text for s in prompt.sessions])
    assert with_fill.info["units_kept"] == [0, 1, 2, 3]
    assert without.info["units_kept"] == [i for i in range(4) if scores[i] > 0]


def test_user_only_indexing_changes_what_is_indexed():
    sessions = [("a", [("user", "hello there"), ("assistant", "your dog Rex is cute")]),
                ("b", [("user", "my dog likes walks"), ("assistant", "ok")])]
    prompt = make_prompt(sessions, question="dog Rex")
    pre = prefill_for(prompt)
    assert BM25(fill_zero_score=False).select(pre, prompt, 26).info["units_kept"] == [0]
    assert BM25(indexed_text="user", fill_zero_score=False).select(pre, prompt, 26).info["units_kept"] == [1]
    assert BM25(indexed_text="user").unit_texts(prompt, prompt.sessions) == ["hello there", "my dog likes walks"]


def test_turn_granularity():
    prompt = make_prompt()
    sel = BM25(granularity="turn", fill_zero_score=False).select(prefill_for(prompt), prompt, 20)
    kept = [t for t in prompt.turns if t.index in sel.info["units_kept"]]
    assert len(kept) == 2 and all(re.search("dog", t.text) for t in kept)
    user_only = BM25(granularity="turn", indexed_text="user").unit_texts(prompt, prompt.turns)
    assert all(text == "" for text, t in zip(user_only, prompt.turns) if t.role == "assistant")


def test_keep_prefix_counts_in_budget():
    prompt = make_prompt()
    sel = BM25(keep_prefix=True).select(prefill_for(prompt), prompt, 12 + 36)
    p = sel.positions[0, 0][sel.valid[0, 0]].tolist()
    assert p[:PREFIX] == list(range(PREFIX)) and len(p) == 48 and sel.info["units_kept"] == [2]


def test_bad_inputs():
    prompt = make_prompt()
    pre = prefill_for(prompt)
    with pytest.raises(RecordError, match="no turn spans"):
        BM25(granularity="turn").select(pre, make_prompt(with_turns=False), 0.5)
    with pytest.raises(RecordError, match="needs turn spans"):
        BM25(indexed_text="user").select(pre, make_prompt(with_turns=False), 0.5)
    with pytest.raises(RecordError, match="prompt=None"):
        BM25().select(pre, None, 0.5)
    with pytest.raises(BudgetError, match="fits no whole session"):
        BM25(granularity="session").select(pre, prompt, 20)
    with pytest.raises(ShapeError, match="tokens but the prefill has"):
        BM25().select(random_prefill(length=50, window=8), prompt, 0.5)
    with pytest.raises(RecordError, match="shares a word"):
        BM25(fill_zero_score=False).select(pre, make_prompt(question="zebra quantum"), 0.5)
    with pytest.raises(RelaylensError, match="granularity"):
        BM25(granularity="round")
    with pytest.raises(BudgetError):
        BM25().select(pre, prompt, 1.5)


def _kept(sel) -> list[int]:
    return sel.positions[0, 0][sel.valid[0, 0]].tolist()


def test_truncate_never_skips_the_top_ranked_session():
    prompt = make_prompt()
    pre = prefill_for(prompt)
    # budget 30: session c (36 tokens) ranks first and does not fit; first-fit drops it for a (26 tokens)
    assert BM25().select(pre, prompt, 30).info["units_kept"] == [0]
    sel = BM25(packing="truncate").select(pre, prompt, 30)
    c = prompt.sessions[2]
    assert sel.info["units_kept"] == [2] and sel.info["truncated_unit"] == 2
    kept = _kept(sel)
    assert len(kept) == 30 and all(c.start <= p < c.end for p in kept)
    # inside c: turns ranked by turn-level BM25 (written-out reference), whole while they fit, then leading tokens
    turns = [t for t in prompt.turns if t.session_id == "c"]
    turn_scores = lucene_bm25(word_tokens(prompt.question), [word_tokens(t.text) for t in prompt.turns])
    score = {t.start: turn_scores[t.index] for t in prompt.turns}
    ranked = sorted(turns, key=lambda t: (-score[t.start], -t.start))
    want, room = [], 30
    for t in ranked:
        take = min(t.length, room)
        want += range(t.start, t.start + take)
        room -= take
        if not room:
            break
    assert kept == sorted(want)


def test_truncate_keeps_whole_units_that_fit_and_leading_tokens_of_a_turn():
    prompt = make_prompt()
    pre = prefill_for(prompt)
    # 40: c (36) whole, then a (26) crosses: 4 tokens of a's best turn
    sel = BM25(packing="truncate").select(pre, prompt, 40)
    assert sel.info["units_kept"] == [0, 2] and len(_kept(sel)) == 40
    # turn units (10 tokens each), budget 15: the best turn whole, then the leading 5 tokens of the second best
    turn_scores = lucene_bm25(word_tokens(prompt.question), [word_tokens(t.text) for t in prompt.turns])
    first, second = sorted(range(len(prompt.turns)), key=lambda i: (-turn_scores[i], -i))[:2]
    sel = BM25(granularity="turn", packing="truncate").select(pre, prompt, 15)
    assert sel.info["units_kept"] == sorted([first, second]) and sel.info["truncated_unit"] == second
    a, b = prompt.turns[first], prompt.turns[second]
    assert _kept(sel) == sorted(list(range(a.start, a.end)) + list(range(b.start, b.start + 5)))
    with pytest.raises(RelaylensError, match="packing"):
        BM25(packing="squeeze")
