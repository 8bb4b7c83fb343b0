"""``--dtype auto`` on a CPU with native bfloat16: measured once per machine, cached, and the faster decoder chosen."""

from __future__ import annotations

import json
import math

import pytest
import torch

from relaylens.model import dtype_auto
from relaylens.model.packed import packing_available
from relaylens.model.placement import Placement


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measurement on (the suite's flags mode lifted), a private cache, and a stand-in :func:`dtype_auto.measure`
    that returns the timings set in ``timings`` and counts its calls."""
    monkeypatch.delenv("RELAYLENS_DTYPE_AUTO", raising=False)
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", "fpu avx512f avx512_bf16")
    state = {"calls": 0, "decode_ms": {"float32": 1.0, "bfloat16": 0.5}}

    def fake(key, *args, **kwargs):
        state["calls"] += 1
        return dtype_auto.Measurement(key, dict(state["decode_ms"]), {"float32": 90.0, "bfloat16": 300.0}, True)

    monkeypatch.setattr(dtype_auto, "measure", fake)
    return state


@pytest.mark.parametrize("decode_ms, chosen", [({"float32": 4.0, "bfloat16": 1.0}, "bfloat16"),
                                               ({"float32": 1.0, "bfloat16": 4.0}, "float32")])
def test_auto_picks_each_phase_s_faster_dtype_here_and_says_so(measuring, decode_ms, chosen):
    """The fake measurement prefills faster in bfloat16 (300 vs 90 GFLOP/s): the model loads in bfloat16; where
    float32 decodes faster, its decoding steps' linear layers compute in float32 copies."""
    measuring["decode_ms"] = decode_ms
    placement = Placement.resolve("cpu", "auto")
    assert placement.dtype == "bfloat16"
    split = chosen != "bfloat16"
    assert placement.decode_dtype == (chosen if split else None)
    assert ("decode_dtype" in placement.to_dict()) == split  # absent when one dtype serves both phases
    assert placement.load_kwargs().get("decode_dtype") == (torch.float32 if split else None)
    reason = placement.dtype_reason
    head = "bfloat16 prefill, float32 decoding linear layers" if split else "bfloat16"
    assert reason.startswith(f"auto: {head}, CPU reports AVX512-BF16; measured on this machine (now): ")
    assert f"bfloat16 (prepacked) {decode_ms['bfloat16']:.3f} ms vs float32 {decode_ms['float32']:.3f} ms" in reason


def test_load_model_with_auto_applies_the_decoding_dtype(measuring, monkeypatch, tmp_path):
    from relaylens.model import loading, packed
    from relaylens.testing import tiny_model, tiny_tokenizer

    tiny_model("llama").save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    measuring["decode_ms"] = {"float32": 1.0, "bfloat16": 4.0}
    model, _ = loading.load_model(tmp_path / "m", dtype="auto")
    assert model.dtype == torch.bfloat16 and packed.decoding_dtype(model) == torch.float32
    measuring["decode_ms"] = {"float32": 4.0, "bfloat16": 1.0}
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "cache"))  # a fresh cache: measured again
    model, _ = loading.load_model(tmp_path / "m", dtype="auto")
    assert model.dtype == torch.bfloat16 and packed.decoding_dtype(model) is None


def test_measured_once_per_machine_then_read_from_the_cache(measuring, monkeypatch, tmp_path):
    first = Placement.resolve("cpu", "auto")
    second = Placement.resolve("cpu", "auto")
    assert measuring["calls"] == 1 and "(now)" in first.dtype_reason and "(cached)" in second.dtype_reason
    stored = json.loads((tmp_path / "dtype_auto.json").read_text())
    assert list(stored) == [dtype_auto.machine_key(frozenset({"fpu", "avx512f", "avx512_bf16"}))]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # another machine key: measured again, both kept
    Placement.resolve("cpu", "auto")
    assert measuring["calls"] == 2 and len(json.loads((tmp_path / "dtype_auto.json").read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", json.dumps({"x": 1})])
def test_an_unreadable_cache_is_measured_again_never_an_error(measuring, tmp_path, content):
    (tmp_path / "dtype_auto.json").write_text(content)
    key = dtype_auto.machine_key(frozenset({"fpu", "avx512f", "avx512_bf16"}))
    if content.startswith("{\""):
        (tmp_path / "dtype_auto.json").write_text(json.dumps({key: {"decode_ms": 1}}))  # this key, wrong layout
    assert Placement.resolve("cpu", "auto").dtype == "bfloat16"
    assert measuring["calls"] == 1 and key in json.loads((tmp_path / "dtype_auto.json").read_text())


@pytest.mark.parametrize("flags, env", [("fpu sse avx2", None), ("fpu avx512_bf16", "flags")])
def test_no_measurement_without_native_bfloat16_or_in_flags_mode(measuring, monkeypatch, flags, env):
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", flags)
    if env:
        monkeypatch.setenv("RELAYLENS_DTYPE_AUTO", env)
    placement = Placement.resolve("cpu", "auto")
    assert measuring["calls"] == 0 and "measured" not in placement.dtype_reason
    assert placement.dtype == ("float32" if env is None else "bfloat16")


def test_the_real_measurement_times_both_dtypes_through_the_decoding_path():
    state = torch.random.get_rng_state()
    m = dtype_auto.measure("k", shape=(64, 96), rows=2, prefill_rows=32, repeats=2, layers=2)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is left alone
    for table in (m.decode_ms, m.prefill_gflops):
        assert set(table) == {"float32", "bfloat16"}
        assert all(math.isfinite(v) and v > 0 for v in table.values())
    assert m.packed == packing_available() and (m.shape, m.rows, m.prefill_rows) == ((64, 96), 2, 32)
