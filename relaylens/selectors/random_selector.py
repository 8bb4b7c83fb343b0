"""Random: a seeded uniform subset of the history per (layer, kv head). The floor every selector must beat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector, check_seed, resolve_budget, top_positions
from relaylens.selectors.streaming import uniform_selection


@dataclass(frozen=True)
class RandomSelector(Selector):
    """Keep ``K`` positions drawn uniformly without replacement, independently per (layer, kv head).

    Each position gets a uniform priority from one generator seeded with ``seed``; the top ``K`` are kept and the
    priorities are the per-state scores.

    Parameters:
        seed: generator seed (0); the same seed gives the same selection.
        shared: one set for every layer and head instead of one per (layer, kv head).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> a = RandomSelector(seed=1).select(random_prefill(length=50), None, 10)
        >>> b = RandomSelector(seed=1).select(random_prefill(length=50), None, 10)
        >>> bool((a.positions == b.positions).all()), a.counts.unique().tolist()
        (True, [10])
    """

    seed: int = 0
    shared: bool = False

    name: ClassVar[str] = "random"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seed(self, self.seed)

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        gen = torch.Generator().manual_seed(self.seed)
        info = {"selector": self.name, "budget": k, "seed": self.seed}
        if self.shared:
            priority = torch.rand(length, generator=gen)  # [L]
            keep = top_positions(priority, k)
            return uniform_selection(keep, prefill, priority[keep], info)
        priority = torch.rand((prefill.num_layers, prefill.num_kv_heads, length), generator=gen)  # [layer, kv_head, L]
        keep = top_positions(priority, k)  # [layer, kv_head, K]
        return Selection(keep, torch.ones_like(keep, dtype=torch.bool), length, priority.gather(-1, keep), info=info)
