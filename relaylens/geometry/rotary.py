"""Rotary geometry: rotation mathematics (the exact relocation of cached keys) and :class:`RotaryFactors`, the
model's own rotary factors (read through :mod:`relaylens.model.hf`).

Axes, frames and names: the glossary of :mod:`relaylens.geometry`.

A cached key is ``R_a(p) k`` where ``R_a(p)`` multiplies each plane, read as a complex number ``z = x_1 + i x_2``,
by ``c + i s = a e^{i phi(p)}``; ``a`` is the attention-scaling amplitude (1 for default RoPE, ``0.1 ln(f) + 1``
for YaRN). Relocation computes ``K' = R_a(p') R_a(p)^-1 K``: per plane ``z' = z (c' + i s') (c - i s) / (c^2 + s^2)``,
with both ``(c, s)`` pairs taken from the model's own rotary embedding in float32, so the model's angle rounding at
``p`` is undone exactly (a single rotation by ``p' - p`` is not, see ``relaylens bench geometry``).

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> factors = RotaryFactors.from_model(tiny_model("llama"))
    >>> keys = torch.randn(2, 5, 16)                                  # [kv_head, n, head_dim]
    >>> src = torch.tensor([[0, 3, 9, 10, 40]] * 2)                    # [kv_head, n]
    >>> back = relocate_keys(relocate_keys(keys, src, src + 7, factors), src + 7, src, factors)
    >>> bool((back - keys).abs().max() < 1e-5)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from relaylens.errors import NonFiniteError, PositionError, RopeError, ShapeError
from relaylens.geometry import fused as kernels
from relaylens.geometry.positions import POSITION_LIMIT, check_positions, check_real_dtype
from relaylens.geometry.real import is_real, relocate_real
from relaylens.model.hf import (
    call_rotary,
    detect_layout,
    find_rotary_embedding,
    nope_layers,
    rotary_frequencies,
    rotary_types,
)

STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")
"""Rope types whose frequencies do not depend on the sequence length: relocation is exact for them."""
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")
"""Rope types whose frequencies change with the sequence length (``@dynamic_rope_update``): refused."""

_CHUNK_SLOTS = 4096  # slots relocated per step: the scratch phases stay in cache, so the pass is close to a copy


NOPE = "<no positional encoding>"
"""The layer type of NoPE layers (no rotary) in RotaryFactors' tables: their keys are never moved."""


@dataclass(frozen=True, eq=False)
class RotaryFactors:
    """The rotary factors of one loaded model, computed by the model's own rotary embedding.

    Attributes:
        rotary_emb: the model's rotary embedding module (never re-derived from the config).
        layout: ``"split_half"`` or ``"interleaved"`` pairing of features into planes.
        rotary_dim: number of rotated features (``head_dim * partial_rotary_factor``); the rest pass through.
        head_dim: features per key.
        layer_types: per layer, the argument the rotary embedding takes for that layer (Gemma-3:
            ``"sliding_attention"`` / ``"full_attention"``), or ``None`` for models with one rotary.
        rope_types: rope type per layer type (``{None: "yarn"}`` for single-rotary models).
        max_position: largest position + 1 the rotary type supports (``max_position_embeddings``), or None.
        cat_form: whether the embedding returns ``cat(freqs, freqs)`` (True) or repeat-interleaved frequencies.
    """

    rotary_emb: nn.Module
    layout: str
    rotary_dim: int
    head_dim: int
    layer_types: tuple[str | None, ...]
    rope_types: dict
    max_position: int | None
    cat_form: bool
    nope_layers: frozenset = frozenset()  # layers that apply no rotary: their keys carry no position (identity)
    _tables: dict = field(default_factory=dict, repr=False)  # layer type -> (cos, sin) [P, plane], filled lazily

    @classmethod
    def from_model(cls, model: nn.Module) -> RotaryFactors:
        """Read the factors of a loaded Hugging Face causal LM (refuses length-dependent rope types)."""
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        rotary = find_rotary_embedding(model)
        layer_types, raw_types = rotary_types(model)
        for layer_type, rope_type in raw_types.items():
            where = f" (layer type {layer_type})" if layer_type else ""
            if rope_type in DYNAMIC_ROPE_TYPES:
                raise RopeError(
                    f"rope type {rope_type!r}{where} changes its frequencies with the sequence length, so R(p) and "
                    f"R(p') would use different frequencies and relocation would be silently approximate. "
                    f"relaylens refuses it; use a model with one of {STATIC_ROPE_TYPES}"
                )
            if rope_type not in STATIC_ROPE_TYPES:
                raise RopeError(f"unsupported rope type {rope_type!r}{where}; supported: {STATIC_ROPE_TYPES}")
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        layout = detect_layout(model)
        for layer_type in dict.fromkeys(layer_types):  # phases that are finite and tell positions apart
            _check_phases(*call_rotary(rotary, torch.tensor([[1, 2]]), layer_type), layer_type)
        probe_type = layer_types[0]
        cos, _ = call_rotary(rotary, torch.tensor([[1, 2]]), probe_type)  # [1, 2, rotary_dim]
        rotary_dim = int(cos.shape[-1])
        half = rotary_dim // 2
        cat_form = bool(torch.equal(cos[..., :half], cos[..., half:]))
        if not cat_form and not torch.equal(cos[..., 0::2], cos[..., 1::2]):
            raise RopeError("the rotary embedding's cos is neither cat(freqs, freqs) nor repeat-interleaved")
        if rotary_dim > head_dim or rotary_dim % 2:
            raise RopeError(f"rotary width {rotary_dim} does not fit head_dim {head_dim}")
        max_position = getattr(text_config, "max_position_embeddings", None)
        return cls(rotary, layout, rotary_dim, int(head_dim), layer_types, dict(raw_types), max_position, cat_form,
                   nope_layers(model))

    # ------------------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def per_layer(self) -> bool:
        """True when layers use different rotary settings, or some layers none (relocation then needs ``layer=``)."""
        return self.layer_types[0] is not None or bool(self.nope_layers)

    def plane_factors(self, positions: torch.Tensor, layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-plane ``(c, s)`` float32 of shape ``[*positions.shape, rotary_dim // 2]`` at integer ``positions``.

        They are exactly what the model multiplies a plane by at those positions (amplitude included): rows of a
        table the model's rotary embedding computed once for ``0..P-1`` (``P`` grows to the largest position asked).
        """
        positions, high = self.check_positions_of(positions, "positions")  # int64: never a boolean mask
        cos_table, sin_table = self.tables(high + 1 if high >= 0 else 1, layer)  # [P, plane]
        flat = positions.reshape(-1).to(cos_table.device)
        shape = (*positions.shape, self.rotary_dim // 2)
        return cos_table[flat].reshape(shape), sin_table[flat].reshape(shape)

    def tables(self, size: int, layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` float32 ``[P >= size, plane]`` from the model's rotary embedding, cached per layer type."""
        layer_type = self._layer_type(layer)
        cached = self._tables.get(layer_type)
        if layer_type == NOPE and (cached is None or cached[0].shape[0] < size):  # no rotary: the identity phase
            device = next(self.rotary_emb.buffers(), torch.zeros(0)).device
            cached = (torch.ones(size, self.rotary_dim // 2, device=device),
                      torch.zeros(size, self.rotary_dim // 2, device=device))  # [P, plane]
            self._tables[layer_type] = cached
        if cached is None or cached[0].shape[0] < size:
            capacity = max(size, 4096, 0 if cached is None else 2 * cached[0].shape[0])
            capacity = max(size, min(capacity, self.position_limit))  # never a row the position rule refuses
            device = next(self.rotary_emb.buffers(), torch.zeros(0)).device
            cos, sin = call_rotary(self.rotary_emb, torch.arange(capacity, device=device)[None],
                                   layer_type)  # [1, P, rotary_dim]
            half = self.rotary_dim // 2
            pick = slice(0, half) if self.cat_form else slice(0, None, 2)
            cached = (cos[0][:, pick].contiguous(), sin[0][:, pick].contiguous())  # [P, plane]
            self._tables[layer_type] = cached
        return cached

    def complex_tables(self, size: int, layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(c + is, (c - is) / (c^2 + s^2))`` complex64 ``[P >= size, plane]``: forward and exact inverse phases."""
        layer_type = self._layer_type(layer)
        key = ("complex", layer_type)
        cached = self._tables.get(key)
        if cached is None or cached[0].shape[0] < size:
            cos, sin = self.tables(size, layer)  # [P, plane]
            amplitude_sq = cos * cos + sin * sin  # a^2: 1 for default RoPE, mscale^2 for YaRN
            cached = (torch.complex(cos, sin), torch.complex(cos / amplitude_sq, -sin / amplitude_sq))
            self._tables[key] = cached
        return cached

    def frequencies(self, layer: int | None = None) -> torch.Tensor:
        """Inverse frequencies ``[plane]`` float64 of the layer's rotary: the phase advance per position of every
        plane (zeros in NoPE layers). Read from the model's own buffer (:func:`relaylens.model.hf.rotary_frequencies`)
        and checked against the model's phase at position 1."""
        layer_type = self._layer_type(layer)
        key = ("frequencies", layer_type)
        cached = self._tables.get(key)
        if cached is None:
            cos, sin = self.tables(2, layer)  # [P, plane]
            if layer_type == NOPE:
                cached = torch.zeros(cos.shape[-1], dtype=torch.float64, device=cos.device)
            else:
                cached = rotary_frequencies(self.rotary_emb, layer_type).double().to(cos.device)  # [plane]
                at_one = torch.atan2(sin[1].double(), cos[1].double())  # the model's phase at position 1
                if cached.shape != at_one.shape or float((cached - at_one).abs().max()) > 1e-5:
                    raise RopeError(f"the rotary module's inverse frequencies {tuple(cached.shape)} do not reproduce "
                                    "its phases at position 1; real-valued positions need them. Fix: use integer "
                                    "positions with this model")
            self._tables[key] = cached
        return cached

    def real_plane_factors(self, positions: torch.Tensor, layer: int | None = None) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
        """Per-plane ``(c, s)`` float64 ``[*positions.shape, plane]`` at real-valued ``positions`` (differentiable in
        them).

        With ``n`` the nearest integer (``floor(p + 0.5)``) and ``f = p - n`` (in ``[-1/2, 1/2)``), the phase is the
        model's own table entry at ``n`` (amplitude included, exactly what :meth:`plane_factors` gives) rotated by
        ``omega f`` (:meth:`frequencies`), in float64: at integer positions it *is* the table entry, and
        ``d(c + is)/dp = i omega (c + is)``. Positions are checked by the caller (:meth:`check_real_positions`).
        """
        positions = positions.to(torch.float64)
        nearest = torch.floor(positions.detach() + 0.5)  # [*]
        size = int(nearest.max()) + 1 if positions.numel() else 1
        cos_table, sin_table = self.tables(max(size, 1), layer)  # [P, plane] float32
        index = nearest.reshape(-1).long().to(cos_table.device)
        shape = (*positions.shape, cos_table.shape[-1])
        c0 = cos_table[index].double().reshape(shape)
        s0 = sin_table[index].double().reshape(shape)
        angle = (positions - nearest).to(c0.device)[..., None] * self.frequencies(layer)  # [*, plane]
        rot_c, rot_s = torch.cos(angle), torch.sin(angle)
        return c0 * rot_c - s0 * rot_s, c0 * rot_s + s0 * rot_c

    def rotary_layer(self, layer_type: str | None) -> int | None:
        """A layer index whose rotary is the one the model calls with ``layer_type`` (None for single-rotary models
        without NoPE layers): how real-valued phases of new tokens pick their factors."""
        if not self.per_layer:
            return None
        for index, kind in enumerate(self.layer_types):
            if kind == layer_type and index not in self.nope_layers:
                return index
        raise RopeError(f"no rotary layer of type {layer_type!r}; the model's layer types are "
                        f"{sorted(set(map(str, self.layer_types)))}")

    def phase_tables(self, size: int, layer: int | None = None) -> tuple[torch.Tensor, ...]:
        """``(c, s, c / a^2, -s / a^2)`` float32 ``[P >= size, plane]``: phases and exact inverse phases per
        position."""
        cos, sin = self.tables(size, layer)  # [P, plane]
        key = ("phases", self._layer_type(layer))
        cached = self._tables.get(key)
        if cached is None or cached[0] is not cos:
            amplitude_sq = cos * cos + sin * sin  # a^2: 1 for default RoPE, mscale^2 for YaRN
            cached = (cos, sin, (cos / amplitude_sq).contiguous(), (-sin / amplitude_sq).contiguous())
            self._tables[key] = cached
        return cached

    def paired_phase_tables(self, size: int, layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`phase_tables` side by side, float32 ``[P >= size, 2 * plane]``: ``[c | s]`` and ``[c / a^2 | -s /
        a^2]`` (one contiguous row per position: what the fused CPU kernel reads)."""
        cos, sin, inv_cos, inv_sin = self.phase_tables(size, layer)  # [P, plane] each
        key = ("paired", self._layer_type(layer))
        cached = self._tables.get(key)
        if cached is None or cached[0] is not cos:
            cached = (cos, torch.cat((cos, sin), dim=-1), torch.cat((inv_cos, inv_sin), dim=-1))
            self._tables[key] = cached
        return cached[1], cached[2]

    def workspace(self, device) -> tuple[torch.Tensor, ...]:
        """Six ``[chunk, plane]`` float32 scratch buffers for :func:`relocate_keys`, allocated once per device.

        Reusing them keeps relocation free of per-call allocations (fresh pages cost more than the arithmetic).
        """
        key = ("workspace", str(device))
        cached = self._tables.get(key)
        if cached is None:
            cached = tuple(torch.empty(_CHUNK_SLOTS, self.rotary_dim // 2, device=device) for _ in range(6))
            self._tables[key] = cached
        return cached

    def _layer_type(self, layer: int | None) -> str | None:
        if not self.per_layer:
            return None
        if layer is None and self.nope_layers:
            raise RopeError(
                f"this model has layers without positional encoding (NoPE: layers {sorted(self.nope_layers)}), whose "
                "keys carry no position and must stay unmoved; pass layer=<index> so relocation treats each layer as "
                "the model does"
            )
        if layer is None:
            raise RopeError(
                f"this model uses different rotary settings per layer ({sorted(set(self.layer_types))}); "
                "pass layer=<index> so relocation uses that layer's own factors"
            )
        if not 0 <= layer < self.num_layers:
            raise ShapeError(f"layer {layer} out of range 0..{self.num_layers - 1}")
        return NOPE if layer in self.nope_layers else self.layer_types[layer]

    @property
    def position_limit(self) -> int:
        """One past the largest position this model's rotary tells apart: ``max_position_embeddings``, never more
        than :data:`~relaylens.model.hf.POSITION_LIMIT` (``2**24``, where float32 positions collapse)."""
        return POSITION_LIMIT if self.max_position is None else min(int(self.max_position), POSITION_LIMIT)

    def check_positions_of(self, positions, what: str, fix: str | None = None) -> tuple[torch.Tensor, int]:
        """The position rule (:func:`relaylens.geometry.positions.check_positions`) against this model's range:
        the positions as ``int64`` and the largest (-1 when there is none)."""
        return check_positions(positions, what, self.max_position, fix)

    @staticmethod
    def check_integer(positions, what: str) -> None:
        """Raise :class:`~relaylens.errors.PositionError` unless ``positions`` have an integer dtype (the dtype half of
        the position rule)."""
        check_positions(positions, what, bounds=False)

    def check_positions(self, positions, what: str, fix: str | None = None) -> int:
        """Raise :class:`~relaylens.errors.PositionError` for non-integer, negative or out-of-range positions
        (:meth:`check_positions_of`); ``fix`` replaces the default advice. Returns the largest position (-1 if none)."""
        return self.check_positions_of(positions, what, fix)[1]

    def check_real_positions(self, positions: torch.Tensor, what: str, fix: str | None = None) -> float:
        """:meth:`check_positions` for real-valued positions: finite, ``>= 0`` and at most ``position_limit - 1``
        (:attr:`position_limit`: ``max_position_embeddings``, never past ``2**24``). Returns the largest position
        (-1.0 when there is none). Positions narrower than float32 are refused (:func:`check_real_dtype`)."""
        check_real_dtype(positions, what)
        if positions.numel() == 0:
            return -1.0
        values = positions.detach().double()
        if not bool(torch.isfinite(values).all()):
            raise NonFiniteError(f"{what} contain NaN or inf; a key or token needs a finite position. Fix: check the "
                                 "geometry's parameters (a learned geometry that diverged: lower the learning rate)")
        low, high = (float(v) for v in torch.aminmax(values))
        if low < 0:
            raise PositionError(f"{what} contain a negative position ({low:g}); positions start at 0. "
                                f"Fix: {fix or 'give positions >= 0'}")
        limit = self.position_limit
        if high > limit - 1:
            if limit == POSITION_LIMIT:
                why = ("past 2**24 - 1: the rotary embedding computes phases from float32 positions, which cannot tell "
                       "positions apart from there on")
            else:
                why = f"past what this model's rotary supports (max_position_embeddings={limit})"
            advice = fix or "use a smaller shift or a model with a longer context"
            raise PositionError(f"{what} reach position {high:g}, {why}. "
                                f"{advice if advice.startswith('Fix:') else 'Fix: ' + advice}")
        return high

    def check_any_positions(self, positions: torch.Tensor, what: str, fix: str | None = None) -> float:
        """:meth:`check_positions` for integer positions, :meth:`check_real_positions` for floating-point ones."""
        if is_real(positions):
            return self.check_real_positions(positions, what, fix)
        return self.check_positions(positions, what, fix)


def _check_phases(cos: torch.Tensor, sin: torch.Tensor, layer_type: str | None) -> None:
    """Refuse a rotary embedding whose phases at positions 1 and 2 (``[1, 2, rotary_dim]``) are not finite, or equal
    in every plane (no positional encoding at all: an infinite rope factor, say)."""
    where = f" (layer type {layer_type})" if layer_type else ""
    if not bool(torch.isfinite(cos).all() and torch.isfinite(sin).all()):
        raise RopeError(f"the model's rotary embedding{where} gives non-finite phases (NaN or inf in cos/sin). Fix: "
                        "check the rope parameters of its config (--rope-scaling: finite values, factor >= 1)")
    if torch.equal(cos[0, 0], cos[0, 1]) and torch.equal(sin[0, 0], sin[0, 1]):
        raise RopeError(f"the model's rotary embedding{where} gives positions 1 and 2 the same phase in every plane: "
                        "it encodes no position, so there is nothing to relocate. Fix: check the rope parameters of "
                        "its config (a factor of inf or a zero inv_freq)")


def relocate_keys(
    keys: torch.Tensor,
    source_positions: torch.Tensor,
    target_positions: torch.Tensor,
    factors: RotaryFactors,
    layer: int | None = None,
) -> torch.Tensor:
    """Move post-rotary keys from ``source_positions`` to ``target_positions``: ``K' = R(p') R(p)^-1 K``.

    Args:
        keys: ``[..., n, head_dim]`` keys as the model cached them (any dtype; any leading shape, e.g.
            ``[batch, kv_head, n, head_dim]``).
        source_positions: ``[..., n]`` integer positions the keys carry now (broadcastable to ``keys.shape[:-1]``).
        target_positions: ``[..., n]`` positions they should carry: integers, or real values (floating point; see
            below).
        factors: :class:`RotaryFactors` of the model that produced the keys.
        layer: the layer index, required when the model's rotary differs per layer (Gemma-3).

    Returns:
        ``[..., n, head_dim]`` in the input dtype. Arithmetic runs in float32, float64 for float64 keys (undo the
        model's exact phase at ``p`` including the amplitude ``a^2``, apply the phase at ``p'``, fused into one
        complex multiplier per plane); non-rotary features are copied bit for bit; values are never touched.

    Autograd: when ``keys`` requires grad (and grad mode is on) the result carries the graph back to ``keys``
    (the map is linear in the keys; positions are integers and get no gradient). Otherwise (and for non-float64
    keys) the pass runs under ``torch.no_grad()`` as one relative rotation per slot, multiply-adds written in place
    into reused scratch buffers (``relaylens bench geometry`` compares it with a float32 copy).

    Real-valued positions: when either position tensor is floating point, the phases come from
    :meth:`RotaryFactors.real_plane_factors` (float64; the model's table entry at the nearest integer rotated by the
    fraction) and the map runs through :func:`relaylens.geometry.real.relocate_real`, differentiable in the keys and
    in the positions whenever they require grad. At integer positions it equals the integer path within float32
    rounding (``tests/geometry/test_real.py``). Integer positions never take that path.

    Raises:
        NonFiniteError: the keys hold NaN/inf, or the result would overflow the keys' dtype (never propagated).
    """
    if is_real(source_positions) or is_real(target_positions):
        tracked = keys.requires_grad or any(isinstance(p, torch.Tensor) and p.requires_grad
                                            for p in (source_positions, target_positions))
        with torch.set_grad_enabled(torch.is_grad_enabled() and tracked):
            return relocate_real(keys, source_positions, target_positions, factors, layer)
    if (torch.is_grad_enabled() and keys.requires_grad) or keys.dtype == torch.float64:
        with torch.set_grad_enabled(torch.is_grad_enabled() and keys.requires_grad):
            return _relocate(keys, source_positions, target_positions, factors, layer)  # differentiable (and float64)
    with torch.no_grad():
        return _relocate(keys, source_positions, target_positions, factors, layer, fast=True)


def _relocate(keys, source_positions, target_positions, factors: RotaryFactors, layer: int | None,
              fast: bool = False) -> torch.Tensor:
    if keys.shape[-1] != factors.head_dim:
        raise ShapeError(f"keys have head_dim {keys.shape[-1]}, the model's is {factors.head_dim}")
    lead = keys.shape[:-1]  # [..., n]
    try:
        source = torch.broadcast_to(source_positions, lead)
        target = torch.broadcast_to(target_positions, lead)
    except RuntimeError as err:
        raise ShapeError(
            f"positions {tuple(source_positions.shape)} / {tuple(target_positions.shape)} do not broadcast to the "
            f"keys' slots {tuple(lead)} (keys {tuple(keys.shape)}); give one position per slot"
        ) from err
    if fast and keys.numel() and kernels.usable(keys, factors.rotary_dim):
        fused = _relocate_fused(keys, source, target, factors, layer)
        if fused is not None:
            return fused
    source, source_max = factors.check_positions_of(source, "source positions")  # int64, any integer width arrived
    target, target_max = factors.check_positions_of(target, "target positions")
    size = max(source_max, target_max) + 1
    if keys.numel() == 0:
        return keys.clone()
    if fast:
        return _relocate_in_place(keys, source, target, factors, layer, size)
    forward, inverse = factors.complex_tables(size, layer)  # [P, plane] complex64
    flat_src = source.reshape(-1).to(forward.device)  # [slots]
    flat_dst = target.reshape(-1).to(forward.device)
    flat_keys = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
    out = torch.empty(flat_keys.shape, dtype=keys.dtype, device=keys.device)
    rotary = factors.rotary_dim
    if rotary < keys.shape[-1]:
        out[:, rotary:] = flat_keys[:, rotary:]  # pass-through features, bit for bit
    one = torch.ones((), dtype=forward.dtype, device=forward.device)
    for start in range(0, flat_keys.shape[0], _CHUNK_SLOTS):
        rows = slice(start, start + _CHUNK_SLOTS)
        src, dst = flat_src[rows], flat_dst[rows]
        multiplier = torch.where((src == dst)[:, None], one, forward[dst] * inverse[src])  # [chunk, plane]
        out[rows, :rotary] = multiply_planes(flat_keys[rows, :rotary], multiplier, factors.layout)
        # one pass while the chunk is in cache
        if not math.isfinite(float(out[rows].detach().sum(dtype=torch.float32))):
            _raise_non_finite(flat_keys[rows].detach(), out[rows].detach(), start,
                              keys.shape)  # (a finite sum proves every entry finite)
    return out.reshape(keys.shape)


def _relocate_fused(keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor, factors: RotaryFactors,
                    layer: int | None) -> torch.Tensor | None:
    """The fused CPU kernel (:mod:`relaylens.geometry.fused`), or None when the model's tables live on another device.

    The position rule (:func:`relaylens.geometry.positions.check_positions`) checks the dtype here and leaves the
    range to the kernel, which checks each position against the tables as they are (at least 4,096 positions, never
    more than the rule allows), so the common call makes no separate pass over the positions. When one is outside,
    the rule checks them in full (negative or past the range: the usual error) and the tables grow to the largest.
    """
    source64, _ = check_positions(source, "source positions", bounds=False)  # int64, whatever integer width arrived
    target64, _ = check_positions(target, "target positions", bounds=False)
    forward, inverse = factors.paired_phase_tables(1, layer)  # [P, rotary_dim] each, P as built so far
    if forward.device.type != "cpu":
        return None
    flat_keys = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
    flat_src = source64.reshape(-1).to(device="cpu")  # [slots] int64
    flat_dst = target64.reshape(-1).to(device="cpu")

    def run(tables):
        return kernels.relocate_key_rows(flat_keys, flat_src, flat_dst, tables, factors.rotary_dim,
                                     factors.layout == "split_half")

    out, finite, inside = run((forward, inverse))
    if not inside:  # raises for an invalid position; otherwise the tables grow to cover the largest one
        size = max(factors.check_positions(source, "source positions"),
                   factors.check_positions(target, "target positions")) + 1
        out, finite, inside = run(factors.paired_phase_tables(size, layer))
        if not inside:
            raise AssertionError(f"phase tables of {size} positions do not cover positions below {size}")
    if not finite:  # name the first bad slot (or return quietly: the float64 check sum itself overflowed)
        for start in range(0, flat_keys.shape[0], _CHUNK_SLOTS):
            rows = slice(start, start + _CHUNK_SLOTS)
            _raise_non_finite(flat_keys[rows], out[rows], start, keys.shape)
    return out.reshape(keys.shape)


def _relocate_in_place(keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor, factors: RotaryFactors,
                       layer: int | None, size: int) -> torch.Tensor:
    """The no-autograd relocation: one relative rotation ``(c, s)`` per slot and plane from the model's phase tables
    (phase at ``p'`` times the exact inverse phase at ``p``), then one multiply and one multiply-add per feature written
    in place, all into scratch buffers reused across calls (no per-call allocations besides the result)."""
    cos_table, sin_table, inv_cos, inv_sin = factors.phase_tables(size, layer)  # [P, plane] float32 each
    flat_src = source.reshape(-1).to(cos_table.device)  # [slots]
    flat_dst = target.reshape(-1).to(cos_table.device)
    flat_keys = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
    out = torch.empty(flat_keys.shape, dtype=keys.dtype, device=keys.device)
    rotary = factors.rotary_dim
    if rotary < keys.shape[-1]:
        out[:, rotary:] = flat_keys[:, rotary:]  # pass-through features, bit for bit
    scratch = factors.workspace(cos_table.device)  # six [chunk, plane] float32 buffers, reused across calls
    for start in range(0, flat_keys.shape[0], _CHUNK_SLOTS):
        rows = slice(start, start + _CHUNK_SLOTS)
        src, dst = flat_src[rows], flat_dst[rows]
        n = src.shape[0]
        to_c, to_s, from_c, from_s, cos, sin = (buffer[:n] for buffer in scratch)
        torch.index_select(cos_table, 0, dst, out=to_c)  # the model's phase at p'
        torch.index_select(sin_table, 0, dst, out=to_s)
        torch.index_select(inv_cos, 0, src, out=from_c)  # the exact inverse of its phase at p
        torch.index_select(inv_sin, 0, src, out=from_s)
        torch.mul(to_c, from_c, out=cos).addcmul_(to_s, from_s, value=-1.0)  # one rotation from p to p'
        torch.mul(to_c, from_s, out=sin).addcmul_(to_s, from_c)
        same = (src == dst)[:, None]
        if bool(same.any()):  # keys that stay put: an identity, bit for bit
            cos.masked_fill_(same, 1.0)
            sin.masked_fill_(same, 0.0)
        _rotate_planes(flat_keys[rows, :rotary], cos, sin, factors.layout, out[rows, :rotary])
        if not math.isfinite(float(out[rows].sum(dtype=torch.float32))):  # one pass while the chunk is in cache
            _raise_non_finite(flat_keys[rows], out[rows], start, keys.shape)  # (a finite sum proves every entry finite)
    return out.reshape(keys.shape)


def _rotate_planes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, out: torch.Tensor) -> None:
    """``out`` = every plane ``(x_1, x_2)`` of ``x`` ``[rows, rotary_dim]`` rotated by ``(cos, sin)`` ``[rows, plane]``.

    One multiply and one multiply-add per output feature, written in place (``x_1 c - x_2 s``, ``x_1 s + x_2 c``).
    """
    if layout == "split_half":
        half = x.shape[-1] // 2
        x1, x2, o1, o2 = x[:, :half], x[:, half:], out[:, :half], out[:, half:]
    else:
        x1, x2, o1, o2 = x[:, 0::2], x[:, 1::2], out[:, 0::2], out[:, 1::2]
    if x.dtype != torch.float32 or out.dtype != torch.float32:  # compute in float32, cast back once
        x1, x2 = x1.float(), x2.float()
        first = x1 * cos
        first.addcmul_(x2, sin, value=-1.0)
        second = x1 * sin
        second.addcmul_(x2, cos)
        o1.copy_(first)
        o2.copy_(second)
        return
    torch.mul(x1, cos, out=o1)  # strided views of ``out``: written in place, no temporaries
    o1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x1, sin, out=o2)
    o2.addcmul_(x2, cos)


def _raise_non_finite(flat_keys: torch.Tensor, out: torch.Tensor, start: int, shape: torch.Size) -> None:
    """Refuse a relocation that produced NaN/inf: name the first bad slot and whether the input already had it.

    ``flat_keys`` and ``out`` are one chunk ``[rows, head_dim]`` starting at flattened slot ``start``. Returns quietly
    when every entry is finite (the chunk's float32 sum overflowed on huge but finite keys).
    """
    bad_in = ~torch.isfinite(flat_keys).all(-1)  # [rows]
    if bool(bad_in.any()):
        slot = start + int(torch.nonzero(bad_in)[0])
        raise NonFiniteError(
            f"keys {tuple(shape)} contain NaN or inf (first at flattened slot {slot}); relocation refuses to propagate "
            "them. Fix: check the prefill cache (an overflowing float16 forward pass, or a corrupted cache); run the "
            "model in float32 or bfloat16"
        )
    bad_out = torch.nonzero(~torch.isfinite(out).all(-1))
    if bad_out.numel() == 0:
        return
    slot = start + int(bad_out[0])
    raise NonFiniteError(
        f"relocated keys {tuple(shape)} overflow {out.dtype} (first at flattened slot {slot}, largest input magnitude "
        f"{float(flat_keys.abs().max()):g}): a rotated feature exceeds the dtype's range although the input was "
        "finite. Fix: keep the cache in float32 or bfloat16"
    )


def multiply_planes(x: torch.Tensor, multiplier: torch.Tensor, layout: str) -> torch.Tensor:
    """Multiply every plane of ``x`` ``[rows, rotary_dim]`` (read as ``x_1 + i x_2``) by ``multiplier`` ``[rows,
    plane]``.

    Runs in float32, or float64 (complex128) when ``x`` is float64; differentiable in ``x``.
    """
    if x.dtype == torch.float64:
        multiplier = multiplier.to(torch.complex128)
    else:
        x = x.float()
    if layout == "split_half":
        half = x.shape[-1] // 2
        z = torch.complex(x[:, :half], x[:, half:]) * multiplier
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.view_as_complex(x.reshape(x.shape[0], -1, 2).contiguous()) * multiplier
    return torch.view_as_real(z).reshape(x.shape[0], -1)


def rotate_keys(keys: torch.Tensor, positions: torch.Tensor, factors: RotaryFactors,
                layer: int | None = None) -> torch.Tensor:
    """Apply ``R_a(p)`` to *un-rotated* key or query content ``[..., n, head_dim]`` (used by phase replay).

    Differentiable in ``keys`` when they require grad (float64 keys are computed in float64); no graph otherwise.
    """
    with torch.set_grad_enabled(torch.is_grad_enabled() and keys.requires_grad):
        return _apply_phases(keys, positions, factors, layer, inverse=False)


def unrotate_keys(keys: torch.Tensor, positions: torch.Tensor, factors: RotaryFactors,
                  layer: int | None = None) -> torch.Tensor:
    """Apply ``R_a(p)^-1``: recover the un-rotated content of post-rotary keys or queries ``[..., n, head_dim]``.

    Differentiable in ``keys`` like :func:`rotate_keys`.
    """
    with torch.set_grad_enabled(torch.is_grad_enabled() and keys.requires_grad):
        return _apply_phases(keys, positions, factors, layer, inverse=True)


def _apply_phases(keys: torch.Tensor, positions: torch.Tensor, factors: RotaryFactors, layer: int | None,
                  inverse: bool) -> torch.Tensor:
    """``R_a(p)`` or its exact inverse ``(c - is) / (c^2 + s^2)`` on every plane; pass-through features copied.
    Real-valued positions (a floating-point tensor: a geometry condition in phase replay) take the phases of
    :meth:`RotaryFactors.real_plane_factors`, checked by :meth:`RotaryFactors.check_real_positions`."""
    positions = torch.broadcast_to(torch.as_tensor(positions), keys.shape[:-1])
    if is_real(positions):
        factors.check_real_positions(positions, "positions")
        cos, sin = (t.float() for t in factors.real_plane_factors(positions.reshape(-1).detach(), layer))
    else:
        cos, sin = factors.plane_factors(positions.reshape(-1),
                                         layer)  # [slots, plane] on the rotary's device (checked)
    cos, sin = cos.to(keys.device), sin.to(keys.device)
    multiplier = torch.complex(cos, sin)
    if inverse:
        multiplier = multiplier.conj() / (cos * cos + sin * sin)
    flat = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
    out = flat.clone()
    out[:, : factors.rotary_dim] = multiply_planes(flat[:, : factors.rotary_dim], multiplier,
                                                    factors.layout).to(keys.dtype)
    return out.reshape(keys.shape)



_DEVICE_CHUNK_ROWS = 1 << 20  # rows per step of the sync-free path: bounds its float32 scratch (~256 MB per buffer)


def layer_groups(factors: RotaryFactors, num_layers: int) -> list[tuple[int | None, list[int]]]:
    """Layers that share one rotary, as ``(layer argument, [layer, ...])``: one group ``(None, every layer)`` for a
    model with one rotary, else one per layer type (NoPE layers form their own, identity group). The layer argument
    is what :func:`relocate_keys` takes for every layer of the group.

    >>> from relaylens.testing import tiny_model
    >>> layer_groups(RotaryFactors.from_model(tiny_model("gemma3")), 3)
    [(0, [0, 1]), (2, [2])]
    """
    if not factors.per_layer:
        return [(None, list(range(num_layers)))]
    groups: dict = {}
    for layer in range(num_layers):
        groups.setdefault(factors._layer_type(layer), []).append(layer)
    return [(members[0], members) for members in groups.values()]


def relocate_keys_unchecked(keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor, factors: RotaryFactors,
                            size: int, layer: int | None = None) -> torch.Tensor:
    """:func:`relocate_keys` without autograd for integer positions the caller has already checked against the
    position rule (``size`` = largest position + 1), making **no host synchronisation** on an accelerator: phases,
    the identity for keys that stay put and the rotation all run on the keys' device, and finiteness is left to the
    caller (one check for many layers, :func:`relaylens.generation.cache.relocate_selection`).

    Keys ``[..., n, head_dim]`` with ``source`` / ``target`` ``[..., n]`` (int64, any device). CPU keys take the fused
    kernel where it runs (it checks finiteness itself and raises :class:`~relaylens.errors.NonFiniteError`). The
    arithmetic is the eager path's, operation for operation, so results equal :func:`relocate_keys` on the device.

    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> factors = RotaryFactors.from_model(tiny_model("llama"))
    >>> keys, src = torch.randn(2, 5, 16), torch.tensor([[0, 3, 9, 10, 40]] * 2)
    >>> moved = relocate_keys_unchecked(keys, src, src + 7, factors, size=48)
    >>> bool((moved - relocate_keys(keys, src, src + 7, factors)).abs().max() < 1e-6)
    True
    """
    if keys.shape[-1] != factors.head_dim:
        raise ShapeError(f"keys have head_dim {keys.shape[-1]}, the model's is {factors.head_dim}")
    with torch.no_grad():
        if keys.numel() and kernels.usable(keys, factors.rotary_dim):
            fused = _relocate_fused(keys, source, target, factors, layer)
            if fused is not None:
                return fused
        cos_table, sin_table, inv_cos, inv_sin = factors.phase_tables(max(size, 1), layer)  # [P, plane] float32
        flat_src = source.reshape(-1).to(cos_table.device, torch.int64)  # [slots]
        flat_dst = target.reshape(-1).to(cos_table.device, torch.int64)
        flat_keys = keys.reshape(-1, keys.shape[-1])  # [slots, head_dim]
        out = torch.empty(flat_keys.shape, dtype=keys.dtype, device=keys.device)
        rotary = factors.rotary_dim
        if rotary < keys.shape[-1]:
            out[:, rotary:] = flat_keys[:, rotary:]  # pass-through features, bit for bit
        for start in range(0, flat_keys.shape[0], _DEVICE_CHUNK_ROWS):
            rows = slice(start, start + _DEVICE_CHUNK_ROWS)
            src, dst = flat_src[rows], flat_dst[rows]
            to_c, to_s = cos_table.index_select(0, dst), sin_table.index_select(0, dst)  # the model's phase at p'
            from_c, from_s = inv_cos.index_select(0, src), inv_sin.index_select(0, src)  # exact inverse at p
            cos = torch.mul(to_c, from_c).addcmul_(to_s, from_s, value=-1.0)  # one rotation from p to p'
            sin = torch.mul(to_c, from_s).addcmul_(to_s, from_c)
            same = (src == dst)[:, None]  # keys that stay put: an identity, bit for bit (no host read)
            cos.masked_fill_(same, 1.0)
            sin.masked_fill_(same, 0.0)
            _rotate_planes(flat_keys[rows, :rotary], cos, sin, factors.layout, out[rows, :rotary])
        return out.reshape(keys.shape)
