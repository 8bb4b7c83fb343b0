"""StreamingLLM: attention sinks plus the most recent tokens. Needs no attention and no question.

Reference: Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (arXiv 2309.17453); kvpress
``streaming_llm_press.py``; ``reference/selectors.md`` §2 StreamingLLM. The original re-assigns in-cache positions,
which is exactly the ``relay`` condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import BudgetError, RelaylensError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector, resolve_budget


@dataclass(frozen=True)
class StreamingLLM(Selector):
    """Keep positions ``0..n_sink-1`` and the last ``K - n_sink``; the same for every layer and head.

    Scores are ``(j + 1) / L`` (recency), so ``score_order`` reproduces source order.

    Parameters:
        n_sink: number of sink tokens (4, as kvpress, KVCache-Factory and AdaKV), counted inside ``K``.

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> StreamingLLM().select(random_prefill(length=20), None, 8).positions[0, 0].tolist()
        [0, 1, 2, 3, 16, 17, 18, 19]
    """

    n_sink: int = 4

    name: ClassVar[str] = "streaming"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise RelaylensError(f"StreamingLLM n_sink must be a non-negative int; got {self.n_sink!r}")

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        if k < self.n_sink:
            raise BudgetError(f"StreamingLLM budget K={k} is smaller than its {self.n_sink} sink tokens; raise the "
                              "budget")
        keep = torch.cat([torch.arange(self.n_sink), torch.arange(length - (k - self.n_sink), length)])  # [K]
        return uniform_selection(keep, prefill, (keep + 1).float() / length, {"selector": self.name, "budget": k})


def uniform_selection(keep: torch.Tensor, prefill: PrefillResult, scores: torch.Tensor, info: dict) -> Selection:
    """The same kept positions ``[m]`` (sorted) and scores ``[m]`` for every (layer, kv head)."""
    shape = (prefill.num_layers, prefill.num_kv_heads, keep.numel())
    positions = keep.long().expand(shape).clone()
    return Selection(positions, torch.ones(shape, dtype=torch.bool), prefill.history_length,
                     scores.float().expand(shape).clone(), info=info)
