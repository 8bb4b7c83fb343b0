"""The generation stage: the relocated cache, the synchronised question pass and greedy decoding under coordinate
conditions.

Owns: :mod:`~relaylens.generation.attention` (the ``relaylens`` attention function: per-(layer, kv_head) validity,
causal new tokens, windows measured on condition coordinates; selected only inside a ``with`` block),
:mod:`~relaylens.generation.cache` (kept states gathered per layer, keys relocated to one condition, padded),
:mod:`~relaylens.generation.rows` (batched rows: every (selection, condition) of a record decoded together over one
prefill), :mod:`~relaylens.generation.single` (one condition at a time, the differentiable path, the teacher-forced
answer log-likelihood) and :mod:`~relaylens.generation.positions` (real-valued positions of new tokens).

In: a :class:`~relaylens.model.prefill.PrefillResult`, a :class:`~relaylens.geometry.selection.Selection`, a
condition and the question token ids. Out: :class:`~relaylens.generation.rows.GenerationResult` (answer tokens,
stop reason, the cache for probes). Axes: :mod:`relaylens.geometry`.

May import: :mod:`relaylens.errors`, :mod:`relaylens.model`, :mod:`relaylens.geometry`, :mod:`relaylens.conditions`.
Never probes, scoring, results or anything above.

The former module ``relaylens.generation`` is now :mod:`relaylens.generation.single`; its names are importable from
here.
"""

from relaylens.generation.single import prefill_from_cache, run_condition

__all__ = ["prefill_from_cache", "run_condition"]
