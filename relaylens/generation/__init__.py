"""The generation stage: the relocated cache, the synchronised question pass and greedy decoding under coordinate
conditions.

Owns: :mod:`~relaylens.generation.attention` (the ``relaylens`` attention function: per-(layer, kv_head) validity,
causal new tokens, windows measured on condition coordinates; selected only inside a ``with`` block),
:mod:`~relaylens.generation.cache` (kept states gathered per layer, keys relocated to one condition, padded),
:mod:`~relaylens.generation.rows` (batched rows: every (selection, condition) of a record decoded together over one
prefill), :mod:`~relaylens.generation.settings` (the one :class:`DecodeSettings` object a decode carries: limit,
stops, windows, decoding path), :mod:`~relaylens.generation.static` (static-shape decoding: preallocated answer slots,
stops tested on the device, a step that compiles as one graph) with :mod:`~relaylens.generation.stops` (stop rules
from token ids), :mod:`~relaylens.generation.single` (one condition at a time, the differentiable path, the
teacher-forced answer log-likelihood) and :mod:`~relaylens.generation.positions` (real-valued positions of new
tokens).

In: a :class:`~relaylens.model.prefill.PrefillResult`, a :class:`~relaylens.geometry.selection.Selection`, a
condition and the question token ids. Out: :class:`~relaylens.generation.rows.GenerationResult` (answer tokens,
stop reason, the cache for probes). Axes: :mod:`relaylens.geometry`.

May import: :mod:`relaylens.errors`, :mod:`relaylens.model`, :mod:`relaylens.geometry`, :mod:`relaylens.conditions`.
Never probes, scoring, results or anything above.

Exports the stage contract: :func:`build_cache`, :func:`run_rows` (every row of a record, batched) and
:func:`run_condition` (one condition), both returning :class:`GenerationResult` and both taking a
:class:`DecodeSettings`. The other names of the former module
``relaylens.generation`` (now :mod:`relaylens.generation.single`) still resolve here, with a warning, until relaylens
0.3.0 (:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.generation.cache import build_cache
from relaylens.generation.rows import GenerationResult, run_rows
from relaylens.generation.settings import DecodeSettings
from relaylens.generation.single import run_condition

__all__ = ["DecodeSettings", "GenerationResult", "build_cache", "run_condition", "run_rows"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
