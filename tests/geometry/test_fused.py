"""The fused CPU relocation kernel against the eager path (itself checked against transformers in test_rotary.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types

import pytest
import torch

from relaylens.errors import NonFiniteError
from relaylens.geometry import fused as kernels
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
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


BACKENDS = ["openmp", "python"]


def _use(backend: str, monkeypatch) -> None:
    """Run large relocations on ``backend``: PyTorch's OpenMP team (found on Linux wheels) or the Python pool."""
    monkeypatch.setenv("RELAYLENS_NO_OPENMP", "1" if backend == "python" else "0")
    assert kernels.parallel_backend() == backend


@contextlib.contextmanager
def _torch_threads(threads: int):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _small_work_units(factors, monkeypatch) -> None:
    """3,000 slots run on several threads: the Python pool's chunks of 256 rows, the team's blocks of 100 rows."""
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 500)
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 256)
    monkeypatch.setattr(kernels, "BLOCK_FEATURES", 100 * factors.head_dim)


@pytest.mark.parametrize("variant", ROPE_VARIANTS + NOPE_VARIANTS)
def test_bfloat16_kernel_is_the_float32_kernel_rounded_once(variant):
    """bfloat16 keys: relocated in float32 and rounded back to nearest even, in one pass -- bit for bit the float32
    kernel on the widened keys followed by torch's cast; within one bfloat16 step of the eager path."""
    factors = RotaryFactors.from_model(tiny_model(variant))
    keys, source, target = _case(factors, max_position=120000)
    keys = (keys * 20).bfloat16()
    for layer in range(factors.num_layers) if factors.per_layer else [None]:
        fused = relocate_keys(keys, source, target, factors, layer)
        assert fused.dtype == torch.bfloat16
        widened = relocate_keys(keys.float(), source, target, factors, layer).bfloat16()
        assert torch.equal(fused.view(torch.int16), widened.view(torch.int16)), f"{variant} layer {layer}"
        with kernels.disabled():
            eager = relocate_keys(keys, source, target, factors, layer)
        step = 2.0 ** (torch.floor(torch.log2(eager.float().abs().clamp_min(1e-30)))) * torch.finfo(torch.bfloat16).eps
        assert bool(((fused.float() - eager.float()).abs() <= step).all()), f"{variant} layer {layer}: > 1 step"
        stay = source == target
        assert torch.equal(fused[stay].view(torch.int16), keys[stay].view(torch.int16))
        assert torch.equal(fused[..., factors.rotary_dim:], keys[..., factors.rotary_dim:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_threaded_split_equals_one_thread(backend, monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("qwen2"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    keys = keys.bfloat16()
    _small_work_units(factors, monkeypatch)
    _use(backend, monkeypatch)
    with _torch_threads(3):
        split = relocate_keys(keys, source, target, factors)
    with _torch_threads(1):
        single = relocate_keys(keys, source, target, factors)
    assert torch.equal(split.view(torch.int16), single.view(torch.int16))


@pytest.mark.parametrize(("threads", "backend"), [(1, "python"), (3, "openmp")])
def test_bfloat16_kernel_refuses_nan_and_overflow(threads, backend, monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=1000)
    keys = keys.bfloat16()
    keys.view(-1, factors.head_dim)[1234, 3] = float("nan")
    _small_work_units(factors, monkeypatch)
    _use(backend, monkeypatch)
    with _torch_threads(threads), pytest.raises(NonFiniteError, match=r"first at flattened slot 1234\b"):
        relocate_keys(keys, source, target, factors)
    keys, source, target = _case(factors, slots=1000)
    keys = keys.bfloat16()
    keys[1, 20] = 3.0e38  # finite in bfloat16; the rotated plane is not
    with _torch_threads(threads), pytest.raises(NonFiniteError, match="overflow torch.bfloat16"):
        relocate_keys(keys, source, target, factors)


def test_linux_wheels_relocate_on_pytorchs_own_openmp_team():
    if sys.platform != "linux":  # elsewhere the Python pool runs (tested below on every platform)
        assert kernels.parallel_backend() in ("openmp", "python")
        return
    assert kernels.parallel_backend() == "openmp", "PyTorch's Linux wheels ship GNU OpenMP: the team must be found"
    library = kernels._openmp()
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    assert os.path.realpath(library._name).startswith((torch_dir + os.sep, torch_dir + ".libs" + os.sep))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_does_not_use_the_parents_openmp_team():
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report its backend, touch nothing else
        os.write(write, kernels.parallel_backend().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "python", "a forked child must not use GNU OpenMP's team (it does not survive a fork)"
    assert kernels.parallel_backend() in ("openmp", "python") and not kernels._FORKED


@pytest.mark.parametrize("backend", BACKENDS)
def test_threaded_split_equals_one_thread(backend, monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 1000)  # 12,000 slots: up to torch.get_num_threads() threads
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 700)  # the Python pool: 18 chunks claimed in turn, the last one short
    monkeypatch.setattr(kernels, "BLOCK_FEATURES", 37 * factors.head_dim)  # the team: 325 blocks of 37 rows
    _use(backend, monkeypatch)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        split = relocate_keys(keys, source, target, factors)
        torch.set_num_threads(1)
        single = relocate_keys(keys, source, target, factors)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, single)
    with kernels.disabled():
        eager = relocate_keys(keys, source, target, factors)
    assert float((split - eager).abs().max()) <= 4 * torch.finfo(torch.float32).eps * float(keys.abs().max())


def test_a_helper_that_never_starts_is_not_waited_for(monkeypatch):
    """The helper threads' pool is kept busy (as when their core is taken): the call finishes on its own thread,
    with the same result, instead of waiting for a helper that has not started."""
    import threading

    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=3000, heads=4)
    monkeypatch.setattr(kernels, "PARALLEL_SLOTS", 1000)
    monkeypatch.setattr(kernels, "CHUNK_SLOTS", 700)
    _use("python", monkeypatch)
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

    monkeypatch.setattr(kernels, "_KERNEL_FACTORY", lambda split_half, planes,
                        bfloat16=False: types.SimpleNamespace(rows=failing))
    _use("python", monkeypatch)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with pytest.raises(RuntimeError, match="chunk failed"):
            relocate_keys(keys, source, target, factors)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("threads", "backend"), [(1, "python"), (3, "python"), (3, "openmp")])
@pytest.mark.parametrize("bad", [-1, 4096, 2**40, -(2**62)])
def test_the_kernel_checks_every_position_against_its_tables(bad, threads, backend, monkeypatch):
    """Positions outside the tables ``[0, P)`` are reported and their rows left unwritten (never read out of bounds);
    every other row is relocated as usual."""
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=1000, max_position=4000)
    tables = factors.paired_phase_tables(4000)
    tables = tuple(t[:4096] for t in tables)  # P = 4096 rows
    flat_keys, flat_src, flat_dst = keys.reshape(-1, factors.head_dim), source.reshape(-1), target.reshape(-1)
    _small_work_units(factors, monkeypatch)
    _use(backend, monkeypatch)
    with _torch_threads(threads):
        good, finite, inside = kernels.relocate_key_rows(flat_keys, flat_src, flat_dst, tables, factors.rotary_dim,
                                                         True)
        assert finite and inside
        for positions in (flat_src, flat_dst):
            moved = positions.clone()
            moved[[5, 2000]] = bad
            args = (moved, flat_dst) if positions is flat_src else (flat_src, moved)
            out, finite, inside = kernels.relocate_key_rows(flat_keys, *args, tables, factors.rotary_dim, True)
            assert not inside
            rest = torch.ones(flat_keys.shape[0], dtype=torch.bool)
            rest[[5, 2000]] = False
            assert torch.equal(out[rest], good[rest])


@pytest.mark.parametrize(("threads", "backend"), [(1, "python"), (3, "python"), (3, "openmp")])
@pytest.mark.parametrize("where", [0, 2999, 1500])
def test_fused_refuses_nan_input_naming_the_slot(where, threads, backend, monkeypatch):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=1000)
    keys.view(-1, factors.head_dim)[where, 5] = float("nan")
    _small_work_units(factors, monkeypatch)
    _use(backend, monkeypatch)
    with _torch_threads(threads), pytest.raises(NonFiniteError, match=f"first at flattened slot {where}\\b"):
        relocate_keys(keys, source, target, factors)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_narrower_integer_positions_give_the_same_keys(dtype):
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, max_position=4000)
    expected = relocate_keys(keys, source, target, factors)
    assert torch.equal(relocate_keys(keys, source.to(dtype), target.to(dtype), factors), expected)


def test_fused_refuses_float32_overflow():
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, source, target = _case(factors, slots=50)
    keys[1, 20] = 3.0e38  # finite, but rotating a plane of two such features by ~45 degrees exceeds float32's range
    with pytest.raises(NonFiniteError, match="overflow torch.float32"):
        relocate_keys(keys, source, target, factors)


def test_paths_that_keep_eager_arithmetic():
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys, _, _ = _case(factors)
    assert kernels.usable(keys.bfloat16(), factors.rotary_dim)  # bfloat16 has its own kernel (below)
    assert not kernels.usable(keys.half(), factors.rotary_dim)
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

