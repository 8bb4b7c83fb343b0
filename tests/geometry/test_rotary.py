"""Relocation against independent references: transformers' own rotary code, a complex-number reference, identities."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import DynamicCache

from relaylens.errors import PositionError, RopeError, ShapeError
from relaylens.geometry import fused as kernels
from relaylens.geometry.rotary import (
    RotaryFactors,
    relocate_keys,
    rotate_keys,
    unrotate_keys,
)
from relaylens.testing import ROPE_VARIANTS, tiny_model

MAX_POSITION = 32768


@pytest.fixture(scope="module", params=ROPE_VARIANTS)
def variant_model(request):
    return request.param, tiny_model(request.param, seed=1)


@pytest.fixture(params=["fused", "eager"])
def relocation_path(request):
    """Run the test on the fused CPU kernel (relaylens.geometry.fused) and on the eager PyTorch path."""
    if request.param == "fused":
        assert kernels.fused_available(), "numba is a dependency: the fused kernel must be available"
        yield request.param
        return
    with kernels.disabled():
        yield request.param


def _hf_rotate(model, variant, pre_keys, cos, sin):
    """Rotate pre-rotary keys ``[B, H, T, D]`` with the modeling module's own apply_rotary_pos_emb."""
    attn = model.model.layers[0].self_attn
    apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    rotary_dim = cos.shape[-1]
    if variant == "phi_partial":  # Phi splits the rotary part off inside its attention forward
        rot, rest = pre_keys[..., :rotary_dim], pre_keys[..., rotary_dim:]
        _, rot = apply(rot, rot, cos, sin)
        return torch.cat((rot, rest), dim=-1)
    _, rotated = apply(pre_keys, pre_keys, cos, sin)
    return rotated


def _capture_pre_rotary_keys(model, ids, positions):
    """Forward ``ids`` at ``positions``; return per-layer pre-rotary keys ``[B, kv_head, T, D]`` and the cache."""
    captured, handles = {}, []
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        source = attn.k_norm if hasattr(attn, "k_norm") and not hasattr(attn, "q_layernorm") else attn.k_proj

        def hook(module, args, output, index=index):
            if output.dim() == 4:  # k_norm runs on [B, kv_head, T, D]
                captured[index] = output.detach().clone()
                return
            batch, seq = output.shape[0], output.shape[1]  # k_proj output [B, T, kv_head * D]
            captured[index] = output.reshape(batch, seq, -1, head_dim).transpose(1, 2).detach().clone()

        handles.append(source.register_forward_hook(hook))
    try:
        with torch.no_grad():
            # plain: keeps sliding layers whole
            out = model(ids, position_ids=positions, use_cache=True, cache=DynamicCache())
    finally:
        for handle in handles:
            handle.remove()
    return captured, out.cache


def _rotary_layer_type(model, layer):
    types = getattr(model.config, "layer_types", None)
    rotary = model.model.rotary_emb
    return types[layer] if isinstance(getattr(rotary, "rope_type", None), dict) else None


def _hf_cos_sin(model, positions, layer):
    layer_type = _rotary_layer_type(model, layer)
    dummy = torch.zeros(1)
    with torch.no_grad():
        if layer_type is None:
            return model.model.rotary_emb(dummy, positions)
        return model.model.rotary_emb(dummy, positions, layer_type)


def test_relocation_matches_transformers_direct_rotation(variant_model, relocation_path):
    """Oracle: rotate a captured pre-rotary key at p with transformers, relocate to p', compare to rotating at p'."""
    variant, model = variant_model
    factors = RotaryFactors.from_model(model)
    generator = torch.Generator().manual_seed(7)
    seq = 48
    ids = torch.randint(3, model.config.vocab_size, (1, seq), generator=generator)
    source = torch.sort(torch.randperm(MAX_POSITION, generator=generator)[:seq]).values[None]  # [1, T]
    target = torch.sort(torch.randperm(MAX_POSITION, generator=generator)[:seq]).values[None]
    pre_keys, cache = _capture_pre_rotary_keys(model, ids, source)
    worst = 0.0
    for layer, k_pre in pre_keys.items():
        cos_p, sin_p = _hf_cos_sin(model, source, layer)
        cos_q, sin_q = _hf_cos_sin(model, target, layer)
        at_source = _hf_rotate(model, variant, k_pre, cos_p, sin_p)  # [1, kv_head, T, D]
        # the oracle itself must reproduce what the model cached
        assert torch.allclose(at_source, cache.layers[layer].keys,
                              atol=1e-5), f"{variant} layer {layer}: capture broken"
        direct = _hf_rotate(model, variant, k_pre, cos_q, sin_q)
        moved = relocate_keys(at_source, source[:, None], target[:, None], factors,
                              layer=layer if factors.per_layer else None)
        worst = max(worst, float((moved - direct).abs().max()))
    assert worst <= 1e-5, f"{variant} ({relocation_path}): relocated vs direct rotation max abs error {worst:.2e}"


def test_bfloat16_cache_within_one_rounding(variant_model):
    variant, model = variant_model
    factors = RotaryFactors.from_model(model)
    generator = torch.Generator().manual_seed(3)
    content = torch.randn(2, 64, factors.head_dim, generator=generator)  # [kv_head, n, head_dim]
    source = torch.sort(torch.randperm(MAX_POSITION, generator=generator)[:64]).values
    target = torch.sort(torch.randperm(MAX_POSITION, generator=generator)[:64]).values
    layer = 0 if factors.per_layer else None
    cached = rotate_keys(content, source, factors, layer).bfloat16()
    direct = rotate_keys(content, target, factors, layer)  # float32 reference
    moved = relocate_keys(cached, source, target, factors, layer)
    assert moved.dtype == torch.bfloat16
    error = (moved.float() - direct).abs()
    one_rounding = (direct.bfloat16().float() - direct).abs().max()
    # the bf16 cache was already rounded once at p; relocation adds at most one more rounding at p'
    assert float(error.max()) <= 2.0 * float(one_rounding) + 1e-6


def _complex_reference(keys, source, target, model, layer_type, layout, rotary_dim):
    """Relocation written with torch.complex: z' = z * e^{i(phi(p') - phi(p))} using the model's inv_freq."""
    rotary = model.model.rotary_emb
    inv_freq = getattr(rotary, f"{layer_type}_inv_freq") if layer_type else rotary.inv_freq  # [plane]
    # angles as the model forms them (float32 product), then everything else in complex128
    phase_src = (source[..., None].float() * inv_freq.float()).double()
    phase_dst = (target[..., None].float() * inv_freq.float()).double()
    rot = keys[..., :rotary_dim].double()
    if layout == "split_half":
        z = torch.complex(rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2 :])
    else:
        z = torch.complex(rot[..., 0::2], rot[..., 1::2])
    z = z * torch.polar(torch.ones_like(phase_dst), phase_dst) * torch.polar(torch.ones_like(phase_src), -phase_src)
    if layout == "split_half":
        moved = torch.cat((z.real, z.imag), dim=-1)
    else:
        moved = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    return torch.cat((moved.float(), keys[..., rotary_dim:]), dim=-1)


@pytest.mark.parametrize("variant", ["llama", "cohere_interleaved", "glm_partial_interleaved", "phi_partial", "gemma3"])
def test_complex_number_reference(variant, relocation_path):
    model = tiny_model(variant)
    factors = RotaryFactors.from_model(model)
    generator = torch.Generator().manual_seed(11)
    keys = torch.randn(3, 2, 40, factors.head_dim, generator=generator)  # [layer-ish batch, kv_head, n, head_dim]
    source = torch.randint(0, MAX_POSITION, (3, 2, 40), generator=generator)
    target = torch.randint(0, MAX_POSITION, (3, 2, 40), generator=generator)
    layer = 0 if factors.per_layer else None
    moved = relocate_keys(keys, source, target, factors, layer)
    reference = _complex_reference(keys, source, target, model, factors.layer_types[0], factors.layout,
                                   factors.rotary_dim)
    assert float((moved - reference).abs().max()) <= 1e-6
    assert torch.equal(moved[..., factors.rotary_dim :],
                       keys[..., factors.rotary_dim :]), "pass-through features changed"


@pytest.mark.parametrize("variant", ["llama", "llama_yarn", "glm_partial_interleaved"])
def test_identity_and_round_trip(variant):
    factors = RotaryFactors.from_model(tiny_model(variant))
    keys = torch.randn(2, 30, factors.head_dim)
    source = torch.arange(30).expand(2, 30) * 17
    assert torch.equal(relocate_keys(keys, source, source, factors), keys)
    there = relocate_keys(keys, source, source + 1000, factors)
    back = relocate_keys(there, source + 1000, source, factors)
    assert float((back - keys).abs().max()) <= 1e-5
    assert not torch.allclose(there, keys, atol=1e-3)


def test_yarn_amplitude_division_is_required():
    """Without the 1/a^2 of the inverse, YaRN keys come out a^2 too large; the oracle must catch that."""
    model = tiny_model("llama_yarn")
    factors = RotaryFactors.from_model(model)
    amplitude = model.model.rotary_emb.attention_scaling
    assert amplitude > 1.1
    content = torch.randn(1, 20, factors.head_dim)
    source, target = torch.arange(20) * 31, torch.arange(20)
    cached, direct = rotate_keys(content, source, factors), rotate_keys(content, target, factors)
    moved = relocate_keys(cached, source, target, factors)
    assert float((moved - direct).abs().max()) <= 1e-5
    real, imag = _relocation_without_division(factors, source, target)
    wrong = torch.cat((cached[..., :8] * real - cached[..., 8:] * imag,
                       cached[..., 8:] * real + cached[..., :8] * imag), -1)
    assert float((wrong - direct).abs().max()) > 1e-2
    assert torch.allclose(wrong.norm(dim=-1), direct.norm(dim=-1) * amplitude**2, rtol=1e-4)


def _relocation_without_division(factors, source, target):
    c_src, s_src = factors.plane_factors(source)
    c_dst, s_dst = factors.plane_factors(target)
    return c_dst * c_src + s_dst * s_src, s_dst * c_src - c_dst * s_src


def test_unrotate_inverts_rotate():
    factors = RotaryFactors.from_model(tiny_model("qwen2_yarn"))
    content = torch.randn(2, 9, factors.head_dim)
    positions = torch.arange(9) * 1000
    assert float((unrotate_keys(rotate_keys(content, positions, factors), positions,
                                factors) - content).abs().max()) <= 1e-5


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def llama_factors():
    return RotaryFactors.from_model(tiny_model("llama"))


@pytest.mark.parametrize(
    ("source", "target", "error", "message"),
    [
        (torch.tensor([0, -1, 2]), torch.tensor([0, 1, 2]), PositionError, "negative"),
        (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 200_000]), PositionError, "max_position_embeddings"),
        # floating-point positions are real-valued positions (tests/geometry/test_real.py); other dtypes are
        # refused
        (torch.tensor([True, False, True]), torch.tensor([0, 1, 2]), PositionError, "integer"),
        (torch.tensor([0, 1]), torch.tensor([0, 1]), ShapeError, "broadcast"),
    ],
)
def test_bad_positions(llama_factors, source, target, error, message, relocation_path):
    with pytest.raises(error, match=message):
        relocate_keys(torch.randn(3, 16), source, target, llama_factors)


def test_wrong_head_dim(llama_factors):
    with pytest.raises(ShapeError, match="head_dim"):
        relocate_keys(torch.randn(3, 12), torch.arange(3), torch.arange(3), llama_factors)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_length_dependent_rope_types_are_refused(rope_type):
    params = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}
    if rope_type == "longrope":
        params.update(short_factor=[1.0] * 8, long_factor=[2.0] * 8, original_max_position_embeddings=4096)
    model = tiny_model("llama", rope_parameters=params)
    model.model.rotary_emb.rope_type = rope_type  # overrides set after init do not rebuild the module
    with pytest.raises(RopeError, match="changes its frequencies"):
        RotaryFactors.from_model(model)


def test_unknown_rope_type_is_refused():
    model = tiny_model("llama")
    model.model.rotary_emb.rope_type = "fancy"
    with pytest.raises(RopeError, match="unsupported rope type"):
        RotaryFactors.from_model(model)


def test_per_layer_model_needs_layer(llama_factors):
    factors = RotaryFactors.from_model(tiny_model("gemma3"))
    assert factors.per_layer and factors.layer_types[2] == "full_attention"
    with pytest.raises(RopeError, match="layer="):
        relocate_keys(torch.randn(3, 16), torch.arange(3), torch.arange(3), factors)
    sliding = relocate_keys(torch.ones(1, 16), torch.tensor([5]), torch.tensor([900]), factors, layer=0)
    full = relocate_keys(torch.ones(1, 16), torch.tensor([5]), torch.tensor([900]), factors, layer=2)
    assert not torch.allclose(sliding, full), "layers with different rotary bases must relocate differently"
