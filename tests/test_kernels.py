"""The fused CPU relocation kernel against the eager path (itself checked against transformers in test_geometry)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from relaylens import kernels
from relaylens.errors import NonFiniteError
from relaylens.geometry import RotaryFactors, relocate_keys
from relaylens.testing import NOPE_VARIANTS, ROPE_VARIANTS, tiny_model


def _case(factors, slots=300, heads=3, seed=0, max_position=20000):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, slots, factors.head_dim, generator=generator) * 3  # [kv_head, n, head_dim]
    source = torch.randint(0, max_position, (heads, slots), generator=generator).sort(-1).values
    target = torch.randint(0, max_position, (heads, slots), generator=generator)
    target[:, ::7] = source[:, ::7]  # some slots stay put: copied bit for bit
    return keys, source, target


@pytest.mark.parametrize("variant", ROPE_VARIANTS + NOPE_VARIANTS)
def test_fused_equals_eager_on_every_layer(variant):
    factors = RotaryFactors.from_model(tiny_model(variant))
    keys, source, target = _case(factors)
    assert kernels.usable(keys, factors.rotary_dim)
    for layer in range(factors.num_layers) if factors.per_layer else [None]:
        fused = relocate_keys(keys, source, target, factors, layer)
        with kernels.disabled():
            eager = relocate_keys(keys, source, target, factors, layer)
        bound = 4 * torch.finfo(torch.float32).eps * float(keys.abs().max())  # float32 rounding, operation order aside
        assert float((fused - eager).abs().max()) <= bound, f"{variant} layer {layer}"
        stay = source == target  # [kv_head, n]
        assert torch.equal(fused[stay], keys[stay]), f"{variant} layer {layer}: a key that stays put changed"
        assert torch.equal(fused[..., factors.rotary_dim:], keys[..., factors.rotary_dim:]), "pass-through changed"
        moved = ~stay
        if layer is None or layer not in factors.nope_layers:
            assert not torch.allclose(fused[moved], keys[moved], atol=1e-3), f"{variant} layer {layer}: nothing moved"


def test_threaded_split_equals_one_thread(monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 1000)  # 12,000 slots: up to torch.get_num_threads() threads
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 700)  # 18 chunks claimed in turn, the last one short
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        split = relocate_keys(keys, source, target, factors)
        torch.set_num_threads(1)
        single = relocate_keys(keys, source, target, factors)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, single)


def test_a_helper_that_never_starts_is_not_waited_for(monkeypatch):
    """The helper threads' pool is kept busy (as when their core is taken): the call finishes on its own thread,
    with the same result, instead of waiting for a helper that has not started."""
    import threading

    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 1000)
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 700)
    threads, release = torch.get_num_threads(), threading.Event()
    try:
        torch.set_num_threads(2)
        busy = kernels._pool(1).submit(release.wait, 60)  # the one helper thread is blocked until released
        split = relocate_keys(keys, source, target, factors)  # returns without the helper
        assert not busy.done(), "the helper stayed blocked throughout"
        release.set()
        torch.set_num_threads(1)
        single = relocate_keys(keys, source, target, factors)
    finally:
        release.set()
        torch.set_num_threads(threads)
    assert torch.equal(split, single)


def test_a_failing_chunk_is_raised_whichever_thread_ran_it(monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 1000)
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 700)
    calls = []

    def failing(*arrays):  # the third chunk fails, on whichever thread claims it
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("chunk failed")
        return 0.0

    monkeypatch.setattr(kernels, "_KERNEL", lambda split_half, planes: failing)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with pytest.raises(RuntimeError, match="chunk failed"):
            relocate_keys(keys, source, target, factors)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("where", [0, 2999, 1500])
def test_fused_refuses_nan_input_naming_the_slot(where, threads, monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=1000)
    keys.view(-1, factors.head_dim)[where, 5] = float("nan")
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 500)  # 3,000 slots: several threads claim chunks of 256
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with pytest.raises(NonFiniteError, match=f"first at flattened slot {where}\\b"):
            relocate_keys(keys, source, target, factors)
    finally:
        torch.set_num_threads(before)


def test_fused_refuses_float32_overflow():
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=50)
    keys[1, 20] = 3.0e38  # finite, but rotating a plane of two such features by ~45 degrees exceeds float32's range
    with pytest.raises(NonFiniteError, match="overflow torch.float32"):
        relocate_keys(keys, source, target, factors)


def test_paths_that_keep_eager_arithmetic():
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, _, _ = _case(factors)
    assert not kernels.usable(keys.bfloat16(), factors.rotary_dim)
    assert not kernels.usable(keys.double(), factors.rotary_dim)
    assert not kernels.usable(keys.clone().requires_grad_(), factors.rotary_dim)
    with kernels.disabled():
        assert not kernels.usable(keys, factors.rotary_dim)
    assert kernels.usable(keys, factors.rotary_dim)


def test_environment_variable_turns_the_kernel_off():
    code = "from relaylens import kernels; print(kernels.fused_available())"
    env = {**os.environ, "RELAYLENS_NO_FUSED": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

