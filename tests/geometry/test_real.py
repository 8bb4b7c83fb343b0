"""Real-valued positions (relaylens.geometry.real): equal to the integer table path at integer positions for every
rope variant, equal to the model's own rotary at fractional positions, invertible, differentiable (gradcheck in
float64), and refused when non-finite, negative or past the rotary range."""

from __future__ import annotations

import pytest
import torch

from relaylens.errors import NonFiniteError, PositionError
from relaylens.geometry import fused as kernels
from relaylens.geometry.real import is_real
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.model.hf import call_rotary
from relaylens.testing import NOPE_VARIANTS, ROPE_VARIANTS, tiny_model

SOURCE = torch.tensor([[0, 3, 9, 10, 40, 900, 5000], [1, 2, 7, 64, 300, 2048, 4095]])  # [kv_head, n]
TARGET = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [0, 3, 900, 10, 40, 1200, 30000]])


@pytest.fixture(scope="module", params=ROPE_VARIANTS + NOPE_VARIANTS)
def factors(request):
    return request.param, RotaryFactors.from_model(tiny_model(request.param, seed=1))


def _layers(factors):
    return range(factors.num_layers) if factors.per_layer else [None]


@pytest.mark.parametrize("path", ["fused", "eager"])
def test_integer_valued_real_positions_equal_the_table_path(factors, path):
    """At integer positions the real path is the integer path: max relative error <= 1e-6 (measured: <= 2e-7)."""
    variant, factors = factors
    keys = torch.randn(2, SOURCE.shape[1], factors.head_dim, generator=torch.Generator().manual_seed(0))
    for layer in _layers(factors):
        if path == "eager":
            with kernels.disabled():
                table = relocate_keys(keys, SOURCE, TARGET, factors, layer)
        else:
            table = relocate_keys(keys, SOURCE, TARGET, factors, layer)
        real = relocate_keys(keys, SOURCE, TARGET.double(), factors, layer)
        both = relocate_keys(keys, SOURCE.double(), TARGET.double(), factors, layer)
        scale = float(table.abs().max())
        assert float((real - table).abs().max()) / scale <= 1e-6, (variant, layer)
        assert float((both - table).abs().max()) / scale <= 1e-6, (variant, layer)
        assert real.dtype == keys.dtype and not real.requires_grad


def test_phases_at_integers_are_the_models_table_entries(factors):
    variant, factors = factors
    positions = torch.tensor([0, 1, 17, 4095, 30000])
    for layer in _layers(factors):
        cos, sin = factors.real_plane_factors(positions.double(), layer)
        want_cos, want_sin = factors.plane_factors(positions, layer)
        assert torch.equal(cos.float(), want_cos) and torch.equal(sin.float(), want_sin), (variant, layer)


def test_fractional_phases_match_the_models_own_rotary(factors):
    """The model's rotary module itself accepts float position ids (float32 angles): at small positions its phases
    and the real path's agree to float32 rounding, amplitude (YaRN) included."""
    variant, factors = factors
    positions = torch.tensor([0.25, 3.7, 10.5, 99.49, 1000.125], dtype=torch.float64)
    for layer in _layers(factors):
        if layer in factors.nope_layers:
            continue
        layer_type = factors.layer_types[layer] if layer is not None else None
        cos, sin = call_rotary(factors.rotary_emb, positions.float()[None], layer_type)  # [1, n, rotary_dim]
        pick = slice(0, factors.rotary_dim // 2) if factors.cat_form else slice(0, None, 2)
        want_cos, want_sin = cos[0][:, pick].double(), sin[0][:, pick].double()
        got_cos, got_sin = factors.real_plane_factors(positions, layer)
        assert float((got_cos - want_cos).abs().max()) < 2e-4, (variant, layer)  # float32 angle at 1000: ~6e-5
        assert float((got_sin - want_sin).abs().max()) < 2e-4, (variant, layer)
        small = positions < 20
        assert float((got_cos[small] - want_cos[small]).abs().max()) < 2e-6, (variant, layer)


def test_fractional_round_trip_and_composition(factors):
    variant, factors = factors
    keys = torch.randn(2, 4, factors.head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    source = torch.tensor([[0, 5, 9, 40]] * 2)
    there = torch.tensor([[0.5, 6.25, 7.75, 12.125], [3.3, 4.4, 5.5, 6.6]], dtype=torch.float64)
    mid = there + 0.37
    for layer in _layers(factors):
        moved = relocate_keys(keys, source, there, factors, layer)
        back = relocate_keys(moved, there, source, factors, layer)
        assert float((back - keys).abs().max()) < 1e-10, (variant, layer)
        twice = relocate_keys(relocate_keys(keys, source, mid, factors, layer), mid, there, factors, layer)
        assert float((twice - moved).abs().max()) < 1e-10, (variant, layer)


@pytest.mark.parametrize("variant", ["llama_yarn", "llama3", "phi_partial", "cohere_interleaved",
                                     "glm_partial_interleaved", "gemma3", "smollm3_nope"])
def test_relocation_gradcheck_in_positions(variant):
    factors = RotaryFactors.from_model(tiny_model(variant))
    layer = factors.num_layers - 1 if factors.per_layer else None
    keys = torch.randn(2, 5, factors.head_dim, dtype=torch.float64, requires_grad=True)
    source = torch.tensor([[1.0, 3.0, 9.0, 10.0, 40.0]] * 2, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[1.3, 2.2, 3.7, 4.1, 5.9], [0.2, 3.4, 9.6, 10.3, 40.45]], dtype=torch.float64,
                          requires_grad=True)
    assert torch.autograd.gradcheck(lambda k, s, t: relocate_keys(k, s, t, factors, layer), (keys, source, target))


def test_integer_positions_never_take_the_real_path():
    assert not is_real(torch.tensor([1, 2])) and is_real(torch.tensor([1.0])) and not is_real([1.5])


@pytest.mark.parametrize("target, error, message", [
    (torch.tensor([[1.0, float("nan")]]), NonFiniteError, "NaN or inf"),
    (torch.tensor([[1.0, float("inf")]]), NonFiniteError, "NaN or inf"),
    (torch.tensor([[-0.5, 2.0]]), PositionError, "negative position"),
    (torch.tensor([[1.0, 131071.5]]), PositionError, "past what this model's rotary supports"),
])
def test_bad_real_positions_are_refused(target, error, message):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    with pytest.raises(error, match=message):
        relocate_keys(torch.randn(1, 2, factors.head_dim), torch.tensor([[0, 1]]), target.double(), factors)


# ---------------------------------------------------------------- issue 41, item 9: real-valued positions' precision

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_positions_are_refused_everywhere(dtype):
    """float16 / bfloat16 positions merge neighbours (bfloat16 reads 301 as 300): relocation, phase application and
    condition coordinates refuse them, naming the dtype, instead of moving two keys onto one position."""
    from relaylens.conditions.catalogue import make_coordinates
    from relaylens.errors import PositionError
    from relaylens.geometry.rotary import RotaryFactors, relocate_keys, rotate_keys
    from relaylens.geometry.selection import Selection
    from relaylens.testing import tiny_model

    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys = torch.randn(1, 2, factors.head_dim)  # [kv_head, n, head_dim]
    target = torch.tensor([[3000.0, 3001.0]], dtype=dtype)
    with pytest.raises(PositionError, match=f"{dtype}.*cannot tell neighbouring positions apart"):
        relocate_keys(keys, torch.tensor([[2, 5]]), target, factors)
    with pytest.raises(PositionError, match=str(dtype)):
        rotate_keys(keys, target, factors)
    sel = Selection.from_lists([[[2, 5]]], history_length=4000)
    with pytest.raises(PositionError, match=f"condition geometry: key positions are {dtype}"):
        make_coordinates("geometry", sel, target[None], 3002)
    with pytest.raises(PositionError, match="the question start are"):
        make_coordinates("geometry", sel, target[None].double(), torch.tensor(3002.5, dtype=dtype))
    float32 = relocate_keys(keys, torch.tensor([[2, 5]]), target.float(), factors)  # float32 and up: accepted
    assert torch.isfinite(float32).all()
