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

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from relaylens.errors import RelaylensError


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


PROBE_ROW_KINDS = {"layer": "int", "head": "int", "metric": "str", "value": "float", "condition": "str",
                   "probe_point": "str", "source": "str"}
"""The columns of a probe kind's ``probes`` frames and the kind of value each holds (the ``probes`` table's, without
the unit's key columns)."""
SCORE_ROW_KINDS = {"condition": "str", "metric": "str", "value": "float"}
"""The fields of a probe kind's ``scores`` rows and the kind of value each holds."""


def _fits(kind: str, value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if kind == "int":
        return isinstance(value, numbers.Integral)
    if kind == "float":
        return value is None or isinstance(value, numbers.Real)  # NaN / None: a missing reading
    return isinstance(value, str)


def check_tables(kind: str, tables: "ProbeTables") -> "ProbeTables":
    """``tables`` when every part holds what the tables expect: ``probes`` a sequence of pandas frames with exactly the
    columns of :data:`PROBE_ROW_KINDS` and values of their kinds, ``scores`` a sequence of mappings with exactly the
    fields of :data:`SCORE_ROW_KINDS`, ``view`` None or a dict. A malformed part is refused with one
    :class:`~relaylens.errors.RelaylensError` naming the probe ``kind``, the row and the field (not a ``TypeError``
    after the unit's decoding, naming neither).

    >>> check_tables("count", ProbeTables(scores=({"condition": "relay", "metric": "kept", "value": 3.0},))).scores[0]
    {'condition': 'relay', 'metric': 'kept', 'value': 3.0}
    >>> try:
    ...     check_tables("count", ProbeTables(scores=({"condition": "relay", "metric": "kept", "value": "3"},)))
    ... except RelaylensError as err:
    ...     print(str(err).split(";")[0])
    probe kind 'count' returned a malformed scores row 0: field 'value' holds '3' (str), expected a float
    """
    import pandas as pd  # noqa: PLC0415 - import cost: pandas loads only when a probe kind ran

    def refuse(what: str) -> RelaylensError:
        return RelaylensError(f"probe kind {kind!r} returned {what}; the unit's rows cannot be stored. Fix: return "
                              "relaylens.probes.unit.ProbeTables(probes=(frames with columns "
                              f"{', '.join(PROBE_ROW_KINDS)}), scores=(rows with {', '.join(SCORE_ROW_KINDS)}), "
                              "view=dict or None)")

    def check_row(part: str, n, row: Mapping, kinds: dict) -> None:
        if set(row) != set(kinds):
            missing, extra = sorted(set(kinds) - set(row)), sorted(set(row) - set(kinds), key=str)
            raise refuse(f"a malformed {part} row {n}: missing fields {missing}, unexpected fields {extra}")
        for name, want in kinds.items():
            if not _fits(want, row[name]):
                raise refuse(f"a malformed {part} row {n}: field {name!r} holds {row[name]!r} "
                             f"({type(row[name]).__name__}), expected a{'n' if want == 'int' else ''} {want}")

    for part in ("probes", "scores"):
        if isinstance(getattr(tables, part), (str, bytes, Mapping, pd.DataFrame)) or not hasattr(
                getattr(tables, part), "__iter__"):
            raise refuse(f"{part} as {type(getattr(tables, part)).__name__}, expected a tuple")
    for i, frame in enumerate(tables.probes):
        if not isinstance(frame, pd.DataFrame):
            raise refuse(f"probes part {i} as {type(frame).__name__}, expected a pandas DataFrame")
        if set(frame.columns) != set(PROBE_ROW_KINDS):
            missing = sorted(set(PROBE_ROW_KINDS) - set(frame.columns))
            extra = sorted(set(frame.columns) - set(PROBE_ROW_KINDS), key=str)
            raise refuse(f"a malformed probes frame {i}: missing columns {missing}, unexpected columns {extra}")
        for n, row in enumerate(frame.to_dict("records")):
            check_row("probes", f"{n} of frame {i}", row, PROBE_ROW_KINDS)
    for n, row in enumerate(tables.scores):
        if not isinstance(row, Mapping):
            raise refuse(f"a malformed scores row {n}: {type(row).__name__}, expected a mapping")
        check_row("scores", n, row, SCORE_ROW_KINDS)
    if tables.view is not None and not isinstance(tables.view, dict):
        raise refuse(f"a view as {type(tables.view).__name__}, expected a dict or None")
    return tables


@runtime_checkable
class Probe(Protocol):
    """A per-unit probe kind: a name (unique in the registry), whether a run's spec enables it, and its tables for
    one unit. ``run`` may return empty :class:`ProbeTables` for a unit it cannot read (no answer, no evidence)."""

    name: str

    def enabled(self, spec, config) -> bool: ...

    def run(self, unit: UnitContext) -> ProbeTables: ...
