"""Scissorhands: keep the states that are most often pivotal for the recent queries, plus the most recent tokens.

Reference: Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis for LLM KV Cache
Compression at Test Time" (arXiv 2305.17118, Algorithm 2); ``reference/selectors.md`` §2 Scissorhands. There is no
official code. The paper evicts at decode time; this is the one-shot adaptation of the reference note: the history
window of the last ``n`` history queries plays the role of the decode-time history window, a state is *pivotal* for
query ``i`` when its attention reaches the uniform level ``1 / t_i`` (``t_i = i + 1`` keys visible), importance is
the fraction of observations in which a state is pivotal, and the last ``r`` tokens are protected.

Axes: ``layer``, ``kv_head``, ``group``, ``pos`` (:mod:`relaylens.geometry`); ``row`` is the attention row of one query
of the history window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import BudgetError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector, resolve_budget, selection_with_window


def pivotal_counts(prefill: PrefillResult, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How often each state is pivotal for the last ``rows`` history queries, per kv head.

    Row ``i`` (history position ``L - rows .. L - 1``) attends causally over keys ``0..i`` with the float32 softmax
    of ``scaling * q_i . k_j``; state ``j`` is pivotal for it when ``a[i, j] >= 1 / (i + 1)``. Returns, summed over
    the query heads of each kv head and over the rows ``i >= j``:

    * ``hits [kv_head, L]`` float32: number of (query head, row) pairs in which ``j`` is pivotal;
    * ``seen [L]`` float32: number of (query head, row) pairs that can see ``j`` (``group * #{i >= j}``);
    * ``mass [kv_head, L]`` float32: the summed attention ``sum a[i, j]`` (the tie-break).
    """
    if prefill.window_queries is None:
        raise ShapeError("Scissorhands needs the window queries of the prefill; run the prefill with window capture on")
    queries = prefill.window_queries[layer]  # [q_head, w_captured, head_dim]
    keys = prefill.keys[layer]  # [kv_head, L, head_dim]
    length, kv_heads, group = keys.shape[1], keys.shape[0], prefill.num_key_value_groups
    if queries.shape[1] < rows:
        raise ShapeError(
            f"Scissorhands' history window is {rows} queries but the prefill captured {queries.shape[1]}; prefill with "
            f"window_size >= {rows} (the runner does this from the selector's query_window) or lower history_window"
        )
    q = queries[:, -rows:].float().reshape(kv_heads, group * rows, -1)  # [kv_head, group*rows, d]
    row_pos = torch.arange(length - rows, length, device=keys.device).repeat(group)  # [group*rows]
    causal = torch.arange(length, device=keys.device)[None, :] > row_pos[:, None]  # [group*rows, L]
    uniform = 1.0 / (row_pos.float() + 1.0)  # [group*rows] the level 1 / t_i
    hits = torch.empty((kv_heads, length), dtype=torch.float32, device=keys.device)
    mass = torch.empty((kv_heads, length), dtype=torch.float32, device=keys.device)
    for h in range(kv_heads):  # one kv head at a time: no repeat_kv copy
        logits = (q[h] @ keys[h].float().T) * prefill.scaling  # [group*rows, L]
        probs = torch.softmax(logits.masked_fill(causal, float("-inf")), dim=-1)  # [group*rows, L]
        hits[h] = ((probs >= uniform[:, None]) & ~causal).float().sum(0)
        mass[h] = probs.sum(0)
    seen = (~causal).float().sum(0)  # [L]
    return hits.cpu(), seen.cpu(), mass.cpu()


def rank_lexicographic(primary: torch.Tensor, secondary: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` best indices along the last axis by ``primary``, ties by ``secondary``, then by recency (later
    first); returned sorted ascending. ``[..., n]`` -> ``[..., k]`` long."""
    n = primary.shape[-1]
    if k <= 0:
        return torch.empty((*primary.shape[:-1], 0), dtype=torch.long)
    order = torch.arange(n - 1, -1, -1).expand_as(primary)  # recency first
    order = order.gather(-1, torch.sort(secondary.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    order = order.gather(-1, torch.sort(primary.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    return torch.sort(order[..., :k], dim=-1).values


@dataclass(frozen=True)
class Scissorhands(Selector):
    """Per (layer, kv head): the last ``r`` positions plus the ``K - r`` most persistently pivotal earlier states.

    ``imp_h(j) = hits_h(j) / seen(j)`` over the history window ``W = [L - n, L)`` (``n = min(history_window, L)``):
    the fraction of (query head of the kv head, row ``i >= j`` of ``W``) pairs with ``a[i, j] >= 1 / (i + 1)``
    (every ``j`` is seen at least by row ``L - 1``). Candidates are ``j < L - r``; ties in ``imp`` (common: it is a
    count) are broken by the summed window attention (GQA mean), then by recency. Every head keeps exactly ``K``.
    Scores of kept candidates are ``imp``; protected recent states get ``1 + max imp``.

    Parameters:
        history_window: ``n``, how many final history queries vote (400, the paper's default).
        recent: ``r``, the protected recent tokens, counted inside ``K`` (10, the paper's default).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = Scissorhands(history_window=32, recent=4).select(random_prefill(length=96), None, 0.25)
        >>> sel.counts.tolist(), sel.positions[0, 0, -4:].tolist()
        ([[24, 24], [24, 24]], [92, 93, 94, 95])
    """

    history_window: int = 400
    recent: int = 10

    name: ClassVar[str] = "scissorhands"
    needs_window_queries: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.history_window, bool) or not isinstance(self.history_window, int) or self.history_window < 1:
            raise RelaylensError(f"Scissorhands history_window must be a positive int; got {self.history_window!r}")
        if isinstance(self.recent, bool) or not isinstance(self.recent, int) or self.recent < 0:
            raise RelaylensError(f"Scissorhands recent must be a non-negative int; got {self.recent!r}")

    @property
    def query_window(self) -> int:
        """How many final history queries the prefill must capture (the runner reads this)."""
        return self.history_window

    def rows(self, history_length: int) -> int:
        """``n = min(history_window, L)``."""
        return min(self.history_window, history_length)

    def importance(self, prefill: PrefillResult) -> tuple[torch.Tensor, torch.Tensor]:
        """``imp [layer, kv_head, L]`` and the tie-break ``mass [layer, kv_head, L]`` (GQA mean), float32."""
        rows = self.rows(prefill.history_length)
        group = prefill.num_key_value_groups
        imp, mass = [], []
        for layer in range(prefill.num_layers):
            hits, seen, summed = pivotal_counts(prefill, layer, rows)
            imp.append(hits / seen)
            mass.append(summed / group)
        return torch.stack(imp), torch.stack(mass)

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        r = self.recent
        if r > k:
            raise BudgetError(f"Scissorhands protects the last recent={r} tokens inside the budget K={k}; raise the "
                              f"budget to at least {r} states or lower recent")
        imp, mass = self.importance(prefill)  # [layer, kv_head, L]
        keep = rank_lexicographic(imp[..., : length - r], mass[..., : length - r], k - r)  # [layer, kv_head, K-r]
        info = {"selector": self.name, "budget": k, "recent": r, "history_window": self.rows(length)}
        return selection_with_window([list(layer) for layer in keep], imp[..., : length - r], length, r, info)
