"""Numerical guards of relocation, property-tested over every rope variant of ``relaylens.testing``.

* finite keys at any positions up to 131,071 relocate to finite keys (plane norms kept, pass-through bits kept);
* NaN / inf anywhere in the keys is refused (:class:`~relaylens.errors.NonFiniteError`), never propagated;
* float16 / bfloat16 caches relocate within one rounding (half a unit in the last place) of the float32 result.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaylens.errors import NonFiniteError
from relaylens.geometry import fused as kernels
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.testing import ROPE_VARIANTS, tiny_model

MAX_POSITION = 131071
MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
SMALLEST_SPACING = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])



@functools.cache
def factors_of(variant: str) -> RotaryFactors:
    return RotaryFactors.from_model(tiny_model(variant))


@st.composite
def relocations(draw, scales=(1e-3, 1.0, 30.0, 1e3)):
    """(factors, keys [kv_head, n, head_dim] float32, source [n], target [n], layer) with positions in 0..131071."""
    variant = draw(st.sampled_from(ROPE_VARIANTS))
    factors = factors_of(variant)
    n = draw(st.integers(1, 12))
    position = st.integers(0, MAX_POSITION)
    source = torch.tensor(draw(st.lists(position, min_size=n, max_size=n)))
    target = torch.tensor(draw(st.lists(position, min_size=n, max_size=n)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    keys = torch.randn(2, n, factors.head_dim, generator=generator) * draw(st.sampled_from(scales))
    if draw(st.booleans()):
        keys[:, : n // 2 + 1, ::3] = 0.0  # exact zeros: zero planes must stay zero, not become 0/0
    layer = draw(st.integers(0, factors.num_layers - 1)) if factors.per_layer else None
    return factors, keys, source, target, layer


def _plane_norms(x: torch.Tensor, factors: RotaryFactors) -> torch.Tensor:
    rot = x[..., : factors.rotary_dim].double()
    if factors.layout == "split_half":
        half = factors.rotary_dim // 2
        return torch.hypot(rot[..., :half], rot[..., half:])
    return torch.hypot(rot[..., 0::2], rot[..., 1::2])


@SETTINGS
@given(relocations())
def test_finite_keys_relocate_to_finite_keys(case):
    factors, keys, source, target, layer = case
    out = relocate_keys(keys, source, target, factors, layer=layer)
    assert out.dtype == keys.dtype and out.shape == keys.shape
    assert bool(torch.isfinite(out).all()), f"non-finite relocation {source.tolist()} -> {target.tolist()}"
    # a relocation is a pure phase change per plane: norms survive, pass-through features are copied bit for bit
    torch.testing.assert_close(_plane_norms(out, factors), _plane_norms(keys, factors), rtol=1e-5, atol=1e-30)
    assert torch.equal(out[..., factors.rotary_dim :], keys[..., factors.rotary_dim :])


@SETTINGS
@given(relocations(), st.sampled_from([float("nan"), float("inf"), float("-inf")]), st.data())
def test_non_finite_keys_are_refused_never_propagated(case, poison, data):
    factors, keys, source, target, layer = case
    head = data.draw(st.integers(0, keys.shape[0] - 1))
    slot = data.draw(st.integers(0, keys.shape[1] - 1))
    feature = data.draw(st.integers(0, keys.shape[2] - 1))  # rotary or pass-through feature
    keys[head, slot, feature] = poison
    with pytest.raises(NonFiniteError, match="NaN or inf"):
        relocate_keys(keys, source, target, factors, layer=layer)


def _ulp(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` numbers at each float32 ``reference`` value (subnormal spacing at and near zero)."""
    _, exponent = torch.frexp(reference)  # reference = m * 2**exponent, 0.5 <= |m| < 1
    spacing = torch.ldexp(torch.ones_like(reference), exponent - 1 - MANTISSA_BITS[dtype])
    spacing = torch.where(reference == 0, torch.zeros_like(spacing), spacing)  # frexp(0) has exponent 0
    return spacing.clamp_min(SMALLEST_SPACING[dtype])


@SETTINGS
@given(relocations(scales=(1e-2, 1.0, 100.0)), st.sampled_from([torch.float16, torch.bfloat16]))
def test_half_precision_caches_relocate_within_one_rounding_of_float32(case, dtype):
    factors, keys, source, target, layer = case
    low = keys.to(dtype)
    out = relocate_keys(low, source, target, factors, layer=layer)
    with kernels.disabled():  # the same float32 arithmetic as the half-precision path (the fused kernel uses FMA)
        reference = relocate_keys(low.float(), source, target, factors, layer=layer)  # same input, float32 result
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    error = (out.float() - reference).abs()
    worst = float((error / _ulp(reference, dtype)).max())
    # one rounding of the float32 result: round-to-nearest is at most half a unit in the last place away
    assert worst <= 0.5, f"{dtype} relocation is {worst:.3f} ulp from the float32 result (one rounding is <= 0.5)"
    assert torch.equal(out[..., factors.rotary_dim :], low[..., factors.rotary_dim :])


def test_float16_relocation_that_would_overflow_is_refused():
    """Finite float16 keys whose rotated features exceed 65504 must not silently turn into inf."""
    factors = factors_of("llama")
    keys = torch.full((1, 2, factors.head_dim), 60000.0, dtype=torch.float16)
    with pytest.raises(NonFiniteError, match="overflow torch.float16"):
        relocate_keys(keys, torch.tensor([0, 1]), torch.tensor([5, 9]), factors)
    fine = relocate_keys(keys.float(), torch.tensor([0, 1]), torch.tensor([5, 9]), factors)  # float32 has the range
    assert bool(torch.isfinite(fine).all()) and float(fine.abs().max()) > 65504
