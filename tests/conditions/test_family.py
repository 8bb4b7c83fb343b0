"""The geometry family (relaylens.conditions.family): its points are original, relay, key_only and compaction
exactly (positions and question start), the anchor keeps positions >= 0, bad parameters are refused naming the
(layer, kv head), sharing levels broadcast, ``geometry(...)`` / ``learned:RUN_DIR`` parse, and the ``move=`` scope
clause moves one head's keys."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from relaylens.conditions.catalogue import Compaction
from relaylens.conditions.family import (
    LEARNED_FILE,
    Geometry,
    Learned,
    anchor,
    expand,
    family_coordinates,
    family_point,
    gaps,
    parse_family,
    sharing_of,
)
from relaylens.conditions.scoped import Scoped, get_condition
from relaylens.errors import NonFiniteError, PositionError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection

WORKED = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]], history_length=20)


def _random_selection(seed: int, layers: int = 3, heads: int = 2, length: int = 200) -> Selection:
    gen = torch.Generator().manual_seed(seed)
    keep = [[sorted(torch.randperm(length, generator=gen)[: int(torch.randint(1, 30, (1,), generator=gen))].tolist())
             for _ in range(heads)] for _ in range(layers)]
    return Selection.from_lists(keep, length)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", ["original", "relay", "key_only", "common_shift(7)"])
def test_known_maps_are_exact_points(seed, name):
    sel = _random_selection(seed)
    coords = get_condition(name).coordinates(sel)
    family = family_coordinates(sel, *family_point(name, sel))
    distances = coords.question_start - coords.key_positions
    family_distances = family.question_start - family.key_positions
    assert torch.equal(family_distances[sel.valid], distances[sel.valid].double())  # every query-key distance
    if name != "common_shift(7)":  # the very same positions (a common shift differs by its offset only)
        assert family.question_start == coords.question_start
        assert torch.equal(family.key_positions[sel.valid], coords.key_positions[sel.valid].double())


@pytest.mark.parametrize("alpha", [0.25, 0.5, 0.75])
def test_compaction_is_a_point_up_to_its_rounding(alpha):
    sel = _random_selection(3)
    coords = Compaction(alpha).coordinates(sel)
    family = family_coordinates(sel, *family_point(f"compaction({alpha})", sel))
    assert abs(family.question_start - coords.question_start) <= 1
    gap = (family.question_start - family.key_positions) - (coords.question_start - coords.key_positions)
    assert float(gap[sel.valid].abs().max()) <= 1.0  # both rounded to the nearest integer


def test_worked_example_of_the_docstring():
    coords = Geometry(b=2.0, s=0.5, alpha=0.5).coordinates(WORKED)
    assert coords.question_start == 13
    assert coords.key_positions[0, 0].tolist() == [5.5, 6.5, 7.0, 8.5, 10.25, 11.0]
    relay = family_coordinates(WORKED, *family_point("relay", WORKED))
    assert relay.key_positions[0].tolist() == [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, -1, -1]] and relay.question_start == 6
    original = family_coordinates(WORKED, *family_point("original", WORKED))
    assert original.question_start == 20 and original.key_positions[0, 1, :4].tolist() == [0, 9, 18, 19]


@pytest.mark.parametrize("b, s, alpha", [(0.3, 0.1, 0.0), (40.0, 3.0, 1.0), (2.0, 0.01, 0.5), (1e-3, 1.0, 0.9)])
def test_positions_are_non_negative_increasing_and_follow_the_formula(b, s, alpha):
    sel = _random_selection(11)
    coords = family_coordinates(sel, b, s, alpha)
    positions = coords.key_positions
    assert float(positions[sel.valid].min()) >= 0.0
    assert bool(((positions[..., 1:] > positions[..., :-1]) | ~sel.valid[..., 1:]).all())
    distance = b + s * gaps(sel, torch.full((sel.num_layers, sel.num_kv_heads), alpha, dtype=torch.float64))
    assert torch.allclose((coords.question_start - positions)[sel.valid], distance[sel.valid])


def test_single_state_and_empty_heads_are_harmless():
    single = Selection.from_lists([[[7], [1, 4, 9]]], history_length=10)
    coords = family_coordinates(single, 3.0, 0.5, 0.0)
    assert coords.key_positions[0, 0, 0].item() == coords.question_start - 3.0
    # a head with no kept state (a Selection refuses one; the family's arithmetic must not care)
    empty = SimpleNamespace(counts=torch.tensor([[0, 2]]), positions=torch.tensor([[[-1, -1], [3, 8]]]),
                            valid=torch.tensor([[[False, False], [True, True]]]), history_length=10, max_count=2)
    g = gaps(empty, torch.ones(1, 2, dtype=torch.float64))
    assert g[0, 0].tolist() == [0.0, 0.0] and g[0, 1].tolist() == [1.0, 0.0]
    assert anchor(empty, 1.0 + g, torch.ones(1, 2, dtype=torch.float64)) == 2


def test_non_monotone_and_non_finite_positions_are_refused_naming_the_head():
    sel = Selection.from_lists([[[0, 1, 2], [0, 50, 99]], [[3, 4, 5], [10, 20, 30]]], history_length=100)
    alpha = torch.tensor([[0.0, 0.0], [0.0, 2.0]], dtype=torch.float64)  # alpha > 1 reverses the big gaps of 1.1
    with pytest.raises(PositionError, match=r"layer 1 kv_head 1 positions are not strictly increasing.*alpha = 2"):
        family_coordinates(sel, 1.0, 1.0, alpha)
    with pytest.raises(PositionError, match="layer 0 kv_head 0.*s > 0"):
        family_coordinates(sel, 1.0, -0.5, 0.0)
    s = torch.ones(2, 2, dtype=torch.float64)
    s[1, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="layer 1 kv_head 0 has non-finite positions"):
        family_coordinates(sel, 1.0, s, 0.0)


def test_sharing_levels_broadcast():
    assert expand(2.0, 2, 3).shape == (2, 3)
    assert expand([[1.0, 2.0, 3.0]] * 2, 2, 3)[1].tolist() == [1.0, 2.0, 3.0]
    assert [sharing_of(v) for v in (1.0, [1.0, 2.0], [[1.0], [2.0]])] == ["global", "layer", "head"]
    with pytest.raises(ShapeError, match="Give a scalar"):
        expand([1.0, 2.0, 3.0], 2, 3)
    per_layer = family_coordinates(WORKED, [3.0], [1.0], [1.0])
    assert per_layer.key_positions[0, 0, -1].item() == per_layer.question_start - 3.0


def test_positions_are_differentiable_in_the_parameters():
    b = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    coords = family_coordinates(WORKED, b, 0.5, 0.5)
    assert coords.key_positions.requires_grad
    coords.key_positions[WORKED.valid].sum().backward()
    assert b.grad.item() == -10.0  # every one of the 10 kept keys moves by -1 per unit of b


def test_geometry_specs_parse_and_label():
    condition = get_condition("geometry(b=4,s=0.5)")
    assert isinstance(condition, Geometry) and condition.label == "geometry(b=4,s=0.5,alpha=1)"
    assert get_condition(condition.label).label == condition.label
    assert get_condition("geometry(alpha=0)@layers=0").label == "geometry(b=1,s=1,alpha=0)@layers=0"
    assert parse_family("relay") is None
    with pytest.raises(RelaylensError, match="geometry\\(b=B,s=S,alpha=A\\)"):
        get_condition("geometry(c=1)")


def test_learned_condition_reads_its_run_directory(tmp_path):
    with pytest.raises(RelaylensError, match="no learned_geometry.json"):
        get_condition(f"learned:{tmp_path}")
    with pytest.raises(RelaylensError, match="names no run directory"):
        get_condition("learned:")
    (tmp_path / LEARNED_FILE).write_text(json.dumps({"parameters": {"b": [2.0], "s": [0.5], "alpha": [0.5]},
                                                     "num_layers": 1, "num_kv_heads": 2, "model": {"spec": "tiny"}}))
    condition = get_condition(f"learned:{tmp_path}")
    assert isinstance(condition, Learned) and condition.label == f"learned:{tmp_path}"
    assert torch.equal(condition.coordinates(WORKED).key_positions,
                       Geometry(2.0, 0.5, 0.5).coordinates(WORKED).key_positions)
    model_config = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3)
    with pytest.raises(RelaylensError, match="learned on tiny \\(1 layers x 2 kv heads\\); this model has 30 x 3"):
        get_condition(f"learned:{tmp_path}", model=SimpleNamespace(config=model_config))
    (tmp_path / LEARNED_FILE).write_text("{not json")
    with pytest.raises(RelaylensError, match="is not a learned geometry"):
        get_condition(f"learned:{tmp_path}")


def test_move_clause_moves_one_heads_keys():
    sel = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]] * 2, history_length=20)
    relay = get_condition("relay").coordinates(sel)
    closer = get_condition("relay@heads=1.0@move=1@base=relay")
    assert closer.label == "relay@heads=1.0@move=+1@base=relay"
    moved = closer.coordinates(sel)
    assert moved.question_start == relay.question_start
    assert torch.equal(moved.key_positions[1, 0], relay.key_positions[1, 0] + 1)
    assert torch.equal(moved.key_positions[0], relay.key_positions[0])
    assert torch.equal(moved.key_positions[1, 1], relay.key_positions[1, 1])
    away = Scoped(get_condition("original"), heads=((0, 1),), move=-1, base=get_condition("original")).coordinates(sel)
    # head 0.1 keeps position 0: moving it away would go below 0, so everything shifts up by one (distances kept)
    assert away.question_start == 21 and away.key_positions[0, 1, :4].tolist() == [0, 9, 18, 19]
    assert away.key_positions[0, 0].tolist() == [3, 6, 7, 12, 18, 20]
    with pytest.raises(RelaylensError, match="move='x' is not a whole number"):
        get_condition("relay@move=x")
