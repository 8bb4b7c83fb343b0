"""The probes stage: how the final question token reads the retained gold evidence under each condition.

Owns: :mod:`~relaylens.probes.readouts` (evidence attention share, evidence value norm, phase replay, the
teacher-forced first answer token; :class:`FinalTokenRecorder`, an attention observer), :mod:`~relaylens.probes.
transformer_lens` (the same readouts from TransformerLens hooks), :mod:`~relaylens.probes.attribution` (gradient x
input and direct logit attribution of the answer to the evidence), :mod:`~relaylens.probes.sensitivity` (positional
sensitivity: the gradient of the first answer token's log-probability w.r.t. each (layer, kv head)'s distance ``b``
and gap scale ``s``), :mod:`~relaylens.probes.layer_sweep` (one layer relocated at a time) and
:mod:`~relaylens.probes.token_view` (the token view's capture).

In: a prefill, a selection, conditions, the question ids and an ``evidence_mask``. Out: long-format rows of the
``probes`` table (:mod:`relaylens.results.tables`). Axes: :mod:`relaylens.geometry`.

May import: :mod:`relaylens.errors`, :mod:`relaylens.registry`, :mod:`relaylens.model`, :mod:`relaylens.geometry`,
:mod:`relaylens.conditions`, :mod:`relaylens.generation`, and the table schema of :mod:`relaylens.results` (metric
names). Never experiments.

Exports the stage contract: :func:`probe_condition` (a condition's generation and readouts), :func:`replay_conditions`
(phase replay over conditions), :class:`FinalTokenRecorder` and the metric names :data:`READOUTS` (forward pass) and
:data:`REPLAY_READOUTS` (phase replay); :func:`gold_slots` (the kept slots that hold gold evidence); and the probe
registry (:mod:`~relaylens.probes.registry`): :data:`PROBES`, :data:`PROBE_KINDS`, :func:`registered`, and the protocol
a probe kind follows, :class:`Probe`, :class:`UnitContext` and :class:`ProbeTables` (:mod:`~relaylens.probes.unit`). The
other names of the former module ``relaylens.probes`` (now :mod:`relaylens.probes.readouts`) still resolve here, with a
warning, until relaylens 0.3.0 (:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.probes.readouts import (
    READOUTS,
    REPLAY_READOUTS,
    FinalTokenRecorder,
    gold_slots,
    probe_condition,
    readouts,  # noqa: F401 - the flat module's function, bound over the submodule's
    replay_conditions,
)
from relaylens.probes.registry import PROBE_KINDS, PROBES, registered
from relaylens.probes.unit import Probe, ProbeTables, UnitContext

# name as before (relaylens.MOVED_NAMES): it goes with the legacy table

__all__ = ["PROBES", "PROBE_KINDS", "READOUTS", "REPLAY_READOUTS", "FinalTokenRecorder", "Probe", "ProbeTables",
           "UnitContext", "gold_slots", "probe_condition", "registered", "replay_conditions"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
