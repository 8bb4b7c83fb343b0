"""Coordinate conditions: the worked examples of the design notes, and properties over random selections."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaylens.conditions.catalogue import CONDITIONS, Compaction, Dilation, KeyOnly
from relaylens.conditions.scoped import get_condition
from relaylens.errors import PositionError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection

# reference/conditions-examples.md: one layer, L = 20, head A (m = 6) and head B (m = 4), M = 6
EXAMPLE = Selection.from_lists(
    [[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]],
    history_length=20,
    scores=[[[0.9, 0.1, 0.5, 0.7, 0.2, 0.3], [0.4, 0.8, 0.6, 0.1]]],
)
EXPECTED = {
    "original": ([2, 5, 6, 11, 17, 19], [0, 9, 18, 19], 20),
    "relay": ([0, 1, 2, 3, 4, 5], [2, 3, 4, 5], 6),
    "rank_sync": ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3], 6),
    "key_only": ([0, 1, 2, 3, 4, 5], [2, 3, 4, 5], 20),
    "query_only(2048)": ([2, 5, 6, 11, 17, 19], [0, 9, 18, 19], 2068),
    "common_shift(2048)": ([2050, 2053, 2054, 2059, 2065, 2067], [2048, 2057, 2066, 2067], 2068),
    "half_gap": ([1, 3, 4, 7, 11, 12], [1, 6, 11, 12], 13),
    "score_order": ([5, 0, 3, 4, 1, 2], [3, 5, 4, 2], 6),
    "reverse_order": ([5, 4, 3, 2, 1, 0], [5, 4, 3, 2], 6),
    # by hand: 2 p - (M - m + i), then + 2 so head B's first key (2*0 - 2) sits at 0
    "dilation(2)": ([6, 11, 12, 21, 32, 35], [0, 17, 34, 35], 36),
    # by hand: keys as key_only, the question at 2 L - (2 - 1) M = 40 - 6 (dilation(2)'s start before its shift of 2)
    "key_only(2)": ([0, 1, 2, 3, 4, 5], [2, 3, 4, 5], 34),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_worked_examples(name):
    head_a, head_b, start = EXPECTED[name]
    coords = get_condition(name).coordinates(EXAMPLE)
    assert coords.key_positions[0, 0].tolist() == head_a
    assert coords.key_positions[0, 1].tolist() == head_b + [-1, -1]
    assert coords.question_start == start


@st.composite
def selections(draw):
    """Random ragged selections: 1-3 layers, 1-3 kv heads, different counts per head, optional scores."""
    length = draw(st.integers(8, 300))
    layers, heads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    keep, scores = [], []
    for _ in range(layers):
        keep.append([]), scores.append([])
        for _ in range(heads):
            kept = draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=min(length, 40), unique=True))
            keep[-1].append(sorted(kept))
            scores[-1].append(draw(st.lists(st.integers(0, 5).map(float), min_size=len(kept), max_size=len(kept))))
    return Selection.from_lists(keep, length, scores=scores)


ALL_CONDITIONS = ["original", "relay", "rank_sync", "key_only", "query_only(2048)", "common_shift(100)",
                  "compaction(0.25)",
                  "half_gap", "compaction(0.75)", "score_order", "reverse_order", "random_order(0)", "random_order(7)",
                  "dilation(1)", "dilation(4)", "dilation(14)", "dilation(2.5)", "key_only(4)", "key_only(14)"]


@settings(max_examples=60, deadline=None)
@given(sel=selections(), name=st.sampled_from(ALL_CONDITIONS))
def test_every_condition_keeps_counts_and_orders_heads(sel, name):
    coords = get_condition(name).coordinates(sel)
    valid = sel.valid
    assert coords.key_positions.shape == sel.positions.shape
    assert bool((coords.key_positions[~valid] == -1).all()), "padding must stay padding"
    assert bool((coords.key_positions[valid] >= 0).all())
    # positions inside a head are distinct, and the question comes after every key
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            kept = coords.key_positions[layer, head][valid[layer, head]]
            assert kept.unique().numel() == kept.numel()
    assert int(coords.key_positions.max()) < coords.question_start


@settings(max_examples=60, deadline=None)
@given(sel=selections())
def test_relay_right_aligns_and_rank_sync_left_aligns(sel):
    M = sel.max_count
    relay = get_condition("relay").coordinates(sel)
    rank = get_condition("rank_sync").coordinates(sel)
    counts = sel.counts
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            m = int(counts[layer, head])
            assert relay.key_positions[layer, head, :m].tolist() == list(range(M - m, M))
            assert rank.key_positions[layer, head, :m].tolist() == list(range(m))
    assert relay.question_start == rank.question_start == M


@settings(max_examples=60, deadline=None)
@given(sel=selections(), shift=st.integers(1, 5000))
def test_shift_conditions_follow_the_table(sel, shift):
    valid, L = sel.valid, sel.history_length
    key_only = get_condition("key_only").coordinates(sel)
    assert torch.equal(key_only.key_positions, get_condition("relay").coordinates(sel).key_positions)
    assert key_only.question_start == L
    query_only = get_condition(f"query_only({shift})").coordinates(sel)
    assert torch.equal(query_only.key_positions[valid], sel.positions[valid]) and query_only.question_start == L + shift
    common = get_condition(f"common_shift({shift})").coordinates(sel)
    assert torch.equal(common.key_positions[valid], sel.positions[valid] + shift) and common.question_start == L + shift


@settings(max_examples=60, deadline=None)
@given(sel=selections(), alpha=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]))
def test_compaction_family(sel, alpha):
    coords = Compaction(alpha).coordinates(sel)
    if alpha == 0.0:
        expected = get_condition("original").coordinates(sel)
    elif alpha == 1.0:
        expected = get_condition("relay").coordinates(sel)
    else:
        expected = None
    if expected is not None:
        assert torch.equal(coords.key_positions, expected.key_positions)
        assert coords.question_start == expected.question_start
    # strictly increasing inside each head: rounding never merges two keys
    steps = coords.key_positions[..., 1:] - coords.key_positions[..., :-1]
    both = sel.valid[..., 1:] & sel.valid[..., :-1]
    assert bool((steps[both] >= 1).all())


@settings(max_examples=60, deadline=None)
@given(sel=selections(), name=st.sampled_from(["score_order", "reverse_order", "random_order(0)", "random_order(5)"]))
def test_orderings_permute_relay_slots(sel, name):
    relay = get_condition("relay").coordinates(sel).key_positions
    coords = get_condition(name).coordinates(sel)
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            mask = sel.valid[layer, head]
            assert sorted(coords.key_positions[layer, head][mask].tolist()) == relay[layer, head][mask].tolist()
    assert coords.question_start == sel.max_count


@settings(max_examples=30, deadline=None)
@given(sel=selections())
def test_score_order_puts_highest_score_last_with_source_order_ties(sel):
    coords = get_condition("score_order").coordinates(sel).key_positions
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            mask = sel.valid[layer, head]
            scores = sel.scores[layer, head][mask].tolist()
            slots = coords[layer, head][mask].tolist()
            by_slot = [s for _, s in sorted(zip(slots, scores))]
            assert by_slot == sorted(scores)
            for i in range(len(scores)):
                for j in range(i + 1, len(scores)):
                    if scores[i] == scores[j]:
                        assert slots[i] < slots[j], "ties must keep source order"


def test_random_order_is_deterministic_per_seed():
    sel = Selection.from_lists([[list(range(0, 200, 3)), list(range(1, 100, 2))]] * 2, history_length=200)
    first = get_condition("random_order(4)").coordinates(sel).key_positions
    again = get_condition("random_order(4)").coordinates(sel).key_positions
    other = get_condition("random_order(5)").coordinates(sel).key_positions
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not torch.equal(first[0, 0], first[0, 1][: first.shape[-1]]), "heads get their own permutations"


def test_condition_names_parse():
    assert get_condition("query_only(shift=512)").shift == 512
    assert get_condition("compaction(alpha=0.25)").alpha == 0.25
    assert get_condition("half_gap").label == "half_gap"
    assert set(CONDITIONS) >= {"original", "relay", "rank_sync", "key_only", "query_only", "common_shift",
                               "compaction", "half_gap", "score_order", "reverse_order", "random_order"}


@pytest.mark.parametrize("spec", ["sync", "relay(3)", "query_only(alpha=2)", "compaction(1.5)", "query_only(x)"])
def test_bad_condition_names(spec):
    with pytest.raises(RelaylensError):
        get_condition(spec)


def test_score_order_without_scores():
    with pytest.raises(RelaylensError, match="scores"):
        get_condition("score_order").coordinates(Selection.from_lists([[[0, 1]]], history_length=3))


@pytest.mark.parametrize(
    ("keep", "error", "message"),
    [
        ([[[3, 1, 2]]], PositionError, "strictly ascending"),
        ([[[1, 1, 2]]], PositionError, "strictly ascending"),
        ([[[-1, 2]]], PositionError, "negative"),
        ([[[0, 99]]], PositionError, "history_length"),
        ([[[0, 1], []]], PositionError, "no state"),
        ([[[0, 1]], [[0], [1]]], ShapeError, "same"),
    ],
)
def test_bad_selections(keep, error, message):
    with pytest.raises(error, match=message):
        Selection.from_lists(keep, history_length=10)


def test_mask_shape_mismatch():
    positions = torch.tensor([[[0, 1, 2]]])
    with pytest.raises(ShapeError, match="valid mask"):
        Selection(positions, torch.ones(1, 1, 2, dtype=torch.bool), history_length=5)
    with pytest.raises(PositionError, match="left-packed"):
        Selection(positions, torch.tensor([[[True, False, True]]]), history_length=5)


@settings(max_examples=60, deadline=None)
@given(sel=selections(), k=st.integers(1, 20))
def test_dilation_scales_every_gap_room_by_k(sel, k):
    """Between kept neighbours and before the question, the room beyond adjacency is k times the source's; dilation(1)
    is original; one common shift keeps every position at 0 or above, the smallest at 0 when any moved below."""
    coords = Dilation(k).coordinates(sel)
    valid, pos, new = sel.valid, sel.positions, coords.key_positions
    if k == 1:
        original = get_condition("original").coordinates(sel)
        assert torch.equal(new, original.key_positions) and coords.question_start == original.question_start
    both = valid[..., 1:] & valid[..., :-1]
    source_room = (pos[..., 1:] - pos[..., :-1] - 1)[both]
    assert torch.equal((new[..., 1:] - new[..., :-1] - 1)[both], k * source_room)
    counts = sel.counts
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            m = int(counts[layer, head])
            if m:
                last_source, last_new = int(pos[layer, head, m - 1]), int(new[layer, head, m - 1])
                assert coords.question_start - last_new - 1 == k * (sel.history_length - last_source - 1)
    assert int(new[valid].min()) >= 0


@settings(max_examples=60, deadline=None)
@given(sel=selections(), k=st.integers(1, 20))
def test_key_only_k_leaves_the_question_where_dilation_puts_it(sel, k):
    """key_only(k): relay's keys; the question (k - 1)(L - M) past key_only's, which is dilation(k)'s question start
    before its common shift; key_only(1) is key_only, label included."""
    plain, stretched = get_condition("key_only").coordinates(sel), get_condition(f"key_only({k})").coordinates(sel)
    assert torch.equal(stretched.key_positions, plain.key_positions)
    assert stretched.question_start - plain.question_start == (k - 1) * (sel.history_length - sel.max_count)
    dilated = Dilation(k).coordinates(sel)
    shift = max(0, -int((k * sel.positions - (k - 1) * get_condition("relay").coordinates(sel).key_positions)
                        [sel.valid].min()))
    assert dilated.question_start - shift == stretched.question_start
    assert get_condition(f"key_only({k})").label == ("key_only" if k == 1 else f"key_only({k})")


@pytest.mark.parametrize("k", [0.5, 0.0, -2.0, float("nan"), float("inf")])
def test_key_only_refuses_k_below_one(k):
    with pytest.raises(RelaylensError, match="key_only k must be"):
        get_condition(f"key_only({k})") if math.isfinite(k) else KeyOnly(k)


@pytest.mark.parametrize("k", [0.5, 0.0, -2.0, float("nan"), float("inf")])
def test_dilation_refuses_k_below_one(k):
    with pytest.raises(RelaylensError, match="dilation k must be"):
        Dilation(k)
