"""ChunkKV: SnapKV token scores pooled into fixed-size chunks; whole chunks are kept, one set per layer.

Reference: Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference"
(arXiv 2502.00299), NVIDIA/kvpress ``chunkkv_press.py``; ``reference/selectors.md`` §2 ChunkKV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.errors import RelaylensError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, WindowSelector, resolve_budget, selection_from_keep


def chunk_scores(token_scores: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Mean token score of each chunk ``[c*i, c*(i+1))``, aligned at position 0; the last partial chunk is its own
    chunk. ``[prefix] -> [n_chunks]``.

    Example:
        >>> chunk_scores(torch.tensor([1., 3., 5., 7., 9.]), 2).tolist()
        [2.0, 6.0, 9.0]
    """
    n = token_scores.numel()
    ids = torch.arange(n, device=token_scores.device) // chunk_size  # [prefix] chunk of each position
    n_chunks = -(-n // chunk_size)
    sums = torch.zeros(n_chunks, dtype=torch.float64, device=token_scores.device).index_add_(0, ids,
                                                                                             token_scores.double())
    sizes = torch.bincount(ids, minlength=n_chunks).double()
    return (sums / sizes).float()


def pick_chunks(scores: torch.Tensor, sizes: torch.Tensor, capacity: int) -> torch.Tensor:
    """Greedy first-fit of whole chunks by descending score (ties to the later chunk) into ``capacity`` tokens.
    Returns the chosen chunk ids sorted ascending. ``scores, sizes: [n_chunks]``."""
    order = torch.sort(scores.flip(0), descending=True, stable=True).indices
    order = scores.numel() - 1 - order  # descending score, later chunk first among ties
    chosen, used = [], 0
    for c in order.tolist():
        size = int(sizes[c])
        if used + size <= capacity:
            chosen.append(c)
            used += size
    return torch.tensor(sorted(chosen), dtype=torch.long)


@dataclass(frozen=True)
class ChunkKV(WindowSelector):
    """Per layer: token scores ``ŝ_h(j)`` summed over kv heads, averaged per chunk of ``chunk_size`` prefix
    positions (aligned at 0; the chunk cut by the window boundary is a partial chunk), the best whole chunks that fit
    into ``K - w`` tokens, plus the window. All heads of a layer share the set.

    Kept counts are at most ``K`` and exceed ``K - chunk_size``. Scores of kept prefix states are their chunk's
    score; window states get ``1 + max``.

    Parameters:
        chunk_size: ``c`` (10, the paper's recommendation; kvpress's evaluation uses 20).
        reuse_layers: layer-wise index reuse ``N_reuse`` (1 = off, default): layers with ``l % N_reuse == 0``
            select, the next ``N_reuse - 1`` layers reuse their positions.
        window, kernel_size, pooling, gqa_reduction, pool_per_query_head: as in :class:`SnapKV` (32, 7, max, mean).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> sel = ChunkKV(window=8).select(random_prefill(length=96), None, 0.25)
        >>> sel.counts.tolist()
        [[18, 18], [16, 16]]
    """

    chunk_size: int = 10
    reuse_layers: int = 1

    name: ClassVar[str] = "chunkkv"

    def __post_init__(self) -> None:
        super().__post_init__()
        for field_name in ("chunk_size", "reuse_layers"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RelaylensError(f"ChunkKV {field_name} must be a positive int; got {value!r}")

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length, w = prefill.history_length, self.window
        k = resolve_budget(budget, length, w, "ChunkKV")
        prefix = length - w
        ids = torch.arange(prefix) // self.chunk_size  # [prefix] chunk id per position
        sizes = torch.bincount(ids)  # [n_chunks]
        window = torch.arange(prefix, length)
        keep, scores, sources = [], [], []
        for l in range(prefill.num_layers):
            if l % self.reuse_layers == 0:
                token = self.scorer.layer_scores(prefill, l).sum(0).cpu()  # [prefix] summed over kv heads
                chunk = chunk_scores(token, self.chunk_size)  # [n_chunks]
                chosen = pick_chunks(chunk, sizes, k - w)  # [n_kept_chunks]
                kept_prefix = torch.nonzero(torch.isin(ids, chosen)).flatten()  # [kept] sorted
                fill = float(chunk.max()) + 1.0 if chunk.numel() else 1.0
                layer_keep = torch.cat([kept_prefix, window])
                layer_scores = torch.cat([chunk[ids[kept_prefix]], torch.full((w,), fill)])
                source = l
            keep.append([layer_keep] * prefill.num_kv_heads)
            scores.append([layer_scores] * prefill.num_kv_heads)
            sources.append(source)
        info = {"selector": self.name, "budget": k, "window": w, "chunk_size": self.chunk_size,
                "index_source_layer": sources}
        return selection_from_keep(keep, scores, length, info)
