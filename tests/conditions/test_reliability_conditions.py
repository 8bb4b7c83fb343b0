"""Issue 41 (round 4), conditions: exact labels (item 8), geometry / move / learned-file input checked when parsed
(item 12), scopes checked against the model before any record runs (item 11), and one rule for positions a
condition cannot place (item 13: every one a skip, with the reason)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from relaylens.conditions.catalogue import Compaction
from relaylens.conditions.family import LEARNED_FILE, Geometry, Learned
from relaylens.conditions.scoped import get_condition
from relaylens.errors import RelaylensError
from relaylens.geometry.selection import Selection

SEL = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]] * 2, history_length=20)


# --------------------------------------------------------------------------------------- item 8: exact labels

@pytest.mark.parametrize("a, b", [
    ("geometry(b=1.0000001)", "geometry(b=1.0000002)"),
    ("geometry(s=0.12345678)", "geometry(s=0.12345679)"),
    ("geometry(alpha=0.3333333)", "geometry(alpha=0.33333333)"),
    ("compaction(0.1234567)", "compaction(0.1234568)"),
])
def test_different_conditions_never_share_a_label(a, b):
    first, second = get_condition(a), get_condition(b)
    assert first.label != second.label
    for condition in (first, second):  # the label parses back to the very same parameters
        again = get_condition(condition.label)
        assert again.label == condition.label
        fields = ("b", "s", "alpha") if isinstance(condition, Geometry) else ("alpha",)
        assert all(getattr(again, f) == getattr(condition, f) for f in fields)


def test_per_layer_and_per_head_geometries_have_exact_labels_that_parse_back():
    per_layer, other = Geometry(b=(1.0, 2.5)), Geometry(b=(1.0, 2.5000001))
    per_head = Geometry(b=((1.0, 2.0), (3.0, 4.0)), s=0.5, alpha=(0.25, 1.0))
    assert len({per_layer.label, other.label, per_head.label, Geometry().label}) == 4
    for condition in (per_layer, other, per_head):
        again = get_condition(condition.label)
        assert again.label == condition.label
        assert torch.equal(again.coordinates(SEL).key_positions, condition.coordinates(SEL).key_positions)
    assert get_condition("geometry(b=[1,2.5])@layers=0").label == "geometry(b=[1,2.5],s=1,alpha=1)@layers=0"
    assert Geometry(b=2.0, s=0.5, alpha=0.5).label == "geometry(b=2,s=0.5,alpha=0.5)"  # short where exact


# ------------------------------------------------------------------------- item 12: input checked when parsed

@pytest.mark.parametrize("spec, named", [
    ("geometry(b=1e400)", "b must be a finite number with 0 < b < 2\\*\\*24"),
    ("geometry(s=nan)", "s must be a finite number"),
    ("geometry(alpha=inf)", "alpha must be a finite number with 0 <= alpha <= 1"),
    ("geometry(alpha=1.5)", "got 1.5"),
    ("geometry(b=-2)", "0 < b"),
    ("geometry(b=0)", "0 < b"),
    ("geometry(s=1e30)", "s < 2\\*\\*24"),
    ("geometry(b=[1,'x'])", "got str"),
    ("geometry(b=[[1,2],[3]])", "rectangular"),
    ("geometry(b=[[[1]]])", "nested too deep"),
    ("geometry(b=[1,2)", "must be a number"),
    ("relay@move=99999999999999999999", "\\|move\\| < 2\\*\\*24"),
    ("relay@layers=0@move=-16777216", "\\|move\\| < 2\\*\\*24"),
    ("geometry(b=1e400)@layers=0", "b must be a finite number"),
    ("relay@base=geometry(s=0)", "0 < s"),
])
def test_bad_geometry_and_move_values_are_refused_when_parsed(spec, named):
    with pytest.raises(RelaylensError, match=named) as caught:
        get_condition(spec)
    assert "\n" not in str(caught.value) and "Fix:" in str(caught.value)


def _learned(tmp_path, **changes):
    doc = {"parameters": {"b": [2.0, 1.0], "s": [0.5, 1.0], "alpha": [0.5, 1.0]}, "num_layers": 2, "num_kv_heads": 2,
           "model": {"spec": "tiny"}, "selector": "bm25", "budget": 0.1, "train_records": ["r1"], "sharing": "layer"}
    for key, value in changes.items():
        target, name = (doc["parameters"], key[2:]) if key.startswith("p_") else (doc, key)
        target[name] = value
    (tmp_path / LEARNED_FILE).write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return f"learned:{tmp_path}"


@pytest.mark.parametrize("changes, named", [
    ({"p_b": "2"}, "field 'parameters': b must be a finite number.*got str"),
    ({"p_s": [1.0, None]}, "field 'parameters': s .*NoneType.*index \\[1\\]"),
    ({"p_alpha": [0.5, 2.0]}, "alpha .*0 <= alpha <= 1"),
    ({"p_b": [1.0, 2.0, 3.0]}, "b has shape \\[3\\]; the file's model has 2 layers"),
    ({"parameters": {"b": 1.0, "s": 1.0}}, "field 'parameters' must be an object with b, s and alpha"),
    ({"parameters": [1, 2]}, "field 'parameters' must be an object"),
    ({"num_layers": "2"}, "field 'num_layers' must be a whole number"),
    ({"num_layers": 0}, "field 'num_layers' must be >= 1"),
    ({"num_kv_heads": True}, "field 'num_kv_heads' must be a whole number"),
    ({"budget": -1}, "field 'budget' must be a ratio"),
    ({"budget": "0.1"}, "field 'budget' must be a number"),
    ({"selector": 5}, "field 'selector' must be a string"),
    ({"train_records": "r1"}, "field 'train_records' must be a list"),
    ({"train_records": [1, 2]}, "field 'train_records' must list record ids"),
    ({"model": "tiny"}, "field 'model' must be an object"),
])
def test_learned_file_fields_are_checked_when_parsed(tmp_path, changes, named):
    spec = _learned(tmp_path, **changes)
    with pytest.raises(RelaylensError, match=named) as caught:
        get_condition(spec)
    message = str(caught.value)
    assert message.startswith(f"learned:{tmp_path}: {tmp_path / LEARNED_FILE}") and "\n" not in message


def test_learned_file_with_nan_or_infinity_is_refused(tmp_path):
    (tmp_path / LEARNED_FILE).write_text('{"parameters": {"b": NaN, "s": 1.0, "alpha": 1.0}}')
    with pytest.raises(RelaylensError, match="is not a learned geometry .*NaN is not a number JSON allows"):
        get_condition(f"learned:{tmp_path}")
    (tmp_path / LEARNED_FILE).write_text('{"parameters": {"b": 1e400, "s": 1.0, "alpha": 1.0}}')
    with pytest.raises(RelaylensError, match="b must be a finite number .*got inf"):
        get_condition(f"learned:{tmp_path}")
    assert isinstance(get_condition(_learned(tmp_path)), Learned)  # the good file parses


# --------------------------------------------------------------- item 11: scopes checked against the model

MODEL = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4))


@pytest.mark.parametrize("spec, named", [
    ("relay@heads=1.2@move=1", "head 1.2 does not exist; the model has 2 layers x 2 kv heads"),
    ("relay@layers=5", "layer 5 does not exist; the model has 2 layers"),
    ("relay@layer_type=sliding_attention", "the model has no 'sliding_attention' layers"),
])
def test_scopes_the_model_lacks_are_refused_when_bound(spec, named):
    with pytest.raises(RelaylensError, match=named):
        get_condition(spec, model=MODEL)
    get_condition(spec)  # without a model the spec itself is fine


# ------------------------------------------------------------------ item 13: positions a condition cannot place

@pytest.mark.parametrize("spec, reason", [
    ("geometry(b=5000)", "too_long"),
    ("geometry(s=1000)", "too_long"),
    ("query_only(5000)", "too_long"),
    ("relay@layers=0@move=-5000", "too_long"),
    ("geometry(b=2)@layers=1@move=-5000", "too_long"),
    ("relay@move=2", "position"),
    ("relay@heads=1.0@move=1@base=relay", None),
    ("geometry(b=3,s=0.5,alpha=0.5)", None),
])
def test_every_position_problem_is_one_kind_of_skip(spec, reason):
    """One rule for geometry(...), query_only(...) and move=: a question past the rotary range is ``too_long``, a
    key moved past the question is ``position``; the runner skips (and records) the unit for either."""
    from relaylens.conditions.scoped import unit_position_problem

    problem = unit_position_problem([get_condition(spec)], SEL, tail=10, limit=4096)
    assert (problem and problem[0]) == reason
    if problem:
        assert get_condition(spec).label in problem[1] and "\n" not in problem[1]


def test_compaction_labels_stay_short_where_exact():
    """Compaction labels keep %g where it is exact (committed runs keep their labels)."""
    assert [Compaction(a).label for a in (0.0, 0.25, 0.5, 1.0)] == ["compaction(0)", "compaction(0.25)",
                                                                    "compaction(0.5)", "compaction(1)"]
    assert math.isclose(get_condition("compaction(0.1234567)").alpha, 0.1234567)
