"""Real-valued positions: relocation of kept keys to floating-point target positions, differentiable in them.

Axes: ``n`` slots, ``head_dim``, ``plane`` (:mod:`relaylens.geometry`).

Rotary phases are smooth functions of position, so a key can sit at ``p' = 12.3``. The phase there is the model's own
table entry at the nearest integer ``n`` (amplitude included: YaRN's ``a``) rotated by ``omega (p' - n)`` with the
model's inverse frequencies ``omega`` (:meth:`~relaylens.geometry.rotary.RotaryFactors.real_plane_factors`),
computed in float64. Relocation then multiplies each plane by ``(c' + i s') (c - i s) / (c^2 + s^2)`` (float64) and
applies it in float32 (float64 for float64 keys), so at integer positions it is the integer path's map up to float32
rounding, and ``dK'/dp' = i omega K'`` per plane. Length-dependent rope types (``dynamic``, ``longrope``) are
refused when the factors are read, as for integer positions.

Example (a key moved to 7.5 and back, and the phase at an integer position equals the model's table):
    >>> import torch
    >>> from relaylens.geometry.rotary import RotaryFactors, relocate_keys
    >>> from relaylens.testing import tiny_model
    >>> factors = RotaryFactors.from_model(tiny_model("llama_yarn"))
    >>> keys = torch.randn(1, 3, 16)                                     # [kv_head, n, head_dim]
    >>> src = torch.tensor([[2, 5, 9]])
    >>> there = relocate_keys(keys, src, torch.tensor([[7.5, 8.0, 11.25]], dtype=torch.float64), factors)
    >>> back = relocate_keys(there, torch.tensor([[7.5, 8.0, 11.25]], dtype=torch.float64), src, factors)
    >>> bool((back - keys).abs().max() < 1e-5)
    True
    >>> c, s = factors.real_plane_factors(torch.tensor([5.0], dtype=torch.float64))
    >>> bool((c.float() == factors.plane_factors(torch.tensor([5]))[0]).all())
    True
"""

from __future__ import annotations

import torch

from relaylens.errors import NonFiniteError, ShapeError


def is_real(positions) -> bool:
    """Whether ``positions`` are real-valued (a floating-point tensor), as opposed to integer positions."""
    return isinstance(positions, torch.Tensor) and positions.is_floating_point()


def relocate_real(keys: torch.Tensor, source_positions: torch.Tensor, target_positions: torch.Tensor, factors,
                  layer: int | None = None) -> torch.Tensor:
    """``K' = R(p') R(p)^-1 K`` with real-valued (or integer) positions; differentiable in keys and positions.

    Args:
        keys: ``[..., n, head_dim]`` post-rotary keys (any dtype).
        source_positions, target_positions: ``[..., n]`` (broadcastable), floating point or integer.
        factors: the model's :class:`~relaylens.geometry.rotary.RotaryFactors`.
        layer: the layer index (models whose rotary differs per layer, or with NoPE layers).

    Returns ``[..., n, head_dim]`` in the keys' dtype; non-rotary features are copied. Runs with whatever grad mode
    the caller set (:func:`~relaylens.geometry.rotary.relocate_keys` turns it on when something requires grad).
    """
    if keys.shape[-1] != factors.head_dim:
        raise ShapeError(f"keys have head_dim {keys.shape[-1]}, the model's is {factors.head_dim}")
    lead = keys.shape[:-1]  # [..., n]
    try:
        source = torch.broadcast_to(torch.as_tensor(source_positions), lead)
        target = torch.broadcast_to(torch.as_tensor(target_positions), lead)
    except RuntimeError as err:
        raise ShapeError(
            f"positions {tuple(torch.as_tensor(source_positions).shape)} / "
            f"{tuple(torch.as_tensor(target_positions).shape)} do not broadcast to the keys' slots {tuple(lead)} (keys "
            f"{tuple(keys.shape)}); give one position per slot"
        ) from err
    factors.check_any_positions(source, "source positions")
    factors.check_any_positions(target, "target positions")
    if keys.numel() == 0:
        return keys.clone()
    from_c, from_s = factors.real_plane_factors(source.reshape(-1), layer)  # [slots, plane] float64
    to_c, to_s = factors.real_plane_factors(target.reshape(-1), layer)
    amplitude_sq = from_c * from_c + from_s * from_s  # a^2 (1 for default RoPE)
    turn_c = (to_c * from_c + to_s * from_s) / amplitude_sq  # (c' + i s') (c - i s) / a^2
    turn_s = (to_s * from_c - to_c * from_s) / amplitude_sq
    compute = torch.float64 if keys.dtype == torch.float64 else torch.float32  # applied in float32
    flat = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
    rotary = factors.rotary_dim
    x = flat[:, :rotary].to(compute)
    turn_c, turn_s = turn_c.to(device=x.device, dtype=compute), turn_s.to(device=x.device, dtype=compute)
    if factors.layout == "split_half":
        x1, x2 = x[:, : rotary // 2], x[:, rotary // 2:]
        turned = torch.cat((x1 * turn_c - x2 * turn_s, x1 * turn_s + x2 * turn_c), dim=-1)
    else:
        x1, x2 = x[:, 0::2], x[:, 1::2]
        turned = torch.stack((x1 * turn_c - x2 * turn_s, x1 * turn_s + x2 * turn_c), dim=-1).reshape(x.shape)
    out = torch.cat((turned.to(keys.dtype), flat[:, rotary:]),
                    dim=-1) if rotary < flat.shape[-1] else turned.to(keys.dtype)
    if not bool(torch.isfinite(out.detach()).all()):
        where = "the keys" if not bool(torch.isfinite(flat.detach()).all()) else f"the relocated keys ({keys.dtype})"
        raise NonFiniteError(f"{where} {tuple(keys.shape)} contain NaN or inf; relocation refuses to propagate them. "
                             "Fix: check the prefill cache; run the model in float32 or bfloat16")
    return out.reshape(keys.shape)
