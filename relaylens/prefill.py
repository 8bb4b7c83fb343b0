"""History prefill: run the history once with the fast attention kernel and keep what later stages need.

Axes: ``layer``, ``kv_head``, ``q_head`` (query head; ``q_head // group`` is its kv head), ``pos`` (history
position ``0..L-1``), ``window`` (the last ``w`` history positions), ``head_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillResult:
    """What one history prefill produced. Every selector and condition of a record shares it.

    Attributes:
        history_ids: ``[L]`` long token ids of the history.
        keys: per layer ``[kv_head, L, head_dim]``, post-rotary keys exactly as the model cached them.
        values: per layer ``[kv_head, L, head_dim]``.
        window_queries: per layer ``[q_head, w, head_dim]`` post-rotary queries of the last ``w`` history tokens
            (``None`` when not captured).
        window_size: ``w``.
        scaling: the attention scaling the model applies to ``q @ k^T`` (``1/sqrt(head_dim)`` for Llama).
        num_key_value_groups: query heads per kv head.
    """

    history_ids: torch.Tensor  # [L]
    keys: list[torch.Tensor]  # per layer [kv_head, L, head_dim]
    values: list[torch.Tensor]  # per layer [kv_head, L, head_dim]
    window_queries: list[torch.Tensor] | None  # per layer [q_head, w, head_dim]
    window_size: int
    scaling: float
    num_key_value_groups: int

    @property
    def history_length(self) -> int:
        return int(self.history_ids.numel())

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_kv_heads(self) -> int:
        return int(self.keys[0].shape[0])
