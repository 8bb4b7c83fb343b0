"""Per-layer causal sweep: RoPERelay geometry in one layer only (and in layers ``0..l``), one question pass each.

The activation-patching view of RoPERelay. For every layer ``l`` of the model the sweep runs two scoped conditions
on the unit's shared selection, question pass only (no decoding):

* ``relay@layers=l`` (relay in layer ``l`` only, ``original`` everywhere else): the per-layer effect;
* ``relay@layers=0-l`` (relay in layers ``0..l``): the cumulative curve, ending at relay everywhere;

plus ``original`` as the paired reference (the ``layer_scope`` figure draws the curves:
:func:`relaylens.reporting.figures.layer_scope.sweep_curves`). It reads two things per condition:

* ``first_answer_logprob``: the log-probability the final question token gives the first reference-answer token
  (teacher-forced: the correct token is scored, whatever greedy decoding would pick); a row of the ``scores`` table;
* ``evidence_share`` of the final question token per (layer, query head), from the real forward pass; rows of the
  ``probes`` table with ``source = "sweep"`` (so per-layer tables of the main conditions never mix them in).

Cost: ``2 L - 1`` extra question passes per (record, selector, budget) for an ``L``-layer model (``relay@layers=0``
is both the first per-layer and the first cumulative condition), plus one for ``original``.

Example:
    >>> [c.label for c in sweep_conditions(3)]
    ['original', 'relay@layers=0', 'relay@layers=1', 'relay@layers=2', 'relay@layers=0-1', 'relay@layers=0-2']
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from relaylens.conditions.catalogue import Condition, Original, Relay
from relaylens.conditions.scoped import Scoped
from relaylens.probes.readouts import FinalTokenRecorder, gold_slots, readouts
from relaylens.probes.unit import ProbeTables, UnitContext
from relaylens.results.tables import FIRST_ANSWER_LOGPROB as LOGPROB_METRIC
from relaylens.results.tables import SWEEP_SOURCE

SWEEPS = ("layers",)


def sweep_conditions(num_layers: int) -> list[Condition]:
    """``original``, then relay in each single layer, then relay in layers ``0..l`` for ``l >= 1``."""
    single = [Scoped(Relay(), layers=(layer,)) for layer in range(num_layers)]
    cumulative = [Scoped(Relay(), layers=tuple(range(layer + 1))) for layer in range(1, num_layers)]
    return [Original(), *single, *cumulative]


def layer_sweep(model, prefill, selection, question_ids: torch.Tensor, evidence_mask: torch.Tensor | None,
                teacher_token: int | None, factors, window_mode: str = "condition") -> tuple[list[dict], pd.DataFrame]:
    """Run the sweep on one unit: ``(score rows, probe rows)``.

    Score rows carry ``condition``, ``metric = first_answer_logprob`` and ``value`` (none when the record has no
    reference answer token); probe rows carry ``condition, probe_point, source, layer, head, metric, value`` with
    ``metric = evidence_share`` (none without evidence annotations). The caller adds the unit's key columns.
    """
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    gold = gold_slots(selection, evidence_mask) if evidence_mask is not None else None
    scores, frames = [], []
    for condition in sweep_conditions(selection.num_layers):
        recorder = FinalTokenRecorder()
        result = run_condition(model, prefill, selection, condition, question_ids, max_new_tokens=0, factors=factors,
                               window_mode=window_mode, observers=[recorder] if gold is not None else None)
        if teacher_token is not None:
            logprob = torch.log_softmax(result.last_logits.double(), dim=-1)[int(teacher_token)]
            scores.append({"condition": condition.label, "metric": LOGPROB_METRIC, "value": float(logprob)})
        if gold is not None:
            table = readouts(recorder, selection, gold, prefill.num_key_value_groups)
            frames.append(table[table["metric"] == "evidence_share"].assign(
                condition=condition.label, probe_point="question_final", source=SWEEP_SOURCE))
    probes = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return scores, probes


@dataclass(frozen=True)
class LayerSweepProbe:
    """The probe kind ``layer_sweep`` (:mod:`relaylens.probes.registry`; ``spec.sweep == "layers"``): its
    ``first_answer_logprob`` score rows and its ``source = "sweep"`` probe rows (evidence share only when the
    forward probes ran)."""

    name: str = "layer_sweep"

    def enabled(self, spec, config) -> bool:
        return spec.sweep == "layers"

    def run(self, unit: UnitContext) -> ProbeTables:
        scores, probes = layer_sweep(unit.model, unit.prefill, unit.selection, unit.prompt.question_ids,
                                     unit.evidence if unit.probing else None, unit.first_answer_token, unit.factors,
                                     unit.config.window_mode)
        return ProbeTables(probes=(probes,) if len(probes) else (), scores=tuple(scores))


LAYER_SWEEP = LayerSweepProbe()
