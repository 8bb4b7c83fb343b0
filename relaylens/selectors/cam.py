"""CaM: SnapKV selection whose evicted states are merged, by a seeded Bernoulli rule, into the values of the kept
states that follow them. Keys and positions are untouched; only values change.

Reference: Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference" (ICML 2024), zyxxmu/cam and
kvpress ``cam_press.py``; ``reference/selectors.md`` §2 CaM ("recommended relaylens spec").
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
    check_seed,
    reduce_gqa,
    resolve_budget,
    selection_with_window,
    top_positions,
)
from relaylens.selectors.h2o import column_sums_of

ATTENTION_SOURCES = ("window", "column_sums")


def merge_values(
    values: torch.Tensor,
    kept: torch.Tensor,
    evicted: torch.Tensor,
    attention: torch.Tensor,
    merge_size: int,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """Merge each evicted state into the next ``merge_size`` kept states after it (one kv head).

    For evicted ``e`` with targets ``T(e)`` (the next ``m`` kept positions after ``e``; skipped when empty):
    ``p = clamp(A_e / mean_{T(e)} A, 0, 1)`` (NaN -> 0, inf -> 1), ``b = uniforms[e] < p``, and
    ``v_t += b * v_e / |T(e)|`` for ``t in T(e)``. Vectorised: ``searchsorted`` finds ``T(e)``'s first slot, one
    ``index_add`` collects the contributions per first slot, and a length-``m`` running sum spreads them.

    ``values: [L, d]``, ``kept: [K]`` sorted, ``evicted: [n_e]``, ``attention: [L]``, ``uniforms: [n_e]``.
    Returns the kept states' merged values ``[K, d]`` (values' dtype) and the number of merged states.

    Example:
        >>> v = torch.eye(4)
        >>> merge_values(v, torch.tensor([1, 3]), torch.tensor([0, 2]), torch.ones(4), 2, torch.zeros(2))[0].tolist()
        [[0.5, 1.0, 0.0, 0.0], [0.5, 0.0, 1.0, 1.0]]
    """
    n_kept = kept.numel()
    first = torch.searchsorted(kept, evicted, right=True)  # [n_e] slot of the first kept position after e
    count = (n_kept - first).clamp(max=merge_size)  # [n_e] |T(e)|
    a_kept = torch.cat([torch.zeros(1, dtype=torch.float64), attention[kept].double().cumsum(0)])  # [K+1]
    last = (first + count).clamp(max=n_kept)
    mean_a = (a_kept[last] - a_kept[first.clamp(max=n_kept)]) / count.clamp(min=1)  # [n_e] mean_{T(e)} A
    p = attention[evicted].double() / mean_a
    p = torch.nan_to_num(p, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    merged = (uniforms.double() < p) & (count > 0)  # [n_e] Bernoulli draws
    weight = merged.double() / count.clamp(min=1).double()  # [n_e]
    gathered = torch.zeros((n_kept + 1, values.shape[-1]), dtype=torch.float64)  # [K+1, d] by first slot
    gathered.index_add_(0, first, weight[:, None] * values[evicted].double())
    run = gathered[:n_kept].cumsum(0)  # [K, d]
    delta = run.clone()
    delta[merge_size:] -= run[:-merge_size] if merge_size < n_kept else 0  # sum over first slots t-m+1..t
    out = values[kept].double() + delta
    return out.to(values.dtype), int(merged.sum())


@dataclass(frozen=True)
class CaM(WindowSelector):
    """SnapKV's kept set per (layer, kv head) with values merged from the evicted states (:func:`merge_values`).

    Parameters:
        merge_size: ``m``, kept states after an evicted one that share its value (16, as zyxxmu/cam's streaming
            variant; kvpress uses 32).
        merge_limit: merge at most this many evicted states per head, the highest-scored (by the base SnapKV score)
            first; ``None`` merges every evicted state. At 90% eviction merging everything inflates value mass by
            about ``G/m`` per gap of ``G``: watch ``info["value_norm_ratio"]``.
        attention: ``A`` of the Bernoulli rule: ``"window"`` (unpooled window sums, default) or ``"column_sums"``
            (H2O statistics from ``prefill.column_sums``).
        seed: seed of the Bernoulli draws (one generator, drawn per (layer, kv head) in order).
        window, kernel_size, pooling, gqa_reduction, pool_per_query_head: the base SnapKV (32, 7, max, mean).

    ``Selection.values`` holds the merged values; ``info["value_norm_ratio"]`` is the mean over heads of
    ``||merged||_F / ||original||_F`` over the kept states (per layer in ``info["value_norm_ratio_per_layer"]``).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = CaM(window=8).select(random_prefill(length=96), None, 0.25)
        >>> tuple(sel.values.shape), sel.info["value_norm_ratio"] > 1.0
        ((2, 2, 24, 16), True)
    """

    merge_size: int = 16
    merge_limit: int | None = None
    attention: str = "window"
    seed: int = 0

    name: ClassVar[str] = "cam"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seed(self, self.seed)
        if isinstance(self.merge_size, bool) or not isinstance(self.merge_size, int) or self.merge_size < 1:
            raise RelaylensError(f"CaM merge_size must be a positive int; got {self.merge_size!r}")
        if self.merge_limit is not None and (not isinstance(self.merge_limit, int) or self.merge_limit < 0):
            raise RelaylensError(f"CaM merge_limit must be a non-negative int or None; got {self.merge_limit!r}")
        if self.attention not in ATTENTION_SOURCES:
            raise RelaylensError(f"CaM attention must be one of {ATTENTION_SOURCES}; got {self.attention!r}")

    def merge_attention(self, prefill: PrefillResult, layer: int) -> torch.Tensor:
        """``A`` over all positions, ``[kv_head, L]`` float32."""
        if self.attention == "window":
            return self.scorer.raw(prefill, layer)
        sums = column_sums_of(prefill)[layer].float()  # [q_head, L]
        return reduce_gqa(sums.view(prefill.num_kv_heads, -1, prefill.history_length), self.gqa_reduction)

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length, w = prefill.history_length, self.window
        k = resolve_budget(budget, length, w, "CaM")
        scores = self.scorer.scores(prefill).cpu()  # [layer, kv_head, L-w]
        prefix_keep = top_positions(scores, k - w)  # [layer, kv_head, K-w]
        window = torch.arange(length - w, length)
        gen = torch.Generator().manual_seed(self.seed)
        values, ratios, merged_total = [], [], 0
        for l in range(prefill.num_layers):
            attention = self.merge_attention(prefill, l).cpu()  # [kv_head, L]
            layer_values, layer_ratios = [], []
            for h in range(prefill.num_kv_heads):
                kept = torch.cat([prefix_keep[l, h], window])  # [K]
                evicted_mask = torch.ones(length - w, dtype=torch.bool)
                evicted_mask[prefix_keep[l, h]] = False
                evicted = torch.nonzero(evicted_mask).flatten()  # [n_e] sorted
                if self.merge_limit is not None and evicted.numel() > self.merge_limit:
                    evicted = evicted[top_positions(scores[l, h, evicted], self.merge_limit)]
                v = prefill.values[l][h].cpu()  # [L, d]
                uniforms = torch.rand(evicted.numel(), generator=gen)
                merged, n_merged = merge_values(v, kept, evicted, attention[h], self.merge_size, uniforms)
                merged_total += n_merged
                layer_values.append(merged)
                layer_ratios.append(float(merged.double().norm() / v[kept].double().norm().clamp_min(1e-30)))
            values.append(torch.stack(layer_values))
            ratios.append(sum(layer_ratios) / len(layer_ratios))
        base = selection_with_window([list(layer) for layer in prefix_keep], scores, length, w, {})
        info = {
            "selector": self.name,
            "budget": k,
            "window": w,
            "merged_states": merged_total,
            "value_norm_ratio": sum(ratios) / len(ratios),
            "value_norm_ratio_per_layer": ratios,
        }
        return Selection(base.positions, base.valid, length, base.scores, torch.stack(values), info)
