"""Synthetic :class:`PrefillResult` objects built from random tensors, for examples, tests and memory checks.

Example:
    >>> pre = random_prefill(length=64, num_layers=3, num_kv_heads=2, group=2, head_dim=8, window=16)
    >>> pre.num_layers, tuple(pre.keys[0].shape), tuple(pre.window_queries[0].shape)
    (3, (2, 64, 8), (4, 16, 8))
"""

from __future__ import annotations

import torch

from relaylens.model.prefill import PrefillResult


def random_prefill(
    length: int = 96,
    num_layers: int = 2,
    num_kv_heads: int = 2,
    group: int = 2,
    head_dim: int = 16,
    window: int = 32,
    seed: int = 0,
    peaked: float = 3.0,
) -> PrefillResult:
    """A prefill of Gaussian keys, values and window queries.

    ``peaked`` scales the queries so attention is far from uniform (random unit-scale vectors give nearly flat
    softmaxes, which makes every selector look alike).
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, length, head_dim)
    keys = [torch.randn(shape, generator=gen) for _ in range(num_layers)]  # per layer [kv_head, L, d]
    values = [torch.randn(shape, generator=gen) for _ in range(num_layers)]  # per layer [kv_head, L, d]
    w = min(window, length)
    queries = [peaked * torch.randn((num_kv_heads * group, w, head_dim), generator=gen) for _ in range(num_layers)]
    return PrefillResult(
        history_ids=torch.randint(3, 300, (length,), generator=gen),
        keys=keys,
        values=values,
        window_queries=queries,  # per layer [q_head, w, d]
        window_size=w,
        scaling=head_dim**-0.5,
        num_key_value_groups=group,
    )
