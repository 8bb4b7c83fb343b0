"""Scissorhands against a brute-force reference from the full eager attention matrix, and its budget arithmetic.

The tiny Llama runs the history twice: once through :func:`prefill_history` (sdpa, rebuilt window queries: what the
selector reads) and once in eager mode with ``output_attentions=True`` (``[q_head, L, L]``: what the reference
reads). The reference applies the written definition with Python loops: pivotal iff ``a[i, j] >= 1 / (i + 1)``,
importance = pivotal fraction over (query head of the kv head, window row ``i >= j``), ties by summed attention then
recency, the last ``r`` protected.
"""

from __future__ import annotations

import pytest
import torch

from relaylens.errors import BudgetError, RelaylensError, ShapeError
from relaylens.model.prefill import prefill_history
from relaylens.selectors import REGISTRY, Scissorhands, make_selector
from relaylens.selectors.scissorhands import rank_lexicographic
from relaylens.selectors.synthetic import random_prefill
from relaylens.testing import peaked_model

L, GROUP = 80, 2


@pytest.fixture(scope="module")
def run():
    model = peaked_model("llama", num_hidden_layers=3)
    ids = torch.randint(3, 384, (L,), generator=torch.Generator().manual_seed(3))
    pre = prefill_history(model, ids, window_size=48)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(ids[None], output_attentions=True, use_cache=False)
    return pre, [a[0].double() for a in out.attentions]  # per layer [q_head, L, L]


def reference(att: torch.Tensor, n: int, k: int, r: int) -> list[list[int]]:
    """Kept positions per kv head from the definition, with plain loops over the eager matrix."""
    kept = []
    for h in range(att.shape[0] // GROUP):
        rows = range(L - n, L)
        cand = []
        for j in range(L - r):
            hits = seen = 0
            mass = 0.0
            for q in range(h * GROUP, (h + 1) * GROUP):
                for i in rows:
                    if i >= j:
                        seen += 1
                        hits += float(att[q, i, j]) >= 1.0 / (i + 1)
                        mass += float(att[q, i, j])
            cand.append((hits / seen, mass / GROUP, j))
        best = sorted(cand, key=lambda t: (-t[0], -t[1], -t[2]))[: k - r]
        kept.append(sorted(j for _, _, j in best) + list(range(L - r, L)))
    return kept


def test_reference_is_not_on_a_knife_edge(run):
    """No window row's weight sits within 1e-7 of its uniform level (float32 rounding is ~1e-9 here), so float32 vs
    float64 cannot flip a vote."""
    _, att = run
    level = 1.0 / (torch.arange(L - 48, L, dtype=torch.float64) + 1.0)  # [48] per window row
    for a in att:
        near = (a[:, L - 48 :] - level[None, :, None]).abs() < 1e-7
        assert not near.any()


@pytest.mark.parametrize("n,k,r", [(48, 20, 4), (16, 12, 10), (48, 8, 0)])
def test_scissorhands_equals_bruteforce(run, n, k, r):
    pre, att = run
    sel = Scissorhands(history_window=n, recent=r).select(pre, None, k)
    for l in range(pre.num_layers):
        want = reference(att[l], n, k, r)
        for h in range(pre.num_kv_heads):
            assert sel.positions[l, h][sel.valid[l, h]].tolist() == want[h], (l, h)
    assert (sel.counts == k).all() and sel.info["recent"] == r and sel.info["history_window"] == n


def test_importance_is_a_fraction_and_ties_are_common(run):
    pre, _ = run
    imp, mass = Scissorhands(history_window=16).importance(pre)
    assert imp.shape == mass.shape == (pre.num_layers, pre.num_kv_heads, L)
    assert float(imp.min()) >= 0.0 and float(imp.max()) <= 1.0
    assert len(imp[0, 0].unique()) < L // 2  # a count: the tie-break matters


def test_wrong_threshold_would_fail(run):
    """The reference discriminates: voting with the summed attention instead of pivotal counts changes the sets."""
    pre, att = run
    sel = Scissorhands(history_window=48, recent=4).select(pre, None, 20)
    differs = False
    for l in range(pre.num_layers):
        for h in range(pre.num_kv_heads):
            col = att[l][h * GROUP : (h + 1) * GROUP, L - 48 :, : L - 4].sum((0, 1)).tolist()
            by_mass = sorted(sorted(range(L - 4), key=lambda j: (-col[j], -j))[:16]) + list(range(L - 4, L))
            differs |= by_mass != sel.positions[l, h].tolist()
    assert differs


# ---------------------------------------------------------------------------------------------------------------
# budget arithmetic and bad input (synthetic prefills)
@pytest.mark.parametrize("length,budget,recent,want", [(400, 0.1, 10, 40), (400, 0.025, 10, 10), (97, 0.25, 3, 24),
                                                       (64, 64, 10, 64), (64, "B33", 0, 33)])
def test_budget_is_exact(length, budget, recent, want):
    pre = random_prefill(length=length, num_layers=2, num_kv_heads=3, window=min(length, 40), seed=4)
    sel = Scissorhands(history_window=40, recent=recent).select(pre, None, budget)
    assert (sel.counts == want).all()
    assert sel.positions[..., want - recent : want].tolist() == [[list(range(length - recent, length))] * 3] * 2
    assert all(len(set(sel.positions[l, h].tolist())) == want for l in range(2) for h in range(3))


def test_history_window_longer_than_history_uses_every_row():
    pre = random_prefill(length=30, window=30)
    assert Scissorhands(history_window=400, recent=2).rows(30) == 30
    assert Scissorhands(history_window=400, recent=2).select(pre, None, 10).info["history_window"] == 30


def test_registered_and_configurable():
    assert REGISTRY["scissorhands"] is Scissorhands
    assert make_selector("scissorhands", recent=4).recent == 4
    assert Scissorhands().query_window == 400


@pytest.mark.parametrize("kwargs", [{"history_window": 0}, {"recent": -1}, {"history_window": 2.5}, {"recent": True}])
def test_bad_hyperparameters(kwargs):
    with pytest.raises(RelaylensError):
        Scissorhands(**kwargs)


def test_budget_below_recent_and_missing_queries():
    pre = random_prefill(length=64, window=16)
    with pytest.raises(BudgetError, match="recent=10"):
        Scissorhands(history_window=16).select(pre, None, 5)
    with pytest.raises(ShapeError, match="window_size >= 32"):
        Scissorhands(history_window=32).select(pre, None, 20)


def test_rank_lexicographic():
    primary = torch.tensor([[1.0, 2.0, 2.0, 1.0, 2.0]])
    secondary = torch.tensor([[9.0, 0.5, 0.7, 0.0, 0.5]])
    assert rank_lexicographic(primary, secondary, 2).tolist() == [[2, 4]]  # 2 by mass; 4 beats 1 by recency
    assert rank_lexicographic(primary, secondary, 4).tolist() == [[0, 1, 2, 4]]
