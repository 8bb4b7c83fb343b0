"""Prepacked bfloat16 linear layers (relaylens.model.packed): used only inside the block, equal to F.linear to
bfloat16 rounding, and greedy decoding unchanged."""

from __future__ import annotations

import pytest
import torch
from support.prefill_shared import plain_prefill

import relaylens.model.packed as packed
from relaylens.generation.single import run_condition
from relaylens.geometry.selection import Selection
from relaylens.model.packed import pack_linears, packed_linears, packing_available
from relaylens.testing import tiny_model

needs_onednn = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("variant", ["llama", "qwen2", "gemma3"])
def test_packed_forward_equals_plain_and_is_restored(variant):
    model = tiny_model(variant, dtype=torch.bfloat16)
    packs = pack_linears(model, rows=3)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(packs) == len(linears) > 0
    ids = torch.randint(3, model.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits.float()
        with packed_linears(packs):
            assert all("forward" in m.__dict__ for m in linears)
            inside = model(ids).logits.float()
    assert all("forward" not in m.__dict__ for m in linears), "the block must leave no instance forward behind"
    torch.testing.assert_close(inside, plain, atol=0.05, rtol=0.02)


def test_no_packs_for_float32_or_when_switched_off(monkeypatch):
    assert pack_linears(tiny_model("llama")) == []  # float32
    monkeypatch.setattr(packed, "PACKED_DECODING", False)
    assert pack_linears(tiny_model("llama", dtype=torch.bfloat16)) == []


@needs_onednn
def test_an_instance_forward_is_restored_and_gradients_are_refused():
    model = tiny_model("llama", dtype=torch.bfloat16)
    hooked = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    own = hooked.forward
    hooked.forward = own  # an instance forward, as accelerate's hooks install
    packs = pack_linears(model)
    with packed_linears(packs):
        with pytest.raises(RuntimeError, match="without gradients"):
            hooked(torch.zeros(1, hooked.in_features, dtype=torch.bfloat16))
    assert hooked.__dict__["forward"] is own


@needs_onednn
@pytest.mark.parametrize("condition", ["original", "relay"])
def test_greedy_decoding_is_unchanged_by_packing(condition, monkeypatch):
    model = tiny_model("qwen2", seed=3, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    history = torch.randint(3, model.config.vocab_size, (40,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (3,), generator=gen)
    pre = plain_prefill(model, history)
    heads = pre.keys[0].shape[0]
    selection = Selection.from_lists([[[0, 3, 11, 25, 37, 38, 39]] * heads] * pre.num_layers, 40)
    tokens = {}
    for on in (True, False):
        monkeypatch.setattr(packed, "PACKED_DECODING", on)
        tokens[on] = run_condition(model, pre, selection, condition, question, max_new_tokens=8,
                                   eos_token_ids=set()).token_ids
    assert tokens[True] == tokens[False]


@needs_onednn
def test_packs_are_reused_until_a_weight_changes():
    """Reordering every weight costs seconds on a real model: one model's packs serve every decode, and a weight
    changed in place (or replaced) gets new packs that compute with the new values."""
    model = tiny_model("llama", dtype=torch.bfloat16)
    packs = pack_linears(model)
    assert pack_linears(model) is packs
    down = packs[-1].module
    with torch.no_grad():
        down.weight.mul_(2)  # in place: the tensor's version moves
    repacked = pack_linears(model)
    assert repacked is not packs
    x = torch.randn(2, down.in_features, dtype=torch.bfloat16)
    with torch.no_grad(), packed_linears(repacked):
        torch.testing.assert_close(down(x).float(), torch.nn.functional.linear(x, down.weight, down.bias).float(),
                                   atol=0.05, rtol=0.02)
    assert pack_linears(tiny_model("llama", dtype=torch.bfloat16)) is not repacked  # another model, its own packs
