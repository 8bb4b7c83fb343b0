"""Helpers shared by tests/.../test_prefill.py, its model tier and the tests that wrap a plain forward's cache as a
prefill (not a test module)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from relaylens.generation.single import prefill_from_cache
from relaylens.model.prefill import PrefillResult


def plain_prefill(model, history: torch.Tensor) -> PrefillResult:
    """A plain forward of ``model`` over ``history`` ``[L]`` with a fresh ``DynamicCache``, wrapped as a prefill."""
    with torch.no_grad():
        cache = model(history[None], use_cache=True, cache=DynamicCache()).cache
    return prefill_from_cache(history, cache, model)


def rows_from_queries(res: PrefillResult, layer: int, sliding_window: int | None) -> torch.Tensor:
    """softmax(q k^T * scaling + causal (and window) mask) of the captured window queries: ``[q_head, w, L]``."""
    q = res.window_queries[layer].float()  # [q_head, w, D]
    k = res.keys[layer].float().repeat_interleave(res.num_key_value_groups, dim=0)  # [q_head, L, D]
    scores = q @ k.transpose(1, 2) * res.scaling  # [q_head, w, L]
    qpos = torch.arange(res.history_length - res.window_size, res.history_length)[:, None]  # [w, 1]
    kpos = torch.arange(res.history_length)[None]  # [1, L]
    allow = kpos <= qpos
    if sliding_window is not None:
        allow &= kpos > qpos - sliding_window
    return scores.masked_fill(~allow, float("-inf")).softmax(-1)


def eager_rows(model, ids):
    """The real attention rows of an eager forward, per layer ``[q_head, L, L]``."""
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(ids[None], output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation("sdpa")
    return [a[0].float() for a in out.attentions]
