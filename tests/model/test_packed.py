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


@pytest.mark.parametrize("variant", ["llama", "qwen2", "gemma3"])
def test_a_bfloat16_model_decodes_its_linear_layers_in_float32_copies(variant):
    """Per-phase --dtype auto: the weights stay bfloat16 (prefill), each linear layer of a decoding step computes
    with a float32 copy: exactly F.linear on float32 operands, rounded once to bfloat16 at its output."""
    model = tiny_model(variant, dtype=torch.bfloat16)
    packed.set_decoding_dtype(model, torch.float32)
    packs = pack_linears(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(packs) == len(linears) and all(p.weight.dtype == torch.float32 and not p.onednn for p in packs)
    assert all(m.weight.dtype == torch.bfloat16 for m in linears)  # the model's own weights untouched
    x = torch.randn(3, linears[0].in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits.float()
        with packed_linears(packs):
            for m in linears:
                xm = x[:, :1].expand(3, m.in_features).contiguous() if m.in_features != x.shape[1] else x
                bias = None if m.bias is None else m.bias.float()
                expected = torch.nn.functional.linear(xm.float(), m.weight.float(), bias).to(torch.bfloat16)
                assert torch.equal(m(xm), expected), f"{variant}: a float32 copy must compute F.linear in float32"
            inside = model(ids).logits.float()
    torch.testing.assert_close(inside, plain, atol=0.05, rtol=0.02)  # the same model, rounded at fewer places
    packed.set_decoding_dtype(model, None)  # back to the weights' own dtype: oneDNN packs where there are any
    again = pack_linears(model)
    assert again is not packs
    assert (len(again) == len(linears) and all(p.onednn for p in again)) if packing_available() else again == []


@needs_onednn
def test_a_float32_model_decodes_in_prepacked_bfloat16_copies():
    model = tiny_model("llama")
    assert pack_linears(model) == []
    packed.set_decoding_dtype(model, torch.bfloat16)
    packs = pack_linears(model)
    assert packs and all(p.onednn for p in packs)
    down = packs[-1].module
    x = torch.randn(2, down.in_features, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), packed_linears(packs):
        out = down(x)
    assert out.dtype == torch.float32  # the model's dtype at the output
    reference = torch.nn.functional.linear(x.to(torch.bfloat16), down.weight.to(torch.bfloat16)).float()
    torch.testing.assert_close(out, reference, atol=0.05, rtol=0.02)


def test_decoding_linears_say_what_ran_and_a_bad_decoding_dtype_is_refused(monkeypatch):
    model = tiny_model("llama", dtype=torch.bfloat16)
    packed.set_decoding_dtype(model, torch.float32)
    what, why = packed.decoding_linears(model)
    assert what == "float32 copies of the bfloat16 linear layers (F.linear)"
    assert why.startswith("decoding in float32 (per-phase --dtype auto")
    monkeypatch.setattr(packed, "PACKED_DECODING", False)  # the before arm of bench regime: plain F.linear
    assert packed.decoding_linears(model)[0] == "F.linear" and pack_linears(model) == []
    with pytest.raises(ValueError, match="expected torch.float32 or torch.bfloat16"):
        packed.set_decoding_dtype(model, torch.float16)
    same = tiny_model("llama")
    packed.set_decoding_dtype(same, torch.float32)  # the weights' own dtype: nothing to copy
    assert pack_linears(same) == [] and packed.decoding_linears(same)[0] == "F.linear"


def test_greedy_decoding_runs_with_float32_decoding_copies_and_stays_close():
    model = tiny_model("qwen2", seed=3, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    history = torch.randint(3, model.config.vocab_size, (40,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (3,), generator=gen)
    pre = plain_prefill(model, history)
    heads = pre.keys[0].shape[0]
    selection = Selection.from_lists([[[0, 3, 11, 25, 37, 38, 39]] * heads] * pre.num_layers, 40)
    out = {}
    for decode in (None, torch.float32):
        packed.set_decoding_dtype(model, decode)
        out[decode] = run_condition(model, pre, selection, "relay", question, max_new_tokens=6, eos_token_ids=set())
    assert len(out[torch.float32].token_ids) == 6
    assert out[torch.float32].token_ids[0] == out[None].token_ids[0]  # the first token comes from the question pass
