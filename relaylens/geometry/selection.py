"""The output of a selector: kept source positions per (layer, kv_head), padded, with a validity mask.

Axes: ``layer``, ``kv_head``, ``slot``, ``head_dim`` (the glossary of :mod:`relaylens.geometry`).

A head keeps ``m[l, h] = valid[l, h].sum()`` states. ``M = max m`` is the width every head is right-aligned to by
RoPERelay. Padded slots carry position ``-1`` and never receive attention.

Example:
    >>> sel = Selection.from_lists([[[0, 4, 7], [1, 2]]], history_length=8)
    >>> sel.counts.tolist(), sel.max_count
    ([[3, 2]], 3)
    >>> sel.positions.tolist()
    [[[0, 4, 7], [1, 2, -1]]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from relaylens.errors import PositionError, ShapeError

PAD_POSITION = -1
"""The source position of a padded slot (a head that keeps fewer states than ``M``); padded slots are masked."""


@dataclass(frozen=True)
class Selection:
    """Kept source positions of a sparse KV cache.

    Attributes:
        positions: ``[layer, kv_head, slot]`` long; sorted strictly ascending over the valid slots, ``-1`` in padding.
        valid: ``[layer, kv_head, slot]`` bool; ``True`` for kept states. Valid slots come first in every head.
        history_length: ``L``, the number of history tokens the positions index into.
        scores: ``[layer, kv_head, slot]`` float32 selection score per kept state (used by ``score_order``), or None.
        values: ``[layer, kv_head, slot, head_dim]`` replacement values for merging selectors (CaM), or None.
        info: free-form selector diagnostics (e.g. value-norm ratio of a merge); never used for computation.
    """

    positions: torch.Tensor  # [layer, kv_head, slot] long
    valid: torch.Tensor  # [layer, kv_head, slot] bool
    history_length: int
    scores: torch.Tensor | None = None  # [layer, kv_head, slot] float32
    values: torch.Tensor | None = None  # [layer, kv_head, slot, head_dim]
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # index tensors live on the CPU whatever device selected them (conditions and probes index with CPU tensors)
        for name in ("positions", "valid", "scores"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                object.__setattr__(self, name, value.cpu())
        validate_selection(self)

    # ----------------------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.positions.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.positions.shape[1]

    @property
    def counts(self) -> torch.Tensor:
        """``[layer, kv_head]`` long: kept states per head (``m[l, h]``)."""
        return self.valid.sum(-1)

    @property
    def max_count(self) -> int:
        """``M``: the largest retained count over all (layer, kv_head)."""
        return int(self.counts.max())

    @property
    def is_uniform(self) -> bool:
        counts = self.counts
        return bool((counts == counts.flatten()[0]).all())

    def layer_positions(self, layer: int) -> list[torch.Tensor]:
        """Kept positions of every kv head of one layer, unpadded."""
        return [self.positions[layer, h][self.valid[layer, h]] for h in range(self.num_kv_heads)]

    # ----------------------------------------------------------------------------------------------------------
    @classmethod
    def from_lists(
        cls,
        keep: Sequence[Sequence[Sequence[int] | torch.Tensor]],
        history_length: int,
        scores: Sequence[Sequence[Sequence[float] | torch.Tensor]] | None = None,
        values: Sequence[Sequence[torch.Tensor]] | None = None,
        info: dict | None = None,
    ) -> Selection:
        """Build a padded selection from ragged ``keep[layer][kv_head]`` position lists (each sorted ascending).

        ``scores`` follows the same nesting; ``values[layer][kv_head]`` is ``[m, head_dim]``.
        """
        num_layers = len(keep)
        if num_layers == 0:
            raise ShapeError("a selection needs at least one layer; got an empty keep list")
        num_heads = {len(layer) for layer in keep}
        if len(num_heads) != 1 or 0 in num_heads:
            raise ShapeError(f"every layer must list the same (non-zero) number of kv heads; got {sorted(num_heads)}")
        (kv_heads,) = num_heads
        lists = [[torch.as_tensor(keep[l][h],
                                  dtype=torch.long).flatten() for h in range(kv_heads)] for l in range(num_layers)]
        width = max(int(t.numel()) for layer in lists for t in layer)
        positions = torch.full((num_layers, kv_heads, width), PAD_POSITION, dtype=torch.long)
        valid = torch.zeros((num_layers, kv_heads, width), dtype=torch.bool)
        score_tensor = None if scores is None else torch.zeros((num_layers, kv_heads, width), dtype=torch.float32)
        value_tensor = None
        for l in range(num_layers):
            for h in range(kv_heads):
                m = lists[l][h].numel()
                positions[l, h, :m] = lists[l][h]
                valid[l, h, :m] = True
                if score_tensor is not None:
                    s = torch.as_tensor(scores[l][h], dtype=torch.float32).flatten()
                    if s.numel() != m:
                        raise ShapeError(f"layer {l} kv_head {h}: {m} kept positions but {s.numel()} scores")
                    score_tensor[l, h, :m] = s
                if values is not None:
                    v = torch.as_tensor(values[l][h])
                    if value_tensor is None:
                        value_tensor = torch.zeros((num_layers, kv_heads, width, v.shape[-1]), dtype=v.dtype)
                    if v.shape[0] != m:
                        raise ShapeError(f"layer {l} kv_head {h}: {m} kept positions but values for {v.shape[0]}")
                    value_tensor[l, h, :m] = v
        return cls(positions, valid, int(history_length), score_tensor, value_tensor, dict(info or {}))

    @classmethod
    def full(cls, history_length: int, num_layers: int, num_kv_heads: int) -> Selection:
        """Keep everything (FullKV): every head keeps positions ``0..L-1``."""
        positions = torch.arange(history_length).expand(num_layers, num_kv_heads, history_length).clone()
        return cls(positions, torch.ones_like(positions, dtype=torch.bool), history_length)


def validate_selection(sel: Selection) -> None:
    """Raise a :class:`ShapeError` / :class:`PositionError` naming the (layer, kv_head) of the first problem."""
    pos, valid = sel.positions, sel.valid
    if pos.dim() != 3:
        raise ShapeError(f"positions must be [layer, kv_head, slot]; got shape {tuple(pos.shape)}")
    if pos.dtype not in (torch.int64, torch.int32):
        raise ShapeError(f"positions must be an integer tensor; got {pos.dtype}")
    if valid.shape != pos.shape or valid.dtype != torch.bool:
        raise ShapeError(f"valid mask must be bool {tuple(pos.shape)}; got {valid.dtype} {tuple(valid.shape)}")
    for name, extra in (("scores", sel.scores), ("values", sel.values)):
        if extra is not None and tuple(extra.shape[:3]) != tuple(pos.shape):
            raise ShapeError(f"{name} must start with shape {tuple(pos.shape)}; got {tuple(extra.shape)}")
    if sel.history_length <= 0:
        raise PositionError(f"history_length must be positive; got {sel.history_length}")
    counts = valid.sum(-1)  # [layer, kv_head]
    # valid slots must come first: a True after a False would break the slot convention
    packed = valid == (torch.arange(valid.shape[-1]) < counts[..., None])
    empty = counts == 0
    checks = [
        (~packed, "valid slots must come first in every head (left-packed padding); re-pack the mask"),
        (empty, "the head keeps no state; every (layer, kv_head) needs at least one kept position"),
        (valid & (pos < 0), "negative source position"),
        (valid & (pos >= sel.history_length), f"source position >= history_length ({sel.history_length})"),
    ]
    if pos.shape[-1] > 1:
        step = pos[..., 1:] - pos[..., :-1]
        both = valid[..., 1:] & valid[..., :-1]
        bad_order = torch.zeros_like(valid)
        bad_order[..., 1:] = both & (step <= 0)
        checks.append((bad_order, "source positions must be strictly ascending (sorted, no duplicates)"))
    for bad, what in checks:
        if bool(bad.any()):
            where = torch.nonzero(bad)[0].tolist()
            layer, head = where[0], where[1]
            shown = pos[layer, head][valid[layer, head]].tolist()[:12]
            raise PositionError(f"selection layer {layer} kv_head {head}: {what}; kept positions start {shown}")
