"""SnapKV: keep the prefix states the observation window attends to most, plus the window itself.

Reference: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (arXiv 2404.14469);
``reference/selectors.md`` §1 and §2 SnapKV. The window is the history's own last ``w`` tokens: the question is not
in the history, so this is kvpress's question-agnostic regime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, WindowSelector, resolve_budget, selection_with_window, top_positions


@dataclass(frozen=True)
class SnapKV(WindowSelector):
    """Per (layer, kv head): ``topk(ŝ_h, K - w)`` over the prefix plus the window ``L-w..L-1``.

    Every head keeps exactly ``K`` states; sets differ across heads and layers. Scores of kept prefix states are the
    pooled window scores ``ŝ_h``; window states get ``1 + max ŝ_h``.

    Parameters:
        window: observation window ``w`` (32), always kept and counted inside ``K``.
        kernel_size, pooling: stride-1 pooling of the scores along positions (7, ``"max"``; ``"avg"``/``"none"``).
        gqa_reduction: ``"mean"`` (default), ``"max"`` or ``"sum"`` over the query heads of a kv head.
        pool_per_query_head: pool before the GQA reduction (kvpress order) instead of after (default).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = SnapKV(window=8).select(random_prefill(length=96), None, 0.25)
        >>> sel.counts.unique().tolist()
        [24]
    """

    name: ClassVar[str] = "snapkv"

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length, self.window, "SnapKV")
        scores = self.scorer.scores(prefill)  # [layer, kv_head, L-w]
        keep = top_positions(scores, k - self.window)  # [layer, kv_head, K-w]
        prefix_keep = [list(layer) for layer in keep]
        info = {"selector": self.name, "budget": k, "window": self.window}
        return selection_with_window(prefix_keep, scores, length, self.window, info)
