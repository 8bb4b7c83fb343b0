"""Positional sensitivity: how much the first answer token's log-probability wants each (layer, kv head)'s kept keys
to move, from one backward pass through real-valued positions.

Axes: ``layer``, ``kv_head``, ``slot`` (:mod:`relaylens.geometry`). At a condition with question start ``q`` and
key positions ``k_i`` (distances ``d_i = q - k_i``), each (layer, kv head) gets two parameters around it,

    ``k_i(b, s) = q - b - s * (d_i - b_C)``,   ``b_C = min_i d_i`` (the nearest kept key),   at ``b = b_C, s = 1``,

so ``b`` is the distance from the nearest kept key to the question and ``s`` scales every gap behind it. For the
family's points with ``s = 1`` (``original``, ``relay``, ``key_only``, ``compaction``) these are exactly the family's
``b`` and ``s`` (:mod:`relaylens.conditions.family`); for a :class:`~relaylens.conditions.family.Geometry` or
``learned:RUN_DIR`` condition the readout differentiates its own ``b`` and ``s``. Readouts, per (layer, kv head),
in the probes table (``head`` holds the **kv head** for these two metrics):

* ``positional_sensitivity_b`` = ``d log p(first answer token) / d b`` (nats per position: positive means the model
  wants that head's keys further from the question);
* ``positional_sensitivity_s`` = ``d log p / d s`` (nats per unit of gap scale: positive means wider gaps).

Moving one head's keys by ``+-1`` position (``Scoped(..., move=+-1)``) checks ``b``: :func:`finite_shift_slopes`
gives ``(log p(move=-1) - log p(move=+1)) / 2``, which ``tests/probes/test_sensitivity.py`` compares with the
gradient (sign, and magnitude within 20% for the heads with the largest gradients).

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.geometry.selection import Selection
    >>> from relaylens.generation.single import prefill_from_cache
    >>> model = tiny_model("llama")
    >>> history = torch.arange(3, 33)
    >>> pre = prefill_from_cache(history, model(history[None], use_cache=True).cache, model)
    >>> sel = Selection.from_lists([[[1, 7, 20, 29], [0, 3, 12]]] * 2, pre.history_length)
    >>> rows = positional_sensitivity(model, pre, sel, "relay", torch.tensor([40, 41]), target_token=9)
    >>> sorted(rows["metric"].unique()), len(rows)
    (['positional_sensitivity_b', 'positional_sensitivity_s'], 8)
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from relaylens import moved_name
from relaylens.conditions.catalogue import Condition, Coordinates
from relaylens.conditions.family import Geometry, family_coordinates
from relaylens.conditions.scoped import Scoped, expand_conditions, get_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.probes.unit import ProbeTables, UnitContext
from relaylens.results.tables import SENSITIVITY_METRICS


def around(coords: Coordinates, sel: Selection) -> tuple[Coordinates, torch.Tensor, torch.Tensor]:
    """``(coordinates, b, s)``: ``coords`` re-expressed through per-head ``b`` and ``s`` leaves (float64 ``[layer,
    kv_head]``, requiring grad) at ``b = b_C``, ``s = 1``; the positions are unchanged (real-valued)."""
    start = coords.question_start
    distance = float(start) - coords.key_positions.double()  # [layer, kv_head, slot]
    far = torch.full_like(distance, float("inf"))
    nearest = torch.where(sel.valid, distance, far).min(-1).values  # [layer, kv_head]
    nearest = torch.where(torch.isfinite(nearest), nearest, torch.zeros_like(nearest))
    b = nearest.clone().requires_grad_()
    s = torch.ones_like(nearest, requires_grad=True)
    positions = float(start) - b[..., None] - s[..., None] * (distance - nearest[..., None])
    positions = torch.where(sel.valid, positions, torch.full_like(positions, -1.0))
    return Coordinates(coords.condition, positions, start, coords.at_question), b, s


def positional_sensitivity(model, prefill: PrefillResult, selection: Selection, condition: str | Condition,
                           question_ids: torch.Tensor, target_token: int, factors: RotaryFactors | None = None,
                           window_mode: str = "condition") -> pd.DataFrame:
    """``d log p(target_token) / d b`` and ``d / d s`` per (layer, kv head) at ``condition``: one question pass and one
    backward pass (no weight gradients). Columns ``layer, head, metric, value`` (``head``: the kv head)."""
    from relaylens.generation.cache import coordinates_of  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.single import answer_log_probs, frozen_weights  # noqa: PLC0415 - import cost: transformers loads on first use

    factors = factors or RotaryFactors.from_model(model)
    condition = get_condition(condition)
    with torch.enable_grad(), frozen_weights(model):
        if isinstance(condition, Geometry):  # a point of the family: its own parameters
            b, s, alpha = (p.clone().requires_grad_() if i < 2 else p
                           for i, p in enumerate(condition.parameters(selection.num_layers, selection.num_kv_heads)))
            coords = family_coordinates(selection, b, s, alpha, label=condition.label)
        else:
            coords, b, s = around(coordinates_of(condition, selection), selection)
        log_prob = answer_log_probs(model, prefill, selection, coords, question_ids, torch.tensor([int(target_token)]),
                                    factors, window_mode)[0]
        grad_b, grad_s = torch.autograd.grad(log_prob, (b, s), allow_unused=True)
    records = []
    for metric, grad in zip(SENSITIVITY_METRICS, (grad_b, grad_s)):
        grad = torch.zeros_like(b) if grad is None else grad.detach()
        for layer in range(grad.shape[0]):
            for head in range(grad.shape[1]):
                records.append((layer, head, metric, float(grad[layer, head])))
    return pd.DataFrame(records, columns=["layer", "head", "metric", "value"])


def sensitivity_frames(unit: UnitContext, conditions=None) -> list[pd.DataFrame]:
    """The readout of every condition of ``unit.spec`` (or ``conditions``) on one unit, as probe frames with
    ``condition`` and ``probe_point`` columns; none for a record without a reference answer."""
    target = unit.first_answer_token
    if target is None:
        return []
    frames = []
    for condition in conditions or expand_conditions(unit.spec.conditions, unit.model):
        frame = positional_sensitivity(unit.model, unit.prefill, unit.selection, condition, unit.prompt.question_ids,
                                       target, unit.factors, unit.config.window_mode)
        frames.append(frame.assign(condition=condition.label, probe_point="question_final"))
    return frames


@dataclass(frozen=True)
class SensitivityProbe:
    """The probe kind ``sensitivity`` (:mod:`relaylens.probes.registry`; ``spec.sensitivity``): probe rows with
    ``source = "forward"``, ``head`` the kv head."""

    name: str = "sensitivity"

    def enabled(self, spec, config) -> bool:
        return bool(spec.sensitivity)

    def run(self, unit: UnitContext) -> ProbeTables:
        return ProbeTables(probes=tuple(frame.assign(source="forward") for frame in sensitivity_frames(unit)))


SENSITIVITY = SensitivityProbe()


def finite_shift_slopes(model, prefill: PrefillResult, selection: Selection, condition: str | Condition,
                        question_ids: torch.Tensor, target_token: int, heads, factors: RotaryFactors | None = None,
                        window_mode: str = "condition") -> dict[tuple[int, int], float]:
    """Per ``(layer, kv_head)`` of ``heads``: ``(log p(move=-1) - log p(move=+1)) / 2``, the central finite
    difference in ``b`` from exact integer shifts of that head's keys (``Scoped(condition, heads=..., move=+-1,
    base=condition)``; the other heads stay where ``condition`` puts them)."""
    from relaylens.generation.single import answer_log_probs  # noqa: PLC0415 - import cost: transformers loads on first use

    factors = factors or RotaryFactors.from_model(model)
    condition = get_condition(condition)
    target = torch.tensor([int(target_token)])
    out = {}
    with torch.no_grad():
        for layer, head in heads:
            values = {}
            for move in (-1, 1):
                moved = Scoped(condition, heads=((int(layer), int(head)),), move=move, base=condition)
                values[move] = float(answer_log_probs(model, prefill, selection, moved, question_ids, target, factors,
                                                      window_mode)[0])
            out[(int(layer), int(head))] = (values[-1] - values[1]) / 2.0
    return out


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
