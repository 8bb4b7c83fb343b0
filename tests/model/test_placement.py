"""Model placement and rotary overrides: parsing, device resolution, overrides applied before the weights load
(checked against transformers' own rotary code), and bfloat16 relocation against direct rotation."""

from __future__ import annotations

import sys

import pytest
import torch

from relaylens.errors import RelaylensError
from relaylens.geometry.rotary import RotaryFactors, relocate_keys, rotate_keys
from relaylens.model.placement import (
    Placement,
    apply_rope_override,
    parse_rope_scaling,
    resolve_device,
    resolve_dtype,
)
from relaylens.testing import ROPE_VARIANTS, tiny_config, tiny_model


@pytest.mark.parametrize(("text", "expected"), [
    ("yarn:4", {"rope_type": "yarn", "factor": 4.0}),
    ("yarn:4:32768", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("linear:2", {"rope_type": "linear", "factor": 2.0}),
    ("llama3:8:1:4:8192", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}),
    ("yarn:factor=4,original_max_position_embeddings=32768",
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("none", None),
])
def test_parse_rope_scaling(text, expected):
    assert parse_rope_scaling(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("dynamic:2", "unknown type"), ("yarn", "needs factor"), ("yarn:x", "not a number"), ("yarn:-1", "positive"),
    ("linear:2:3", "at most 1"), ("llama3:8", "needs low_freq_factor"), ("yarn:beta=3", "no parameter"),
])
def test_bad_rope_scaling_is_one_clear_error(text, message):
    with pytest.raises(RelaylensError, match=message):
        parse_rope_scaling(text)


def test_device_and_dtype_resolution(monkeypatch):
    assert resolve_device("cpu") == "cpu" and resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype(None, "cuda:0") == torch.bfloat16 and resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(RelaylensError, match="choose one of"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(RelaylensError, match="not a device"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RelaylensError, match="CUDA is not available"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    # auto with GPUs maps the launcher's LOCAL_RANK to its own GPU (torchrun / accelerate)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == "cuda:3" and resolve_device("auto", local_rank=1) == "cuda:1"
    with pytest.raises(RelaylensError, match="no such GPU"):
        resolve_device("cuda:7")


def test_placement_records_everything_and_refuses_device_with_map():
    placement = Placement.resolve("cpu", "bfloat16", None, "eager", "yarn:4:32768", 131072)
    assert placement.to_dict() == {"device": "cpu", "dtype": "bfloat16", "device_map": None,
                                   "attn_implementation": "eager", "max_position": 131072,
                                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 32768},
                                   "dtype_reason": None}
    with pytest.raises(RelaylensError, match="not both"):
        Placement.resolve("cuda:0", None, "auto")


@pytest.mark.parametrize(("flags", "dtype", "why"), [
    ("fpu sse avx512f avx512_bf16 amx_tile", "bfloat16", "AVX512-BF16"),
    ("fpu amx_bf16 amx_tile avx512_bf16", "bfloat16", "AMX-BF16 and AVX512-BF16"),
    ("fpu sse avx2 avx512f", "float32", "neither AMX-BF16 nor AVX512-BF16"),
])
def test_dtype_auto_detects_native_bfloat16_and_records_why(monkeypatch, flags, dtype, why):
    from relaylens.model.placement import choose_dtype

    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", flags)
    placement = Placement.resolve("cpu", "auto")
    assert placement.dtype == dtype
    assert placement.dtype_reason.startswith(f"auto: {dtype}, ") and why in placement.dtype_reason
    assert choose_dtype(None, "cpu") == (torch.float32, None)  # the default stays float32 on CPU
    assert choose_dtype("float32", "cpu") == (torch.float32, None)


def test_explicit_bfloat16_without_native_support_warns_once(monkeypatch):
    from relaylens.model import placement as module

    monkeypatch.setattr(module, "_WARNED", set())
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", "fpu sse avx2")
    with pytest.warns(RuntimeWarning, match=r"without native bfloat16 .*neither AMX-BF16 nor AVX512-BF16.*slower than "
                                            r"float32. Fix: --dtype float32, or --dtype auto"):
        assert Placement.resolve("cpu", "bfloat16").dtype == "bfloat16"  # slow, not refused
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Placement.resolve("cpu", "bfloat16")  # once per process
    monkeypatch.setattr(module, "_WARNED", set())
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", "avx512_bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Placement.resolve("cpu", "bfloat16")  # native: no warning


def test_dtype_auto_on_cuda_asks_the_device(monkeypatch):
    from relaylens.model.placement import bfloat16_native

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert bfloat16_native("cuda:0") == (False, "this CUDA device has no native bfloat16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert bfloat16_native("cuda") == (True, "CUDA device supports bfloat16")


def test_run_config_records_dtype_auto_for_the_manifest(monkeypatch, tmp_path):
    from relaylens.experiments.config import RunConfig

    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", "avx512_bf16")
    recorded = RunConfig(dtype="auto").placement().to_dict()
    assert recorded["dtype"] == "bfloat16" and recorded["dtype_reason"] == "auto: bfloat16, CPU reports AVX512-BF16"


def test_override_keeps_theta_and_targets_global_layers_of_gemma3():
    config = tiny_config("gemma3")
    apply_rope_override(config, parse_rope_scaling("linear:8"), 4096)
    assert config.rope_parameters["full_attention"] == {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 8.0}
    assert config.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert config.max_position_embeddings == 4096


@pytest.fixture(scope="module")
def plain_qwen2_dir(tmp_path_factory):
    """A tiny Qwen2 saved with *default* RoPE and a 32,768 context: the override must turn it into YaRN x4."""
    from transformers import AutoModelForCausalLM

    from relaylens.testing import tiny_tokenizer

    config = tiny_config("qwen2_yarn", max_position_embeddings=32768)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 1e6}
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen2") / "plain-qwen2"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_yarn_override_relocation_matches_direct_rotation_to_131000(plain_qwen2_dir):
    from relaylens.model.loading import load_model

    model, _ = load_model(plain_qwen2_dir, rope_scaling="yarn:4:32768", max_position=131072)
    assert model.config.rope_parameters["rope_type"] == "yarn" and model.config.max_position_embeddings == 131072
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "yarn" and rotary.attention_scaling > 1.0  # YaRN's amplitude is really in use
    factors = RotaryFactors.from_model(model)
    generator = torch.Generator().manual_seed(11)
    n = 512
    content = torch.randn(1, 2, n, factors.head_dim, generator=generator)  # [B, kv_head, n, D] pre-rotary keys
    source = torch.sort(torch.randint(0, 131_001, (n,), generator=generator)).values
    target = torch.sort(torch.randint(0, 131_001, (n,), generator=generator)).values
    source[-1], target[-1] = 131_000, 0  # the extremes
    apply = sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb
    with torch.no_grad():
        cos_p, sin_p = rotary(torch.zeros(1), source[None])
        cos_q, sin_q = rotary(torch.zeros(1), target[None])
    _, at_source = apply(content, content, cos_p, sin_p)  # transformers' own rotation at p
    _, direct = apply(content, content, cos_q, sin_q)  # ... and at p'
    moved = relocate_keys(at_source, source, target, factors)
    assert float((moved - direct).abs().max()) <= 1e-5


def test_plain_load_keeps_the_saved_rotary(plain_qwen2_dir):
    from relaylens.model.loading import load_model

    model, _ = load_model(plain_qwen2_dir, dtype="bfloat16", device="cpu")
    assert model.config.rope_parameters["rope_type"] == "default" and model.dtype == torch.bfloat16


def _plane_radius(x: torch.Tensor, factors: RotaryFactors) -> torch.Tensor:
    rot = x[..., : factors.rotary_dim]
    if factors.layout == "split_half":
        half = factors.rotary_dim // 2
        radius = torch.sqrt(rot[..., :half] ** 2 + rot[..., half:] ** 2)
        return torch.cat((radius, radius), dim=-1)
    return torch.sqrt(rot[..., 0::2] ** 2 + rot[..., 1::2] ** 2).repeat_interleave(2, dim=-1)


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
def test_bfloat16_relocation_within_one_ulp_of_direct_rotation(variant):
    """A bf16 cache (content rotated at p, rounded once) relocated to p' vs the content rotated at p' and rounded to
    bf16: within one bf16 spacing at the magnitude of each rotary plane (a rotation mixes a plane's two features, so
    that is the scale of its rounding); pass-through features bit for bit."""
    model = tiny_model(variant, seed=1)
    factors = RotaryFactors.from_model(model)
    layer = 0 if factors.per_layer else None
    generator = torch.Generator().manual_seed(5)
    content = torch.randn(2, 1024, factors.head_dim, generator=generator)  # [kv_head, n, D]
    source = torch.randint(0, 131_000, (1024,), generator=generator)
    target = torch.randint(0, 131_000, (1024,), generator=generator)
    cached = rotate_keys(content, source, factors, layer).bfloat16()
    direct = rotate_keys(content, target, factors, layer).bfloat16().float()
    moved = relocate_keys(cached, source, target, factors, layer)
    assert moved.dtype == torch.bfloat16
    moved = moved.float()
    spacing = torch.pow(2.0, torch.floor(torch.log2(_plane_radius(direct, factors)))) * torch.finfo(torch.bfloat16).eps
    ulps = (moved[..., : factors.rotary_dim] - direct[..., : factors.rotary_dim]).abs() / spacing
    assert float(ulps.max()) <= 1.0
    assert torch.equal(moved[..., factors.rotary_dim:], cached.float()[..., factors.rotary_dim:])
