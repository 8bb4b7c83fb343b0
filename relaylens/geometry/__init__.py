"""The geometry stage: where kept keys sit in rotary-position space, and the exact relocation that moves them.

Owns: :mod:`~relaylens.geometry.selection` (:class:`Selection`: kept source positions per layer and kv head),
:mod:`~relaylens.geometry.rotary` (:class:`RotaryFactors`, the model's own rotary factors; rotation maths;
:func:`relocate_keys`), :mod:`~relaylens.geometry.fused` (the dispatcher of the fused CPU relocation kernel: tables,
threads, fallbacks) and :mod:`~relaylens.geometry.numba_source` (the kernel's numba source, imported only when numba
is installed).

In: keys ``[..., n, head_dim]`` with source and target positions; a loaded model (for its rotary factors).
Out: relocated keys (``K' = R(target) R(source)^-1 K``, float32 arithmetic, cast back to the cache dtype).

May import: :mod:`relaylens.errors`, :mod:`relaylens.model` (rotary factors are read through
:mod:`relaylens.model.hf`). Never generation, probes or anything above them.

Axis glossary (every shape comment in relaylens uses these names; other modules point here instead of keeping
their own):

* ``layer``    decoder layer index ``0..num_layers-1``.
* ``kv_head``  physical key/value head of a layer (grouped-query attention shares one among ``groups`` query heads).
* ``q_head``   query head; its kv head is ``q_head // groups``.
* ``slot``     index of a kept state inside its kv head, in ascending source order; valid slots first, padding after
  (``-1`` positions, a ``valid`` mask).
* ``pos``      a history position ``0..L-1`` (source coordinates); ``L`` the history length.
* ``head_dim`` feature axis of one head; the first ``rotary_dim`` features rotate, the rest pass unchanged.
* ``plane``    one rotary pair of features (split-half: ``(j, j + rotary_dim/2)``; interleaved: ``(2j, 2j+1)``).
* ``Q``        number of question tokens; ``M`` the largest kept count over (layer, kv_head); ``m`` one head's count.
* ``batch_row`` one (selection, condition) row of a batched question pass / decode (:mod:`relaylens.generation.rows`).

Names say what things are: ``source_positions`` (where a key was computed), ``compact_positions`` / ``key_positions``
(where a condition puts it), ``question_start`` (the first question token's position), ``evidence_mask``.

The former module ``relaylens.geometry`` is now :mod:`relaylens.geometry.rotary`; its names are importable from here.
"""

from relaylens.geometry.rotary import (DYNAMIC_ROPE_TYPES, NOPE, STATIC_ROPE_TYPES, RotaryFactors, multiply_planes,
                                       relocate_keys, rotate_keys, unrotate_keys)
from relaylens.geometry.selection import PAD_POSITION, Selection

__all__ = ["DYNAMIC_ROPE_TYPES", "NOPE", "PAD_POSITION", "STATIC_ROPE_TYPES", "RotaryFactors", "Selection",
           "multiply_planes", "relocate_keys", "rotate_keys", "unrotate_keys"]
