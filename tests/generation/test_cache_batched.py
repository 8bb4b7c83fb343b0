"""Issue 51 item 1: relocation on the cache's device without per-layer host round trips.

The batched path (``generation.cache._relocate_batched``) must equal the per-layer loop exactly, and the host
synchronisations of one ``relocate_selection`` must not grow with the number of layers or kv heads (counted with
``torch.profiler``: ``aten::item``, ``aten::is_nonzero``, ``aten::_local_scalar_dense``, and ``aten::_to_copy``, the
operator every device-host transfer goes through). Before issue 51: 36 / 102 synchronisations at 2 / 8 layers.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from relaylens.errors import NonFiniteError
from relaylens.generation import cache as cache_module
from relaylens.generation.cache import coordinates_of, relocate_selection
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import prefill_history
from relaylens.testing import tiny_model

SYNC_EVENTS = ("aten::item", "aten::is_nonzero", "aten::_local_scalar_dense")
COPY_EVENTS = ("aten::_to_copy",)  # every host <-> device transfer (.to / .cpu / .cuda); not device-local copies


def _setup(variant="llama", layers=2, heads=2, length=48, keep=12, uneven=True, dtype=torch.float32):
    overrides = {} if variant in ("gemma3",) or variant.endswith("_nope") else dict(
        num_hidden_layers=layers, num_key_value_heads=heads, num_attention_heads=heads)
    model = tiny_model(variant, dtype=dtype, **overrides)
    history = torch.arange(3, 3 + length)
    prefill = prefill_history(model, history, capture_window_queries=False)
    generator = torch.Generator().manual_seed(1)
    lists = [[sorted(torch.randperm(length, generator=generator)[:keep - ((h + layer) % 3 if uneven else 0)].tolist())
              for h in range(prefill.num_kv_heads)] for layer in range(prefill.num_layers)]
    return prefill, Selection.from_lists(lists, length), RotaryFactors.from_model(model)


def _loop(prefill, selection, condition, factors):
    coords = coordinates_of(condition, selection)
    return cache_module._relocate_each_layer(prefill, selection, coords, factors, "condition", grad=False)


CONDITIONS = ["original", "relay", "half_gap", "relay@layers=0", "common_shift(7)", "reverse_order"]


@pytest.mark.parametrize("variant", ["llama", "qwen2_yarn", "phi_partial", "cohere_interleaved", "gemma3",
                                     "smollm3_nope"])
@pytest.mark.parametrize("condition", CONDITIONS)
def test_batched_equals_the_per_layer_loop(variant, condition):
    prefill, selection, factors = _setup(variant)
    batched = relocate_selection(prefill, selection, condition, factors)
    loop = _loop(prefill, selection, condition, factors)
    assert batched.widths == loop.widths
    for (bk, bv), (lk, lv) in zip(batched.data, loop.data):
        assert bk.shape == lk.shape and bv.shape == lv.shape
        torch.testing.assert_close(bk, lk, atol=2e-6, rtol=0)  # the fused CPU kernel and eager differ by rounding
        assert torch.equal(bv, lv)
    for field in ("valid", "key_positions", "source_positions"):
        for layer in range(prefill.num_layers):
            assert torch.equal(getattr(batched.state, field)[layer], getattr(loop.state, field)[layer]), field


def test_batched_equals_the_loop_in_bfloat16_and_when_the_fused_kernel_is_off(monkeypatch):
    prefill, selection, factors = _setup(dtype=torch.bfloat16)
    monkeypatch.setenv("RELAYLENS_NO_FUSED", "1")  # the eager path the GPU takes
    batched = relocate_selection(prefill, selection, "relay", factors)
    loop = _loop(prefill, selection, "relay", factors)
    for (bk, _), (lk, _) in zip(batched.data, loop.data):
        assert torch.equal(bk, lk)  # the same operations in the same order: bit for bit


def test_non_finite_keys_still_name_the_layer():
    prefill, selection, factors = _setup(layers=3)
    prefill.keys[2][0, selection.positions[2, 0, 0]] = float("nan")
    with pytest.raises(NonFiniteError, match="layer 2"):
        relocate_selection(prefill, selection, "relay", factors)


def _counts(layers: int, heads: int, condition: str) -> tuple[int, int]:
    prefill, selection, factors = _setup(layers=layers, heads=heads, length=64, keep=16)
    relocate_selection(prefill, selection, condition, factors)  # warm the phase tables
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        relocate_selection(prefill, selection, condition, factors)
    names = [event.name for event in prof.events()]
    return sum(names.count(n) for n in SYNC_EVENTS), sum(names.count(n) for n in COPY_EVENTS)


@pytest.mark.parametrize("condition", ["relay", "original"])
def test_host_synchronisations_do_not_grow_with_layers_or_heads(condition):
    small = _counts(2, 2, condition)
    for layers, heads in ((8, 2), (2, 8), (8, 8)):
        syncs, copies = _counts(layers, heads, condition)
        assert syncs <= small[0], (f"{condition}: {syncs} host synchronisations at {layers} layers x {heads} heads, "
                                   f"{small[0]} at 2 x 2: they grow with the model")
        assert copies <= small[1], f"{condition}: {copies} copies at {layers} x {heads}, {small[1]} at 2 x 2"
