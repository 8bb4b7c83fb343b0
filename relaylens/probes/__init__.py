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

May import: :mod:`relaylens.errors`, :mod:`relaylens.model`, :mod:`relaylens.geometry`, :mod:`relaylens.conditions`,
:mod:`relaylens.generation`, and the table schema of :mod:`relaylens.results` (metric names). Never experiments.

The former module ``relaylens.probes`` is now :mod:`relaylens.probes.readouts`; its names are importable from here.
"""

from relaylens.probes.readouts import (READOUTS, REPLAY_READOUTS, FinalTokenRecorder, ProbedCondition, ReplayContent,
                                       gold_slots, phase_replay, probe_condition, probe_rows, readouts,
                                       replay_conditions, replay_content)

__all__ = ["READOUTS", "REPLAY_READOUTS", "FinalTokenRecorder", "ProbedCondition", "ReplayContent", "gold_slots",
           "phase_replay", "probe_condition", "probe_rows", "readouts", "replay_conditions", "replay_content"]
