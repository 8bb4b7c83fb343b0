"""Issue 28 item 15: the question starts after every kept key, for every condition (built in, scoped, hand-made
coordinates); shifts are whole numbers >= 0; key positions and the question start obey the position rule."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaylens.conditions.catalogue import Condition
from relaylens.conditions.scoped import get_condition
from relaylens.errors import PositionError, RelaylensError
from relaylens.geometry.selection import Selection

SEL = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]], history_length=20)


@pytest.mark.parametrize("spec", ["query_only(-5)", "query_only(shift=-1)", "common_shift(-3)",
                                  "relay@layers=0@base=query_only(-5)", "query_only(-5)@band=late"])
def test_negative_shifts_are_refused_when_parsed(spec):
    with pytest.raises(RelaylensError, match=r"shift must be a whole number of positions >= 0.*Fix"):
        get_condition(spec)


@dataclasses.dataclass(frozen=True)
class _Early(Condition):
    """A hand-written condition whose question starts ``back`` positions before the end of the history."""

    back: int = 5
    name = "early"

    def coordinates(self, sel):
        from relaylens.conditions.catalogue import make_coordinates

        return make_coordinates(self.label, sel, sel.positions, sel.history_length - self.back)


def test_a_question_before_kept_keys_is_refused_naming_the_key():
    with pytest.raises(PositionError, match=r"condition early: the question starts at position 15, but layer 0, "
                                            r"kv_head 0, slot 5 keeps a key at position 19.*Fix"):
        _Early().coordinates(SEL)


def test_a_question_right_after_the_last_kept_key_is_fine():
    assert _Early(back=0).coordinates(SEL).question_start == 20


def test_hand_made_coordinates_are_checked_before_a_cache_is_built():
    from relaylens.conditions.catalogue import Coordinates
    from relaylens.generation.cache import coordinates_of

    keys = torch.where(SEL.valid, SEL.positions, torch.full_like(SEL.positions, -1))
    with pytest.raises(PositionError, match="the question must start after every kept key"):
        coordinates_of(Coordinates("mine", keys, 19), SEL)
    with pytest.raises(PositionError, match=r"condition mine: key positions contain a negative position \(-4\) "
                                            r"\(at layer 0, kv_head 1, slot 0\)"):
        coordinates_of(Coordinates("mine", keys.masked_fill(torch.tensor([[[False] * 6, [True] + [False] * 5]]), -4),
                                   25), SEL)
    assert coordinates_of(Coordinates("mine", keys, 20), SEL).question_start == 20


def test_key_positions_past_the_phase_limit_are_refused():
    sel = Selection.from_lists([[[0, 3]]], history_length=4)
    with pytest.raises(PositionError, match=r"2\*\*24"):
        get_condition(f"common_shift({2**24})").coordinates(sel)


@st.composite
def _selections(draw):
    length, heads = draw(st.integers(2, 200)), draw(st.integers(1, 3))
    keep = [[sorted(draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=20, unique=True)))
             for _ in range(heads)] for _ in range(draw(st.integers(1, 2)))]
    return Selection.from_lists(keep, length, scores=[[[float(p) for p in h] for h in layer] for layer in keep])


SPECS = ["original", "relay", "rank_sync", "key_only", "query_only(0)", "query_only(7)", "common_shift(0)",
         "common_shift(9)", "compaction(0.3)", "half_gap", "score_order", "reverse_order", "random_order(2)",
         "relay@layers=0", "key_only@band=late@base=query_only(5)"]


@settings(max_examples=40, deadline=None)
@given(_selections(), st.sampled_from(SPECS))
def test_every_valid_condition_starts_its_question_after_its_keys(sel, spec):
    coords = get_condition(spec).coordinates(sel)
    assert coords.question_start > int(coords.key_positions[sel.valid].max())
