"""What a per-unit probe kind reads and returns: the contract of the probe registry (:mod:`relaylens.probes.registry`).

A *unit* is one (record, selector, budget) of a run: one prefill, one selection, and every condition's row decoded
(and, when the spec asks for probes, read by the forward probes). After its rows are done the runner builds one
:class:`UnitContext` and hands it to every enabled probe kind in registry order; each returns :class:`ProbeTables`.

* ``probes``: frames of the ``probes`` table, columns ``layer, head, metric, value, condition, probe_point, source``
  in any order the kind always keeps (the runner adds the unit's key columns ``record_id, selector, budget``);
* ``scores``: rows of the ``scores`` table as ``{"condition", "metric", "value"}`` (the runner adds the unit's key and
  the record's columns around them);
* ``view``: the unit's token view (:mod:`relaylens.probes.token_view`), at most one kind gives one.

Axes: :mod:`relaylens.geometry`. This module imports no other probe: a kind in its own file imports it freely.

Example (a kind is any object with ``name``, ``enabled`` and ``run``):
    >>> class Count:
    ...     name = "count"
    ...     def enabled(self, spec, config):
    ...         return True
    ...     def run(self, unit):
    ...         return ProbeTables(scores=({"condition": "original", "metric": "kept", "value": 3.0},))
    >>> isinstance(Count(), Probe), Count().run(None).scores[0]["metric"]
    (True, 'kept')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class UnitContext:
    """One unit after its rows ran: everything a probe kind may read (nothing here is modified by a probe).

    Attributes:
        model, tokenizer: the loaded model under study and its tokenizer.
        key: the unit's key columns ``{"record_id", "selector", "budget"}`` (``selector`` as labelled in the tables).
        record: the :class:`~relaylens.datasets.records.Record`.
        prompt: its rendered prompt (:mod:`relaylens.datasets.prompting`): ``question_ids`` ``[question]``,
            ``history_ids`` ``[history]``, ``history_length``.
        prefill: the record's history prefill (:class:`~relaylens.model.prefill.PrefillResult`).
        selection: the unit's :class:`~relaylens.geometry.selection.Selection`, shared by every condition.
        evidence: ``[history]`` bool, gold evidence at the spec's granularity.
        spec, config: the run's :class:`~relaylens.experiments.specs.ExperimentSpec` and
            :class:`~relaylens.experiments.config.RunConfig`.
        factors: the model's :class:`~relaylens.geometry.rotary.RotaryFactors`.
        answer_ids: the first reference answer's tokens as they follow the answer cue (empty for abstentions).
        probed: condition label -> its :class:`~relaylens.probes.readouts.ProbedCondition` (forward readouts and
            recorders), in the spec's condition order; empty when the forward probes did not run.
        views: whether this record's token view is due (the first ``config.view_records`` records).
    """

    model: Any
    tokenizer: Any
    key: Mapping[str, Any]
    record: Any
    prompt: Any
    prefill: Any
    selection: Any
    evidence: torch.Tensor  # [history] bool
    spec: Any
    config: Any
    factors: Any
    answer_ids: tuple[int, ...] = ()
    probed: Mapping[str, Any] = field(default_factory=dict)
    views: bool = False

    @property
    def probing(self) -> bool:
        """The forward evidence probes ran: the spec asks for them and the record has gold evidence."""
        return bool(self.spec.probes) and bool(self.evidence.any())

    @property
    def first_answer_token(self) -> int | None:
        """The first token of the first reference answer (None: no answer, e.g. an abstention)."""
        return self.answer_ids[0] if self.answer_ids else None


@dataclass(frozen=True)
class ProbeTables:
    """What one probe kind adds for one unit (each part may be empty)."""

    probes: tuple = ()  # pandas frames of probe rows, without the unit's key columns
    scores: tuple = ()  # {"condition", "metric", "value"} rows
    view: dict | None = None  # the unit's token view


@runtime_checkable
class Probe(Protocol):
    """A per-unit probe kind: a name (unique in the registry), whether a run's spec enables it, and its tables for
    one unit. ``run`` may return empty :class:`ProbeTables` for a unit it cannot read (no answer, no evidence)."""

    name: str

    def enabled(self, spec, config) -> bool: ...

    def run(self, unit: UnitContext) -> ProbeTables: ...
