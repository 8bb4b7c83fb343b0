"""The positional sensitivity readout against exact finite shifts (one head's keys moved by +-1 position with the
``move=`` scope clause): the sign agrees, and the magnitude within 25%, for the heads with the largest gradients;
the family's own parameters give the same gradient at its points; the rows have the probes table's shape."""

from __future__ import annotations

import pytest
import torch

from relaylens.conditions.family import Geometry
from relaylens.generation.single import prefill_from_cache
from relaylens.geometry.selection import Selection
from relaylens.model.hf import new_cache
from relaylens.probes.sensitivity import finite_shift_slopes, positional_sensitivity
from relaylens.results.tables import SENSITIVITY_METRICS
from relaylens.testing import peaked_model

L, TARGET = 50, 9


def _setup(variant: str = "llama", seed: int = 1):
    # clear top keys (positions matter), and head_dim 64 like real models: many rotary planes, most of them slower than
    # the fastest (one radian per position), where a +-1 shift is no longer a small step
    model = peaked_model(variant, sharpen=3.0, num_hidden_layers=3, head_dim=64)
    gen = torch.Generator().manual_seed(seed)
    history = torch.randint(3, 380, (L,), generator=gen)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=new_cache()).cache, model)
    keep = [[sorted(torch.randperm(L, generator=gen)[:10 + h].tolist()) for h in range(pre.num_kv_heads)]
            for _ in range(pre.num_layers)]
    return model, pre, Selection.from_lists(keep, L), torch.randint(3, 380, (4,), generator=gen)


def _top(rows, count: int = 3):
    grad_b = rows[rows["metric"] == "positional_sensitivity_b"]
    return grad_b.reindex(grad_b["value"].abs().sort_values(ascending=False).index).head(count)


@pytest.mark.parametrize("variant", ["llama", "llama_yarn", "llama3"])
@pytest.mark.parametrize("condition", ["original", "relay"])
def test_gradient_in_b_matches_exact_one_position_shifts(variant, condition):
    """Sign for the three heads with the largest gradients, magnitude within 25% (not the issue's 20%: on SmolLM2,
    ``tests/acceptance/test_learned_model.py``, +-1 slopes are a median 0.84 of the gradient). A +-1 shift is a large
    step for the fastest rotary plane (one radian per position): a central difference of ``sin(w b)`` over +-1 is
    ``sin(w) / w`` of its derivative (0.84 at ``w = 1``), so integer shifts read 5-20% low on these 3-layer models; the
    small-step test below pins the gradient itself to 3%."""
    model, pre, sel, question = _setup(variant)
    top = _top(positional_sensitivity(model, pre, sel, condition, question, TARGET))
    slopes = finite_shift_slopes(model, pre, sel, condition, question, TARGET,
                                 [(int(r.layer), int(r.head)) for r in top.itertuples()])
    for r in top.itertuples():
        slope = slopes[(int(r.layer), int(r.head))]
        assert slope * r.value > 0, (variant, condition, r.layer, r.head, r.value, slope)
        assert abs(slope - r.value) <= 0.25 * abs(r.value), (variant, condition, r.layer, r.head, r.value, slope)


@pytest.mark.parametrize("condition", ["original", "relay"])
def test_gradient_in_b_matches_a_small_real_valued_shift(condition):
    """The same heads moved by +-0.05 positions (real-valued coordinates): the central difference converges to the
    gradient (within 3%)."""
    from relaylens.conditions.catalogue import Coordinates
    from relaylens.generation.cache import coordinates_of
    from relaylens.generation.single import answer_log_probs

    model, pre, sel, question = _setup("llama_yarn")
    base = coordinates_of(condition, sel)
    for r in _top(positional_sensitivity(model, pre, sel, condition, question, TARGET)).itertuples():
        values = []
        for delta in (-0.05, 0.05):  # the head's keys move away from the question by delta (b grows by delta)
            keys = torch.where(sel.valid, base.key_positions.double() + 0.5, -1.0)  # all +0.5: every key stays >= 0
            keys[r.layer, r.head] -= delta * sel.valid[r.layer, r.head]
            coords = Coordinates("shifted", keys, base.question_start + 0.5)
            with torch.no_grad():
                values.append(float(answer_log_probs(model, pre, sel, coords, question, torch.tensor([TARGET]))[0]))
        slope = (values[1] - values[0]) / 0.1
        assert abs(slope - r.value) <= 0.03 * abs(r.value), (condition, r.layer, r.head, r.value, slope)


def test_rows_follow_the_probes_schema_and_family_points_agree():
    model, pre, sel, question = _setup()
    rows = positional_sensitivity(model, pre, sel, "relay", question, TARGET)
    assert list(rows.columns) == ["layer", "head", "metric", "value"]
    assert set(rows["metric"]) == set(SENSITIVITY_METRICS) and len(rows) == 2 * sel.num_layers * sel.num_kv_heads
    assert rows["value"].abs().max() > 0
    own = positional_sensitivity(model, pre, sel, Geometry(1.0, 1.0, 1.0), question, TARGET)  # relay as a family point
    assert (own["value"] - rows["value"]).abs().max() < 1e-5
    assert not any(p.requires_grad is False for p in model.parameters())  # flags restored after the readout
