"""Budget arithmetic, the shared interface, determinism and bad input, on synthetic prefills."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaylens.datasets.spans import RenderedPrompt, Span
from relaylens.errors import BudgetError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection
from relaylens.selectors import (
    H2O,
    REGISTRY,
    AdaKV,
    Budget,
    CaM,
    ChunkKV,
    FullKV,
    PyramidKV,
    RandomSelector,
    SnapKV,
    StreamingLLM,
    make_selector,
)
from relaylens.selectors.adakv import adaptive_head_budgets
from relaylens.selectors.base import largest_remainder, pool_scores, top_positions
from relaylens.selectors.finch import QuestionAttention
from relaylens.selectors.pyramidkv import pyramid_schedule
from relaylens.selectors.synthetic import random_prefill

L = 400



@pytest.fixture(scope="module")
def pre():
    p = random_prefill(length=L, num_layers=6, num_kv_heads=4, group=2, head_dim=16, window=32, seed=1)
    gen = torch.Generator().manual_seed(2)
    p.column_sums = [torch.rand(8, L, generator=gen) * torch.arange(L, 0, -1) for _ in range(6)]
    return p


def _prompt(length: int = L) -> RenderedPrompt:
    texts = ["dog walk park", "weather rain", "my dog Biscuit", "cooking pasta", "travel Rome", "dog food", "", "car"]
    sizes = [50, 30, 60, 20, 80, 40, 70, 50]  # sum 400 = L
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    sessions = tuple(Span("session", i, f"s{i}", a, a + n, False, None, t) for i,
                     (a, n, t) in enumerate(zip(starts, sizes, texts)))
    return RenderedPrompt("r", torch.zeros(length, dtype=torch.long), torch.zeros(3, dtype=torch.long), "", "",
                          "what is my dog called", sessions, ())


_GEN = torch.Generator().manual_seed(3)
#: hyperparameters that fit the fixture (32 window queries captured; FINCH's question attention for 6 layers)
FIXTURE_OPTIONS = {"scissorhands": {"history_window": 32},
                   "finch": {"question_attention": QuestionAttention([torch.rand(8, L, generator=_GEN)
                                                                      for _ in range(6)],
                                                                     [torch.rand(8, L, generator=_GEN)
                                                                      for _ in range(6)])}}


def _all_selections(pre, budget):
    prompt = _prompt()
    return {name: cls(**FIXTURE_OPTIONS.get(name, {})).select(pre, prompt, budget) for name, cls in REGISTRY.items()}


# -------------------------------------------------------------------------------------------------------------
# the budget
def test_budget_resolution():
    assert Budget().ratio == 0.10 and Budget().tokens(96) == 9
    assert Budget(1.0).tokens(96) == 96 and Budget(states=2048).tokens(96) == 96
    assert Budget.coerce(0.25).tokens(96) == 24 and Budget.coerce(24).tokens(1000) == 24
    assert Budget.coerce("B2048") == Budget(states=2048) and Budget.coerce("0.1") == Budget(0.1)
    assert Budget(states=64).label == "B64" and Budget(0.1).label == "0.1"


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, 2.0, float("nan"), 0, -5, True, "B0", "x", None])
def test_bad_budgets_raise(bad):
    with pytest.raises(BudgetError) as err:
        Budget.coerce(bad).tokens(100)
    assert "budget" in str(err.value).lower()
    assert isinstance(err.value, ValueError)


def test_ratio_too_small_for_history_raises():
    with pytest.raises(BudgetError, match="keeps 0 states"):
        Budget(0.001).tokens(96)


@pytest.mark.parametrize("cls", [SnapKV, PyramidKV, AdaKV, ChunkKV, CaM])
def test_budget_smaller_than_window_raises(pre, cls):
    with pytest.raises(BudgetError, match="smaller than the observation window"):
        cls().select(pre, None, 31)
    cls().select(pre, None, 32)  # exactly the window is allowed: the window only


@pytest.mark.parametrize("cls", [SnapKV, PyramidKV, AdaKV, ChunkKV, CaM])
def test_history_shorter_than_window_raises(cls):
    short = random_prefill(length=32, window=32)
    with pytest.raises(ShapeError, match="longer than its observation window"):
        cls().select(short, None, 1.0)


def test_window_larger_than_captured_queries_raises():
    with pytest.raises(ShapeError, match="captured 8 window queries"):
        SnapKV(window=32).select(random_prefill(length=96, window=8), None, 0.5)


def test_h2o_without_column_sums_raises():
    with pytest.raises(ShapeError, match=r"column_sums=True"):
        H2O().select(random_prefill(length=96), None, 0.5)


@pytest.mark.parametrize(
    "name, kwargs",
    [("snapkv", {"kernel_size": 4}), ("snapkv", {"pooling": "median"}), ("snapkv", {"gqa_reduction": "min"}),
     ("pyramidkv", {"beta": 0.5}), ("adakv", {"floor_alpha": 1.5}), ("chunkkv", {"chunk_size": 0}),
     ("cam", {"merge_size": 0}), ("cam", {"attention": "eager"}), ("h2o", {"recent_ratio": 2.0}),
     ("streaming", {"n_sink": -1}), ("bm25", {"granularity": "paragraph"}), ("bm25", {"indexed_text": "bot"}),
     ("snapkv", {"windw": 8})],
)
def test_bad_hyperparameters_raise(name, kwargs):
    with pytest.raises(RelaylensError):
        make_selector(name, **kwargs)


def test_registry_and_unknown_name():
    assert set(REGISTRY) == {"bm25", "snapkv", "h2o", "pyramidkv", "adakv", "chunkkv", "cam", "streaming", "random",
                             "full",
                             "scissorhands", "finch"}
    assert make_selector("AdaKV", floor_alpha=0.5) == AdaKV(floor_alpha=0.5)
    with pytest.raises(RelaylensError, match="unknown selector 'snapkvv'.*adakv"):
        make_selector("snapkvv")
    for cls in REGISTRY.values():
        with pytest.raises(Exception):  # frozen dataclasses
            cls().name = "x"
        assert cls.__doc__ and ">>>" in cls.__doc__


# -------------------------------------------------------------------------------------------------------------
# the output contract
@pytest.mark.parametrize("budget", [0.1, 0.25, 64])
def test_every_selector_obeys_the_contract(pre, budget):
    k = Budget.coerce(budget).tokens(L)
    for name, sel in _all_selections(pre, budget).items():
        assert isinstance(sel, Selection), name
        assert sel.positions.shape[:2] == (6, 4) and sel.history_length == L
        assert sel.scores is not None and sel.scores.shape == sel.positions.shape
        assert torch.isfinite(sel.scores[sel.valid]).all()
        for l in range(6):
            for h in range(4):
                p = sel.positions[l, h][sel.valid[l, h]]
                assert (p[1:] > p[:-1]).all() and p.unique().numel() == p.numel(), name
        if name in ("snapkv", "h2o", "cam", "streaming", "random", "scissorhands", "finch"):
            assert (sel.counts == k).all(), name  # exactly K per (layer, kv head)
        elif name == "pyramidkv":
            assert int(sel.counts.sum()) == 6 * 4 * k and (sel.counts == sel.counts[:, :1]).all()
        elif name == "adakv":
            assert (sel.counts.sum(-1) == 4 * k).all()
        elif name in ("chunkkv", "bm25"):
            assert (sel.counts <= k).all(), name
        elif name == "full":
            assert (sel.counts == L).all()
        assert sel.info["selector"] == name


def test_head_structure(pre):
    """Per-head sets where the method says so; one shared set per layer where it does not."""
    sels = _all_selections(pre, 0.25)
    for name in ("snapkv", "h2o", "adakv", "pyramidkv", "cam", "random", "scissorhands", "finch"):
        pos = sels[name].positions
        assert not (pos == pos[:, :1]).all(), f"{name} should differ across kv heads"
    for name in ("chunkkv", "streaming", "bm25", "full"):
        pos = sels[name].positions
        assert (pos == pos[:, :1]).all(), f"{name} should share one set across kv heads"
    for name in ("snapkv", "h2o", "chunkkv"):
        assert not (sels[name].positions == sels[name].positions[:1]).all(), f"{name} should differ across layers"
    assert (sels["bm25"].positions == sels["bm25"].positions[:1]).all()


def test_deterministic_and_seeded(pre):
    for name, cls in REGISTRY.items():
        options = FIXTURE_OPTIONS.get(name, {})
        a, b = cls(**options).select(pre, _prompt(), 0.25), cls(**options).select(pre, _prompt(), 0.25)
        assert torch.equal(a.positions, b.positions) and torch.equal(a.scores, b.scores), name
    assert not torch.equal(RandomSelector(seed=0).select(pre, None, 0.25).positions,
                           RandomSelector(seed=1).select(pre, None, 0.25).positions)
    c0, c1 = CaM(seed=0).select(pre, None, 0.25), CaM(seed=1).select(pre, None, 0.25)
    assert torch.equal(c0.positions, c1.positions) and not torch.equal(c0.values, c1.values)
    assert torch.equal(c0.values, CaM(seed=0).select(pre, None, 0.25).values)
    shared = RandomSelector(shared=True).select(pre, None, 0.25).positions
    assert (shared == shared[:1, :1]).all()


def test_streaming_and_full(pre):
    sel = StreamingLLM().select(pre, None, 40)
    assert sel.positions[2, 3].tolist() == [0, 1, 2, 3] + list(range(L - 36, L))
    with pytest.raises(BudgetError, match="sink"):
        StreamingLLM(n_sink=8).select(pre, None, 5)
    full = FullKV().select(pre, None, 0.1)
    assert full.positions[0, 0].tolist() == list(range(L))


def test_window_scores_put_window_last_in_score_order(pre):
    sel = SnapKV().select(pre, None, 0.25)
    s = sel.scores[0, 0]
    assert (s[-32:] > s[:-32].max()).all()


# -------------------------------------------------------------------------------------------------------------
# PyramidKV / Ada-KV / ChunkKV arithmetic
def test_pyramid_schedule_follows_formula(pre):
    sel = PyramidKV().select(pre, None, 0.25)  # K = 100, B = 68, N = 6
    b, n = 68, 6
    low, high = b / 20, 2 * b - b / 20
    floats = [high - l * (high - low) / (n - 1) for l in range(n)] 
    counts = (sel.counts[:, 0] - 32).tolist()
    assert all(abs(c - f) < 1 for c, f in zip(counts, floats)) and sum(counts) == n * b
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    assert sel.info["layer_counts"] == sel.counts[:, 0].tolist()
    assert torch.equal(PyramidKV().schedule(L, 6, 0.25), sel.counts[:, 0])


def test_pyramid_cap_at_prefix_length():
    # max = 2B - B/beta >= L - w: max is capped at L - w and min = 2B - max
    caps = pyramid_schedule(90, 100, 5)
    assert caps[0] == 100 and int(caps.sum()) == 450 and (caps <= 100).all() and caps[-1] == 80


def test_pyramid_single_layer_and_infeasible():
    assert pyramid_schedule(7, 50, 1).tolist() == [7]
    with pytest.raises(BudgetError, match="infeasible"):
        largest_remainder(torch.tensor([1.0, 1.0]), 5)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 4000), st.integers(1, 5000), st.floats(1, 100))
def test_pyramid_schedule_properties(n, b, prefix, beta):
    b = min(b, prefix)
    caps = pyramid_schedule(b, prefix, n, beta)
    assert int(caps.sum()) == n * b
    assert (caps >= 0).all() and (caps <= prefix).all()
    assert (caps[1:] <= caps[:-1]).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(0, 50), st.floats(0, 1), st.integers(0, 10_000))
def test_adaptive_head_budgets_properties(heads, b, alpha, seed):
    prefix = 50
    scores = torch.rand((heads, prefix), generator=torch.Generator().manual_seed(seed)) ** 3
    caps = adaptive_head_budgets(scores, b, alpha)
    assert int(caps.sum()) == heads * b and (caps >= 0).all() and (caps <= prefix).all()
    assert (caps >= int(alpha * b + 1e-9) - 1).all()  # the floor alpha * B is (up to rounding) guaranteed


def test_adakv_counts_really_differ_and_floor_holds(pre):
    sel = AdaKV().select(pre, None, 0.25)  # B = 68
    counts = sel.counts
    assert (counts.sum(-1) == 4 * 100).all()
    assert len(set(counts.flatten().tolist())) > 2
    assert (counts - 32 >= int(0.2 * 68) - 1).all()
    assert sel.info["head_counts"] == counts.tolist()
    uniform = AdaKV(floor_alpha=1.0).select(pre, None, 0.25)
    assert (uniform.counts == 100).all()
    assert not torch.equal(AdaKV(normalize=True).select(pre, None, 0.25).counts, counts)


def test_chunkkv_keeps_whole_chunks(pre):
    for c in (10, 7, 20):
        sel = ChunkKV(chunk_size=c).select(pre, None, 0.25)  # K = 100, prefix = 368
        for l in range(6):
            p = sel.positions[l, 0][sel.valid[l, 0]]
            prefix = p[p < L - 32]
            chunks = prefix // c
            for chunk in chunks.unique().tolist():
                size = min(c, (L - 32) - chunk * c)
                assert int((chunks == chunk).sum()) == size, (c, l, chunk)
            assert 100 - c < p.numel() <= 100
            assert (p[-32:] == torch.arange(L - 32, L)).all()


# -------------------------------------------------------------------------------------------------------------
# primitives
def test_top_positions_breaks_ties_by_recency():
    s = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert top_positions(s, 2).tolist() == [2, 4]
    assert top_positions(s, 0).numel() == 0


def test_pooling_padding():
    s = torch.tensor([[1.0, 0.0, 0.0, 0.0, 5.0]])
    assert pool_scores(s, 3, "max").tolist() == [[1.0, 1.0, 0.0, 5.0, 5.0]]
    assert pool_scores(s, 3, "avg")[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 5 / 3, 5 / 3])
    assert pool_scores(s, 3, "none").tolist() == s.tolist()
