"""FINCH as a relaylens pipeline: the question takes part in the compression, and the cache gets FINCH's coordinates.

Reference: Corallo & Papotti, "FINCH: Prompt-guided Key-Value Cache Compression for Large Language Models" (TACL
2024); the semantics follow kvpress's ``FinchPress`` (which its authors state is bit-exact with their code) and its
``chunk_length`` variant. This file is written from that description, not from their code.

What FINCH does here, for a history of ``L`` tokens and a question of ``Q`` tokens (the definition the tests check):

1. **Question-window attention.** The question tokens are appended after the whole history (the rendered prompt's
   history/question boundary plays the delimiter: kvpress inserts a delimiter token and then removes it from the
   input, so the model never sees it) and run once at positions ``L .. L+Q-1`` over the full, uncompressed cache.
   Row ``r`` is the softmax of question token ``r`` over all ``L`` history keys and the question keys ``0..r``.
2. **Score.** ``s_q(j) = mean_r  w_r * a_q[r, j]`` over the question rows, with ``w_r = L + r`` (the number of keys
   before the row: FinchPress's normalisation, which makes rows with many visible keys comparable) or ``w_r = 1``
   when ``normalize=False``; then ``s_h(j) = mean`` over the query heads of kv head ``h``. No pooling.
3. **Chunks.** The history is split into chunks of ``chunk_size`` tokens from position 0 (the last one partial).
   The budget ``K`` is shared out over chunks in proportion to their lengths (largest remainder, so the shares
   sum to ``K`` exactly) and each chunk keeps its top-``k_c`` states per (layer, kv head), ties to the later
   position. ``chunk_size=None`` is one chunk (plain top-``K``).
4. **Question window.** The complete question is retained: it is never a candidate for eviction and does not count
   in ``K`` (as every relaylens selector, FINCH keeps ``K`` history states). Unlike kvpress, whose cache keeps the
   question keys/values computed over the full context, relaylens re-encodes the question over the compressed
   cache in the shared question pass, so FINCH and the selectors it is compared with decode identically.
5. **Coordinates.** FINCH re-rotates the kept states to compact positions: kept history states at ``0..K-1`` in
   source order (the same for every head, since every head keeps ``K``), the question from ``K`` and the first
   generated token at ``K+Q``. That is the ``rank_sync`` condition; with equal counts it coincides with ``relay``
   (``M - m + i = i`` when ``m = M``). :attr:`Finch.coordinates` names it and ``Selection.info`` reports it.

Axes: ``layer``, ``kv_head``, ``q_head``, ``pos`` (:mod:`relaylens.geometry`); ``row`` is one question token's attention
row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from relaylens.errors import RelaylensError, ShapeError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import (
    GQA_REDUCTIONS,
    Budget,
    Selector,
    check_choice,
    largest_remainder,
    reduce_gqa,
    resolve_budget,
    selection_from_keep,
    top_positions,
)

#: the coordinate condition FINCH's own re-rotation amounts to (see the module docstring, point 5)
FINCH_COORDINATES = "rank_sync"


@dataclass(frozen=True)
class QuestionAttention:
    """The question-window attention of one record (steps 1-2 before the GQA reduction), per layer ``[q_head, L]``
    float32: ``plain`` = ``mean_r a[r, j]``, ``weighted`` = ``mean_r (L + r) * a[r, j]``."""

    plain: list[torch.Tensor]
    weighted: list[torch.Tensor]


def question_attention(model, prefill: PrefillResult, question_ids: torch.Tensor, factors=None) -> QuestionAttention:
    """Run the question once at ``L .. L+Q-1`` over the full cache (the ``original`` condition of a keep-everything
    selection, through the same attention function as every question pass) and average the question tokens'
    softmax rows over the history keys, read from an attention observer."""
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    length = prefill.history_length
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    weights = torch.arange(question_ids.numel(), dtype=torch.float32) + length  # [Q] keys before each question row
    plain: dict[int, torch.Tensor] = {}
    weighted: dict[int, torch.Tensor] = {}

    def observe(layer, query, key, value, probs, state):  # probs [1, q_head, Q, L + Q]
        rows = probs[0, :, :, :length].float()  # [q_head, Q, L]
        plain[layer] = rows.mean(1).cpu()  # [q_head, L]
        weighted[layer] = (rows * weights.to(rows.device)[None, :, None]).mean(1).cpu()  # [q_head, L]

    full = Selection.full(length, prefill.num_layers, prefill.num_kv_heads)
    run_condition(model, prefill, full, "original", question_ids, max_new_tokens=0, factors=factors,
                  observers=[observe])
    if sorted(plain) != list(range(prefill.num_layers)):
        raise ShapeError(f"the question pass reported attention for layers {sorted(plain)} of {prefill.num_layers}")
    return QuestionAttention([plain[l] for l in range(prefill.num_layers)],
                             [weighted[l] for l in range(prefill.num_layers)])


def chunk_quotas(history_length: int, chunk_size: int | None, budget: int) -> list[tuple[int, int, int]]:
    """``(start, end, k_c)`` per chunk: chunks of ``chunk_size`` from 0, ``k_c`` the largest-remainder shares of
    ``budget`` in proportion to chunk lengths (they sum to ``budget`` exactly).

    >>> chunk_quotas(10, 4, 5)
    [(0, 4, 2), (4, 8, 2), (8, 10, 1)]
    """
    size = chunk_size or history_length
    bounds = [(a, min(a + size, history_length)) for a in range(0, history_length, size)]
    lengths = torch.tensor([b - a for a, b in bounds], dtype=torch.float64)
    quotas = largest_remainder(lengths * budget / history_length, budget)
    return [(a, b, int(k)) for (a, b), k in zip(bounds, quotas)]


@dataclass(frozen=True)
class Finch(Selector):
    """Prompt-guided selection: per chunk, the history states the question attends to most (module docstring).

    Parameters:
        chunk_size: history tokens per chunk (512); ``None`` for a single chunk.
        normalize: weight question row ``r`` by its ``L + r`` preceding keys before averaging (True, as FinchPress).
        gqa_reduction: ``"mean"`` (default, as FinchPress), ``"max"`` or ``"sum"`` over a kv head's query heads.

    The question-window attention of a record is captured by :meth:`prepare` (the runner calls it once per record,
    after the prefill), which returns a copy of the selector carrying it (``question_attention``); :meth:`select`
    reads it from there. Both row weightings are kept, so any ``normalize`` / ``chunk_size`` copy
    (``dataclasses.replace``) selects from one capture.

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> captured = QuestionAttention([torch.rand(4, 64) for _ in range(2)], [torch.rand(4, 64) for _ in range(2)])
        >>> sel = Finch(chunk_size=16, question_attention=captured).select(random_prefill(length=64), None, 0.25)
        >>> sel.counts.tolist(), sel.info["coordinates"]
        ([[16, 16], [16, 16]], 'rank_sync')
    """

    chunk_size: int | None = 512
    normalize: bool = True
    gqa_reduction: str = "mean"
    question_attention: QuestionAttention | None = field(default=None, repr=False, compare=False)

    name: ClassVar[str] = "finch"
    needs_prompt: ClassVar[bool] = True
    coordinates: ClassVar[str] = FINCH_COORDINATES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size is not None and (isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int)
                                            or self.chunk_size < 1):
            raise RelaylensError(f"FINCH chunk_size must be a positive int or None; got {self.chunk_size!r}")
        if not isinstance(self.normalize, bool):
            raise RelaylensError(f"FINCH normalize must be True or False; got {self.normalize!r}")
        check_choice("gqa_reduction", self.gqa_reduction, GQA_REDUCTIONS)

    def prepare(self, model, prefill: PrefillResult, prompt, factors=None) -> Finch:
        """A copy of this selector carrying the record's question attention (steps 1-2): one question pass over
        the full cache."""
        if prompt is None:
            raise RelaylensError("FINCH needs the rendered prompt: its question tokens score the history")
        return replace(self, question_attention=question_attention(model, prefill, prompt.question_ids, factors))

    def scores(self, prefill: PrefillResult) -> torch.Tensor:
        """``s_h(j)``: ``[layer, kv_head, L]`` float32."""
        if self.question_attention is None:
            raise ShapeError("FINCH has no question attention for this record; select with the copy returned by "
                             "Finch.prepare(model, prefill, prompt) (the runner does this)")
        sums = self.question_attention.weighted if self.normalize else self.question_attention.plain
        length, kv_heads = prefill.history_length, prefill.num_kv_heads
        q_heads = kv_heads * prefill.num_key_value_groups
        if len(sums) != prefill.num_layers or any(tuple(s.shape) != (q_heads, length) for s in sums):
            raise ShapeError(f"FINCH question attention must be {prefill.num_layers} layers of [{q_heads}, {length}] "
                             f"([q_head, L]) for this prefill; got {[tuple(s.shape) for s in sums]}. Prepare FINCH "
                             "on the same record's prefill")
        return torch.stack([reduce_gqa(s.float().view(kv_heads, -1, length), self.gqa_reduction) for s in sums]).cpu()

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        scores = self.scores(prefill)  # [layer, kv_head, L]
        quotas = chunk_quotas(length, self.chunk_size, k)
        kept = torch.cat([a + top_positions(scores[..., a:b], kc) for a, b, kc in quotas],
                         dim=-1)  # [layer, kv_head, K]
        keep = [list(layer) for layer in kept]
        kept_scores = [[scores[l, h][p] for h, p in enumerate(layer)] for l, layer in enumerate(keep)]
        info = {"selector": self.name, "budget": k, "chunk_size": self.chunk_size, "chunks": len(quotas),
                "coordinates": self.coordinates, "question_window": "complete"}
        return selection_from_keep(keep, kept_scores, length, info)
