"""PyramidKV: SnapKV scores with a per-layer budget that falls linearly from the lowest layer to the highest.

Reference: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling"
(arXiv 2406.02069); ``reference/selectors.md`` §2 PyramidKV. Unlike kvpress and KVCache-Factory there is no silent
fallback to uniform SnapKV: an infeasible schedule raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import BudgetError, RelaylensError
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


def pyramid_schedule(prefix_budget: int, prefix_length: int, num_layers: int, beta: float = 20.0) -> torch.Tensor:
    """Non-window states kept per layer, ``[layer]`` long, summing exactly to ``num_layers * prefix_budget``.

    With ``B = prefix_budget`` (``K - w``): ``min = B/beta``, ``max = 2B - min``; if ``max >= L-w`` then
    ``max = L-w`` and ``min = 2B - max``. The float schedule ``cap_l = max - l (max - min)/(N-1)`` (layer 0 largest)
    is clamped at 0 and rounded by largest remainder so the total is exact.

    Example:
        >>> pyramid_schedule(10, 100, 4).tolist()
        [20, 13, 7, 0]
    """
    if not beta >= 1.0:
        raise RelaylensError(f"PyramidKV beta must be >= 1 (min = B/beta <= max = 2B - min); got {beta!r}")
    b, n = float(prefix_budget), num_layers
    if n == 1:
        return torch.tensor([prefix_budget], dtype=torch.long)
    low = b / beta
    high = 2 * b - low
    if high >= prefix_length:
        high = float(prefix_length)
        low = 2 * b - high
    caps = high - torch.arange(n, dtype=torch.float64) * (high - low) / (n - 1)  # [layer]
    caps = caps.clamp(0.0, float(prefix_length))
    total = n * prefix_budget
    rounded = largest_remainder(caps, total)  # the linear schedule's mean is B, so the float total is already N*B
    if int(rounded.sum()) != total or bool((rounded < 0).any()) or bool((rounded > prefix_length).any()):
        raise BudgetError(
            f"PyramidKV schedule infeasible: per-layer prefix budgets {rounded.tolist()} must lie in [0, "
            f"{prefix_length}] and sum to {total}; relaylens does not fall back to SnapKV silently — change the budget "
            "or beta"
        )
    return rounded


@dataclass(frozen=True)
class PyramidKV(WindowSelector):
    """Layer ``l`` keeps ``topk(ŝ_h, cap_l)`` plus the window, for every kv head (:func:`pyramid_schedule`).

    Counts are uniform across the heads of a layer and sum over layers to exactly ``N * K``. Scores as in SnapKV.

    Parameters:
        beta: pyramid steepness (20, as in KVCache-Factory, kvpress and AdaKV); ``min = B/beta``.
        window, kernel_size, pooling, gqa_reduction, pool_per_query_head: as in :class:`SnapKV` (32, 7, max, mean).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = PyramidKV(window=8).select(random_prefill(length=96, num_layers=4), None, 0.25)
        >>> sel.counts[:, 0].tolist(), int(sel.counts[:, 0].sum())
        ([39, 29, 19, 9], 96)
    """

    beta: float = 20.0

    name: ClassVar[str] = "pyramidkv"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta >= 1.0:
            raise RelaylensError(f"PyramidKV beta must be >= 1 (min = B/beta <= max = 2B - min); got {self.beta!r}")

    def schedule(self, history_length: int, num_layers: int, budget: Budget | float | int | str) -> torch.Tensor:
        """Total kept states per layer (window included), ``[layer]`` long, summing to ``N * K``."""
        k = resolve_budget(budget, history_length, self.window, "PyramidKV")
        return pyramid_schedule(k - self.window, history_length - self.window, num_layers, self.beta) + self.window

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length, n = prefill.history_length, prefill.num_layers
        k = resolve_budget(budget, length, self.window, "PyramidKV")
        caps = pyramid_schedule(k - self.window, length - self.window, n, self.beta)  # [layer]
        scores = self.scorer.scores(prefill)  # [layer, kv_head, L-w]
        prefix_keep = [list(top_positions(scores[l], int(caps[l]))) for l in range(n)]
        info = {"selector": self.name, "budget": k, "window": self.window,
                "layer_counts": (caps + self.window).tolist()}
        return selection_with_window(prefix_keep, scores, length, self.window, info)
