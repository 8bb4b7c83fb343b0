"""Attention statistics captured during the history prefill, without ever holding an ``L x L`` matrix.

H2O (and CaM with ``attention="column_sums"``) needs the causal column sums of the attention of **every** history
query, ``colsum_q(j) = sum_{i >= j} a_q[i, j]``. The prefill runs with the fast kernel, which never exposes the
weights, so :func:`capture_column_sums` hooks each layer's ``self_attn``, rebuilds the layer's post-rotary queries
and keys from the hook's inputs with the recipes of :data:`relaylens.model.hf.QUERY_RECIPES` (the model module's own
projections, norms and ``apply_rotary_pos_emb``), and accumulates the sums in query blocks. The prefill runs it:
``prefill_history(model, ids, column_sums=True)`` fills :attr:`relaylens.model.prefill.PrefillResult.column_sums`.

Axes: ``q_head``, ``kv_head``, ``group``, ``pos``, ``block``, ``head_dim`` (:mod:`relaylens.geometry`).

Peak extra memory per layer is one ``[q_head, block, L]`` float32 buffer (``4 * H * block * L`` bytes: 9 heads x
256 x 8,000 tokens = 74 MB) plus the layer's rebuilt queries and keys; only ``[q_head, L]`` float32 is kept per
layer.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama")
    >>> with capture_column_sums(model, block_size=16) as stats:
    ...     _ = model(torch.arange(3, 43)[None])
    >>> len(stats.column_sums), tuple(stats.column_sums[0].shape), round(float(stats.column_sums[0][0].sum()), 3)
    (2, (4, 40), 40.0)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from relaylens.errors import ShapeError
from relaylens.model.hf import (
    attention_layer_index,
    attention_modules,
    attention_window,
    cached_keys,
    hook_cache,
    rebuild_query_key,
)


# ---------------------------------------------------------------------------------------------------------------
# Block-wise causal column sums
def causal_column_sums(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    block_size: int = 256,
    query_offset: int = 0,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """``colsum_q(j) = sum_i a_q[i, j]`` over the given query rows, never holding more than one query block.

    ``queries: [q_head, n_q, d]`` at positions ``query_offset .. query_offset + n_q - 1``; ``keys: [kv_head, n_k, d]``
    at positions ``0 .. n_k - 1`` (``n_k >= query_offset + n_q``). Row ``i`` sees keys ``j <= i`` (and
    ``j > i - sliding_window`` when set); logits are ``scaling * q.k`` (soft-capped when ``softcap`` is set, as
    Gemma-2 does), softmaxed in float32. Returns ``[q_head, n_k]`` float32.

    Example:
        >>> q, k = torch.randn(4, 10, 8), torch.randn(2, 10, 8)
        >>> sums = causal_column_sums(q, k, 8 ** -0.5, block_size=3)
        >>> bool(torch.allclose(sums.sum(-1), torch.full((4,), 10.0)))
        True
    """
    q_heads, n_q, d = queries.shape
    kv_heads, n_k, _ = keys.shape
    if q_heads % kv_heads:
        raise ShapeError(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")
    if n_k < query_offset + n_q:
        raise ShapeError(f"{n_k} keys cannot cover queries at positions {query_offset}..{query_offset + n_q - 1}")
    group = q_heads // kv_heads
    q = queries.float().view(kv_heads, group, n_q, d)  # [kv_head, group, n_q, d]
    k = keys.float()  # [kv_head, n_k, d]
    out = torch.zeros((kv_heads, group, n_k), dtype=torch.float32, device=keys.device)
    for s in range(0, n_q, block_size):
        e = min(s + block_size, n_q)
        b, visible = e - s, query_offset + e  # rows in the block; keys any of them can see
        qb = q[:, :, s:e].reshape(kv_heads, group * b, d)  # [kv_head, group*b, d]
        logits = torch.bmm(qb, k[:, :visible].transpose(1, 2))  # [kv_head, group*b, visible]
        logits.mul_(scaling)
        if softcap is not None:
            logits.div_(softcap).tanh_().mul_(softcap)
        rows = torch.arange(query_offset + s, query_offset + e, device=keys.device)  # [b] query positions
        cols = torch.arange(visible, device=keys.device)
        hidden = cols[None, :] > rows[:, None]  # [b, visible]
        if sliding_window is not None:
            hidden |= cols[None, :] <= rows[:, None] - sliding_window
        logits.view(kv_heads, group, b, visible).masked_fill_(hidden, float("-inf"))
        # in-place softmax: one buffer alive per block
        logits.sub_(logits.amax(-1, keepdim=True)).exp_()
        logits.div_(logits.sum(-1, keepdim=True))
        out[..., :visible] += logits.view(kv_heads, group, b, visible).sum(2)
        del logits
    return out.view(q_heads, n_k)


# ---------------------------------------------------------------------------------------------------------------
# The capture context manager
@dataclass
class ColumnSumStats:
    """Per-layer causal column sums captured by :func:`capture_column_sums`.

    Attributes:
        column_sums: per layer ``[q_head, L]`` float32 (what H2O reads from ``PrefillResult.column_sums``).
        num_queries: per layer, the history queries accumulated so far (``L`` after one prefill).
    """

    column_sums: list = field(default_factory=list)  # per layer [q_head, L] float32
    num_queries: list = field(default_factory=list)  # per layer int


@contextmanager
def capture_column_sums(
    model: torch.nn.Module, block_size: int = 256, device: torch.device | str | None = None
) -> Iterator[ColumnSumStats]:
    """Accumulate each layer's causal attention column sums during the history prefill run inside the block.

    A forward hook (with kwargs) on every ``self_attn`` rebuilds the layer's post-rotary queries
    (:func:`rebuild_query_key`) and runs :func:`causal_column_sums` block by block. A chunked prefill (several
    forwards over consecutive positions with a cache) is supported: later chunks read past keys from the cache.
    Batch size must be 1. Hooks are always removed on exit. Run only the history prefill inside the block.

    :func:`relaylens.model.prefill.prefill_history` with ``column_sums=True`` runs its forwards inside this block and
    stores ``stats.column_sums`` in the result.

    Parameters:
        block_size: query rows per block; peak extra memory is ``4 * q_heads * block_size * L`` bytes per layer.
        device: where the accumulated sums are kept (default: the layer's device).
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ShapeError(f"block_size must be a positive int; got {block_size!r}")
    modules = attention_modules(model)
    stats = ColumnSumStats(column_sums=[None] * len(modules), num_queries=[0] * len(modules))

    def make_hook(index: int):
        def hook(module, args, kwargs, output):
            hidden = kwargs.get("hidden_states", args[0] if args else None)  # [batch, n, hidden]
            pos_emb = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
            if hidden.shape[0] != 1:
                raise ShapeError(f"capture_column_sums needs batch size 1; got {hidden.shape[0]}")
            with torch.no_grad():
                q, k = rebuild_query_key(module, hidden, pos_emb)  # [1, q_head, n, d], [1, kv_head, n, d]
                seen = stats.num_queries[index]
                if seen:  # a later chunk: past keys come from the cache, which now holds this chunk too
                    cache = hook_cache(kwargs)
                    layer_idx = attention_layer_index(module, index)
                    cached = None if cache is None else cached_keys(cache, layer_idx)[0]  # [kv_head, n_k, d]
                    if cached is None or cached.shape[1] != seen + q.shape[2]:
                        raise ShapeError(
                            f"layer {index}: a second forward inside capture_column_sums, but the cache does not hold "
                            f"{seen} + {q.shape[2]} keys; run one history prefill (single shot or chunked with a full "
                            "cache) per capture block"
                        )
                    keys = cached
                else:
                    keys = k[0]
                sums = causal_column_sums(
                    q[0],
                    keys,
                    module.scaling,
                    block_size,
                    query_offset=seen,
                    sliding_window=attention_window(module),
                    softcap=getattr(module, "attn_logit_softcapping", None),
                )  # [q_head, n_k]
            if device is not None:
                sums = sums.to(device)
            prev = stats.column_sums[index]
            if prev is not None:
                sums[:, : prev.shape[1]] += prev
            stats.column_sums[index] = sums
            stats.num_queries[index] = seen + q.shape[2]

        return hook

    handles = [m.register_forward_hook(make_hook(i), with_kwargs=True) for i, m in enumerate(modules)]
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()
