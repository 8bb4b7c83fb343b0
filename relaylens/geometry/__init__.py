"""The geometry stage: where kept keys sit in rotary-position space, and the exact relocation that moves them.

Owns: :mod:`~relaylens.geometry.selection` (:class:`Selection`: kept source positions per layer and kv head),
:mod:`~relaylens.geometry.rotary` (:class:`RotaryFactors`, the model's own rotary factors; rotation maths;
:func:`relocate_keys`), :mod:`~relaylens.geometry.real` (relocation to real-valued positions, differentiable in them),
:mod:`~relaylens.geometry.fused` (the dispatcher of the fused CPU relocation kernel: tables, threads, fallbacks) and
:mod:`~relaylens.geometry.numba_source` (the kernel's numba source, imported only when numba is installed).

In: keys ``[..., n, head_dim]`` with source and target positions; a loaded model (for its rotary factors).
Out: relocated keys (``K' = R(target) R(source)^-1 K``, float32 arithmetic, cast back to the cache dtype). Positions
are integers, or real values (floating point: :mod:`~relaylens.geometry.real`).

May import: :mod:`relaylens.errors`, :mod:`relaylens.model` (rotary factors are read through
:mod:`relaylens.model.hf`). Never generation, probes or anything above them.

Axis glossary (every shape comment in relaylens uses these names; other modules point here instead of keeping
their own):

* ``layer``      decoder layer index ``l``.
* ``kv_head``    physical key/value head ``h`` of a layer (grouped-query attention shares one among ``group`` query
  heads).
* ``q_head``     query head; its kv head is ``q_head // group`` (``q_head = kv_head * group + r``).
* ``group``      query heads per kv head (``num_key_value_groups``, ``g``).
* ``head``       a query head in result tables and figures (the ``head`` column of the probes table).
* ``slot``       index of a kept state inside its kv head, in ascending source order; valid slots first, padded
  slots after them (position ``-1``, ``valid`` False), padded to the widest head of the layer (or of the batch).
* ``pos``        a history position ``0..L-1`` (source coordinates); ``L`` the history length.
* ``window``     the last ``w`` history positions (the observation window of SnapKV and friends); ``prefix`` the
  positions before it, ``0..L-w-1``.
* ``head_dim``   feature axis of one head; the first ``rotary_dim`` features rotate, the rest pass unchanged.
* ``plane``      one rotated 2-D plane (``rotary_dim // 2`` of them): split-half layouts pair features
  ``(j, j + rotary_dim/2)``, interleaved layouts pair ``(2j, 2j + 1)``.
* ``hidden``     the residual stream of the model.
* ``query``      the new tokens of one forward call (question tokens, a teacher-forced token, a decoded token);
  ``key``  the keys one of them attends to (the layer's cached history slots, then the new tokens so far);
  ``n``    the tokens of one forward; ``block`` the query positions of one block of the column-sum capture.
* ``batch_row``  one (selection, condition) of a record in a batched question pass or decode
  (:mod:`relaylens.generation.rows`; shape comments write ``row``); ``B`` a batch.
* ``Q``          question tokens; ``T`` new tokens fed so far; ``M`` the largest kept count over (layer, kv_head);
  ``m`` one head's kept count.

Two more uses of the word *row*, always qualified: an *attention row* is one query's softmax over its keys (what
probes record for the final question token; FINCH's question rows, Scissorhands' window rows), and a *key row* is one
key vector of the flattened ``[N, head_dim]`` keys the fused relocation kernel walks
(:func:`relaylens.geometry.fused.relocate_key_rows`).

Frames: the *source frame* holds the positions ``p`` keys were cached at; the *compact frame* the positions ``p'``
a coordinate condition assigns (RoPERelay: ``M - m + i``, right-aligned at ``M - 1``). Names say what things are:
``source_positions`` (where a key was computed), ``compact_positions`` / ``key_positions`` (where a condition puts
it), ``question_start`` (the first question token's position), ``evidence_mask``.

Exports the stage contract: :class:`Selection`, :class:`RotaryFactors` and :func:`relocate_keys`. The other names of
the former module ``relaylens.geometry`` (now :mod:`relaylens.geometry.rotary`) still resolve here, with a warning,
until relaylens 0.3.0 (:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.geometry.selection import Selection

__all__ = ["RotaryFactors", "Selection", "relocate_keys"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
