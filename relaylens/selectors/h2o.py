"""H2O: heavy hitters by accumulated attention over all history queries, plus the most recent tokens.

Reference: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models"
(arXiv 2306.14048), FMInference/H2O; ``reference/selectors.md`` §2 H2O. The column sums come from
:func:`relaylens.model.prefill.prefill_history` with ``column_sums=True`` (query blocks, no ``L x L``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import BudgetError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import (
    GQA_REDUCTIONS,
    Budget,
    Selector,
    check_choice,
    check_kernel,
    pool_scores,
    reduce_gqa,
    resolve_budget,
    selection_with_window,
    top_positions,
)


def column_sums_of(prefill: PrefillResult) -> list[torch.Tensor]:
    """The per-layer ``[q_head, L]`` column sums of ``prefill.column_sums``, checked against the prefill."""
    sums = prefill.column_sums
    if sums is None:
        raise ShapeError(
            "H2O needs prefill.column_sums (per layer [q_head, L] causal attention column sums); capture them in the "
            "same pass with `prefill_history(model, ids, column_sums=True)`"
        )
    length, q_heads = prefill.history_length, prefill.num_kv_heads * prefill.num_key_value_groups
    if len(sums) != prefill.num_layers:
        raise ShapeError(f"{len(sums)} layers of column sums for a {prefill.num_layers}-layer prefill")
    for l, s in enumerate(sums):
        if tuple(s.shape) != (q_heads, length):
            raise ShapeError(f"layer {l}: column sums must be [{q_heads}, {length}] ([q_head, L]); "
                             f"got {tuple(s.shape)}")
    return sums


@dataclass(frozen=True)
class H2O(Selector):
    """Per (layer, kv head): the last ``R`` positions plus ``topk(s_h, K - R)`` among ``j < L - R``.

    ``s_h(j)`` is the causal column sum ``sum_{i >= j} a[i, j]`` over every history query, reduced over the query
    heads of the kv head (mean). Every head keeps exactly ``K`` states; sets differ across heads.
    Scores of heavy hitters are ``s_h``; recent states get ``1 + max``.

    Parameters:
        recent_ratio: ``R = floor(recent_ratio * K)`` (0.5: half the budget recent, half heavy, like the paper's
            equal split). ``recent_size`` (absolute ``R``, e.g. ``w`` as in KVCache-Factory) overrides it.
        normalize: divide ``s(j)`` by the number of queries that see key ``j`` (``L - j``), as kvpress's
            ``ObservedAttentionPress``; off by default (raw sums, as FMInference/H2O).
        gqa_reduction: ``"mean"`` (default), ``"max"`` or ``"sum"``.
        kernel_size, pooling: optional pooling of the scores (none by default, as H2O).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> pre = random_prefill(length=64)
        >>> pre.column_sums = [torch.rand(4, 64) for _ in range(2)]
        >>> H2O().select(pre, None, 0.25).counts.tolist()
        [[16, 16], [16, 16]]
    """

    recent_ratio: float = 0.5
    recent_size: int | None = None
    normalize: bool = False
    gqa_reduction: str = "mean"
    kernel_size: int = 1
    pooling: str = "none"

    name: ClassVar[str] = "h2o"
    needs_column_sums: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.recent_ratio <= 1.0:
            raise RelaylensError(f"H2O recent_ratio must lie in [0, 1]; got {self.recent_ratio!r}")
        if self.recent_size is not None and (not isinstance(self.recent_size, int) or self.recent_size < 0):
            raise RelaylensError(f"H2O recent_size must be a non-negative int or None; got {self.recent_size!r}")
        check_choice("gqa_reduction", self.gqa_reduction, GQA_REDUCTIONS)
        check_kernel(self.kernel_size, self.pooling)

    def recent(self, k: int) -> int:
        """``R`` for a budget of ``K`` states."""
        r = self.recent_size if self.recent_size is not None else math.floor(self.recent_ratio * k)
        if r > k:
            raise BudgetError(f"H2O recent_size {r} exceeds the budget K={k}; lower recent_size or raise the budget")
        return r

    def scores(self, prefill: PrefillResult) -> torch.Tensor:
        """``[layer, kv_head, L]`` float32 heavy-hitter scores (GQA-reduced, optionally normalised; unpooled)."""
        length, kv_heads = prefill.history_length, prefill.num_kv_heads
        out = []
        for s in column_sums_of(prefill):
            s = reduce_gqa(s.float().view(kv_heads, -1, length), self.gqa_reduction)  # [kv_head, L]
            if self.normalize:
                s = s / torch.arange(length, 0, -1, device=s.device, dtype=torch.float32)  # L - j queries see j
            out.append(s.cpu())
        return torch.stack(out)

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        r = self.recent(k)
        scores = pool_scores(self.scores(prefill)[..., : length - r], self.kernel_size,
                             self.pooling)  # [layer, kv_head, L-R]
        keep = top_positions(scores, k - r)  # [layer, kv_head, K-R]
        info = {"selector": self.name, "budget": k, "recent": r, "heavy": k - r}
        return selection_with_window([list(layer) for layer in keep], scores, length, r, info)
