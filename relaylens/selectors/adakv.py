"""Ada-KV: SnapKV scores with head-wise budgets inside each layer, allocated from a cross-head top-k.

Reference: Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation" (arXiv 2407.11550),
FFY0/AdaKV ``AdaptiveSnapKVCluster``; ``reference/selectors.md`` §2 Ada-KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import RelaylensError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import (
    Budget,
    WindowSelector,
    largest_remainder,
    resolve_budget,
    selection_with_window,
    top_positions,
)


def adaptive_head_budgets(scores: torch.Tensor, prefix_budget: int, floor_alpha: float = 0.2) -> torch.Tensor:
    """Non-window states per kv head of one layer, ``[kv_head]`` long, summing exactly to ``H_kv * B``.

    1. Flatten ``scores [kv_head, prefix]`` and take the global top-``H_kv * B`` (ties go to the larger head-major
       flat index: the higher head, then the later position); ``c_h`` = entries of head ``h``.
    2. Floor: ``t_h = (1 - alpha) c_h + alpha B``; ``sum_h t_h = H_kv B`` exactly.
    3. Round by largest remainder (= ``round`` with the remainder redistributed) so the total stays exact.

    Example:
        >>> s = torch.tensor([[9., 8., 7., 6.], [1., 2., 0., 0.]])
        >>> adaptive_head_budgets(s, 2, floor_alpha=0.0).tolist(), adaptive_head_budgets(s, 2, floor_alpha=0.5).tolist()
        ([4, 0], [3, 1])
    """
    kv_heads, prefix = scores.shape
    total = kv_heads * prefix_budget
    flat = scores.reshape(-1)  # [kv_head * prefix], head-major
    chosen = top_positions(flat, total)  # [H_kv * B] flat indices
    counts = torch.bincount(chosen // prefix, minlength=kv_heads).double()  # [kv_head] c_h
    targets = (1.0 - floor_alpha) * counts + floor_alpha * prefix_budget
    return largest_remainder(targets, total)


@dataclass(frozen=True)
class AdaKV(WindowSelector):
    """Head ``h`` of layer ``l`` keeps its own ``topk(ŝ_h, c'_h)`` plus the window (:func:`adaptive_head_budgets`).

    Every layer keeps exactly ``H_kv * K`` states; per-head counts differ. Scores as in SnapKV.

    Parameters:
        floor_alpha: share of the per-head budget guaranteed to every head (0.2, as in AdaKV's LongBench runs and
            KVCache-Factory ``init_adakv``; the AdaKV README uses 0.5).
        normalize: multiply each head's scores by (its top-``B`` mass / its total mass) before the cross-head top-k
            (KVCache-Factory); off by default (AdaKV).
        window, kernel_size, pooling, gqa_reduction, pool_per_query_head: as in :class:`SnapKV` (32, 7, max, mean).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = AdaKV(window=8).select(random_prefill(length=96, num_kv_heads=4), None, 0.25)
        >>> sel.counts.sum(-1).tolist()
        [96, 96]
    """

    floor_alpha: float = 0.2
    normalize: bool = False

    name: ClassVar[str] = "adakv"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.floor_alpha <= 1.0:
            raise RelaylensError(f"AdaKV floor_alpha must lie in [0, 1]; got {self.floor_alpha!r}")

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length, self.window, "AdaKV")
        b = k - self.window
        scores = self.scorer.scores(prefill)  # [layer, kv_head, L-w]
        if self.normalize and b > 0:
            top_mass = scores.topk(b, dim=-1).values.sum(-1, keepdim=True)  # [layer, kv_head, 1]
            scores = scores * top_mass / scores.sum(-1, keepdim=True).clamp_min(1e-30)
        prefix_keep, head_counts = [], []
        for l in range(prefill.num_layers):
            caps = adaptive_head_budgets(scores[l], b, self.floor_alpha)  # [kv_head]
            head_counts.append((caps + self.window).tolist())
            prefix_keep.append([top_positions(scores[l, h], int(caps[h])) for h in range(scores.shape[1])])
        info = {"selector": self.name, "budget": k, "window": self.window, "head_counts": head_counts}
        return selection_with_window(prefix_keep, scores, length, self.window, info)
