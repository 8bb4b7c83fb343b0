"""Positions of new tokens (question, teacher-forced and generated tokens): integer, or real-valued.

Axes: ``row``, ``T`` new tokens (:mod:`relaylens.geometry`). Integer positions go to the model as ``position_ids``
and its rotary embedding computes the phases, as always. Real-valued positions (floating point, from a condition
with a real question start) cannot: inside :func:`new_token_phases` the rotary embedding's ``(cos, sin)`` are
replaced by :meth:`~relaylens.geometry.rotary.RotaryFactors.real_plane_factors` at those positions (float64, the
model's table entry at the nearest integer rotated by the fraction, cast to the model's dtype; autograd kept), and
the model receives ``floor(p)`` as ``position_ids`` for anything else that reads them.

Example (at integer-valued positions the replaced phases are the model's own):
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.geometry.rotary import RotaryFactors
    >>> model = tiny_model("llama")
    >>> ids, at = torch.tensor([[5, 6, 7]]), torch.tensor([[3.0, 4.0, 5.0]], dtype=torch.float64)
    >>> with torch.no_grad(), new_token_phases(model, RotaryFactors.from_model(model), at):
    ...     real = model(ids, position_ids=position_ids(at)).logits
    >>> plain = model(ids, position_ids=torch.tensor([[3, 4, 5]])).logits
    >>> bool((real - plain).abs().max() < 1e-5)
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from relaylens.geometry.real import is_real
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model.hf import rotary_override


def position_ids(positions: torch.Tensor) -> torch.Tensor:
    """The ``position_ids`` the model receives: the positions themselves, or ``floor(p)`` (long) for real ones."""
    return positions.detach().floor().long() if is_real(positions) else positions


@contextlib.contextmanager
def new_token_phases(model, factors: RotaryFactors, positions: torch.Tensor) -> Iterator[None]:
    """Inside, the model's rotary returns the phases of ``positions`` ``[row, T]`` (a no-op for integer positions).

    ``positions`` may require grad: the phases (and so the logits) then carry the graph back to them.
    """
    if not is_real(positions):
        yield
        return
    rows = positions if positions.dim() == 2 else positions[None]  # [row, T]

    def phases(layer_type):
        cos, sin = factors.real_plane_factors(rows, factors.rotary_layer(layer_type))  # [row, T, plane] float64
        if factors.cat_form:  # the model's layout of its rotary_dim features
            return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)

    with rotary_override(model, phases):
        yield
