"""The position rule: which rotary positions relaylens accepts. One function, :func:`check_positions`, used by every
relocation path (the fused CPU kernel, the eager path, the float64 / autograd path, phase replay), by the question
and generation positions, and by every condition's coordinates
(:func:`relaylens.conditions.catalogue.make_coordinates`).

* **Integers only, any width.** ``int8`` .. ``int64`` and ``uint8`` .. ``uint64`` tensors are read as ``int64`` (so a
  ``uint8`` tensor never indexes a phase table as a boolean mask); bool, float and complex tensors are refused.
* **Real-valued positions are float32 or float64.** A float16 / bfloat16 tensor of positions is refused
  (:func:`check_real_dtype`): its 11- or 8-bit mantissa rounds positions from 2,048 (float16) or 256 (bfloat16) on
  to coarser steps, so distinct keys would share one position without a word.
* **Inside the range.** ``0 <= p < limit``, where ``limit`` is the model's ``max_position_embeddings`` when it has
  one, and never more than :data:`~relaylens.model.hf.POSITION_LIMIT` (``2**24``): past it the rotary embedding's
  float32 positions collapse (``2**24 + 1`` rounds to ``2**24``) and distinct positions would share one phase.

Axes: ``layer``, ``kv_head``, ``slot`` (the glossary of :mod:`relaylens.geometry`).

Example:
    >>> import torch
    >>> check_positions(torch.tensor([3, 9], dtype=torch.uint8), "source positions")
    (tensor([3, 9]), 9)
    >>> check_positions(torch.tensor([[0, 5], [2**24, 1]]), "key positions", axes=("kv_head", "slot"))
    Traceback (most recent call last):
    ...
    relaylens.errors.PositionError: key positions reach position 16777216 (at kv_head 1, slot 0), at or past 2**24 = 16,777,216: the rotary embedding computes phases from float32 positions, which cannot tell positions apart from there on. Fix: use a smaller shift or a shorter history, or a model with a longer context
"""  # noqa: E501 - doctest: an exception message is matched on one line

from __future__ import annotations

import torch

from relaylens.errors import PositionError
from relaylens.model.hf import POSITION_LIMIT

__all__ = ["POSITION_LIMIT", "check_positions", "check_real_dtype"]

# advice for positions past the range
_PAST = "use a smaller shift or a shorter history, or a model with a longer context"


def check_positions(positions, what: str, limit: int | None = None, fix: str | None = None, *,
                    axes: tuple[str, ...] | None = None, bounds: bool = True) -> tuple[torch.Tensor, int | None]:
    """Apply the position rule; return the positions as ``int64`` (the same tensor when it already is) and the
    largest one (-1 when there is none).

    Args:
        positions: an integer tensor (or a Python int / list of ints) of positions, any shape.
        what: what the positions are, for the message (``"condition relay: key positions"``).
        limit: the model's ``max_position_embeddings`` (None: only :data:`POSITION_LIMIT` applies).
        fix: the advice for positions past the range (default: smaller positions).
        axes: names of the tensor's axes, so a message can say where the first bad position sits.
        bounds: False checks the dtype only and returns ``(positions, None)``: the fused kernel checks every index
            against phase tables that never cover more than the range, and calls again with bounds when one is
            outside (:func:`relaylens.geometry.rotary.relocate_keys`).

    Raises:
        PositionError: a non-integer dtype, a negative position, or one at or past the range.
    """
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions)
        except (OverflowError, RuntimeError):  # a Python int past int64
            raise PositionError(f"{what} reach a position past 2**63, far past the rotary range (2**24 at most). "
                                f"Fix: {fix or _PAST}") from None
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise PositionError(f"{what} must be integer positions; got dtype {positions.dtype}. Fix: pass an integer "
                            "tensor (torch.long)")
    wide = positions.to(torch.int64)  # [...]; uint64 past 2**63 wraps negative: caught below as past the range
    if not bounds:
        return wide, None
    if wide.numel() == 0:
        return wide, -1
    low, high = (int(v) for v in torch.aminmax(wide))  # one pass, one synchronisation
    cap = POSITION_LIMIT if limit is None else min(int(limit), POSITION_LIMIT)
    if low < 0 and positions.dtype.is_signed:
        raise PositionError(f"{what} contain a negative position ({low}){_at(wide < 0, axes)}; positions start at 0. "
                            f"Fix: {fix or 'give positions >= 0 (a shift that moves no kept key before position 0)'}")
    if low < 0 or high >= cap:
        bad = (wide < 0) | (wide >= cap)
        shown = f"{high}" if low >= 0 else "2**63 or more"
        if cap == POSITION_LIMIT:
            why = ("at or past 2**24 = 16,777,216: the rotary embedding computes phases from float32 positions, which "
                   "cannot tell positions apart from there on")
        else:
            why = f"past what this model's rotary supports (max_position_embeddings={cap})"
        advice = fix or _PAST
        raise PositionError(f"{what} reach position {shown}{_at(bad, axes)}, {why}. "
                            f"{advice if advice.startswith('Fix:') else 'Fix: ' + advice}")
    return wide, high


def _at(bad: torch.Tensor, axes: tuple[str, ...] | None) -> str:
    """`` (at layer 3, kv_head 1, slot 5)`` for the first True of ``bad``, when its axes are named."""
    if not axes or len(axes) != bad.dim():
        return ""
    index = torch.nonzero(bad)[0].tolist()
    return " (at " + ", ".join(f"{name} {i}" for name, i in zip(axes, index)) + ")"


def check_real_dtype(positions, what: str) -> None:
    """Refuse real-valued positions held in a floating-point type narrower than float32 (float16, bfloat16, float8):
    they cannot tell neighbouring positions apart (bfloat16 rounds 257 to 256), so two keys would collapse onto one
    position silently. Real-valued phases are computed in float64 from float32 or float64 positions.

    >>> check_real_dtype(torch.tensor([300.0, 301.0], dtype=torch.bfloat16), "target positions")
    Traceback (most recent call last):
    ...
    relaylens.errors.PositionError: target positions are torch.bfloat16, whose 8-bit mantissa cannot tell neighbouring positions apart (300.0 and 301.0 both read 300.0): distinct keys would share one position. Fix: pass real-valued positions as torch.float64 (or float32)
    """  # noqa: E501 - doctest: an exception message is matched on one line
    if not isinstance(positions, torch.Tensor) or not positions.is_floating_point():
        return
    info = torch.finfo(positions.dtype)
    if info.bits >= 32:
        return
    bits = {torch.float16: 11, torch.bfloat16: 8}.get(positions.dtype, info.bits)
    example = 2.0 ** bits + 44  # e.g. 300 and 301 in bfloat16
    shown = torch.tensor([example, example + 1]).to(positions.dtype).double().tolist()
    raise PositionError(f"{what} are {positions.dtype}, whose {bits}-bit mantissa cannot tell neighbouring positions "
                        f"apart ({example} and {example + 1} both read {shown[1] if shown[0] == shown[1] else shown}): "
                        "distinct keys would share one position. Fix: pass real-valued positions as torch.float64 "
                        "(or float32)")
