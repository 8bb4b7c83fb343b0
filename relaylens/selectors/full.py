"""FullKV: keep every history state (the uncompressed reference point)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector
from relaylens.selectors.streaming import uniform_selection


@dataclass(frozen=True)
class FullKV(Selector):
    """Keep positions ``0..L-1`` for every (layer, kv head); the budget is accepted and ignored (``K = L``).

    Scores are ``(j + 1) / L`` (recency), so ``score_order`` reproduces source order.

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> FullKV().select(random_prefill(length=12)).counts.tolist()
        [[12, 12], [12, 12]]
    """

    name: ClassVar[str] = "full"

    def select(self, prefill: PrefillResult, prompt=None,
               budget: Budget | float | int | str | None = None) -> Selection:
        if budget is not None:
            Budget.coerce(budget)  # a malformed budget is still an error
        length = prefill.history_length
        keep = torch.arange(length)
        return uniform_selection(keep, prefill, (keep + 1).float() / length, {"selector": self.name, "budget": length})
