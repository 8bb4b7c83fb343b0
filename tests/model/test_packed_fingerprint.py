"""Issue 52, item 7: packed decoding weights follow edits made through ``param.data`` (which move neither
``data_ptr`` nor ``_version``): the content fingerprint sees them, the next decode repacks, and its tokens equal an
unpacked decode's."""

from __future__ import annotations

import pytest
import torch
from support.prefill_shared import plain_prefill

import relaylens.model.packed as packed
from relaylens.generation.single import run_condition
from relaylens.geometry.selection import Selection
from relaylens.model.packed import forget_packs, pack_linears, packing_available
from relaylens.testing import tiny_model

# (weights' dtype, decoding dtype): float32 copies of a bfloat16 model run everywhere; oneDNN packs need its CPU path
PATHS = [pytest.param(torch.bfloat16, torch.float32, id="float32-copies"),
         pytest.param(torch.bfloat16, None, id="onednn", marks=pytest.mark.skipif(
             not packing_available(), reason="this CPU runs no oneDNN bfloat16 prepacked linear"))]


def _model(dtype, decoding, seed=0):
    model = tiny_model("qwen2", seed=seed, dtype=dtype)  # q/k/v biases: bias edits are covered too
    packed.set_decoding_dtype(model, decoding)
    return model


def _decode(model, steps=8):
    gen = torch.Generator().manual_seed(2)
    history = torch.randint(3, model.config.vocab_size, (40,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (3,), generator=gen)
    pre = plain_prefill(model, history)
    heads = pre.keys[0].shape[0]
    selection = Selection.from_lists([[[0, 3, 11, 25, 37, 38, 39]] * heads] * pre.num_layers, 40)
    return run_condition(model, pre, selection, "relay", question, max_new_tokens=steps, eos_token_ids=set()).token_ids


@pytest.mark.parametrize(("dtype", "decoding"), PATHS)
def test_weights_copied_in_through_data_are_the_ones_decoding_uses(dtype, decoding, monkeypatch):
    model, other = _model(dtype, decoding), _model(dtype, decoding, seed=7)
    before = _decode(model)  # packs built from the first weights
    packs = pack_linears(model)
    assert packs
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), other.parameters(), strict=True):
            mine.data.copy_(theirs.data)  # in place, behind autograd's back: data_ptr and _version stay
    assert pack_linears(model) is not packs
    packed_tokens = _decode(model)
    monkeypatch.setattr(packed, "PACKED_DECODING", False)
    plain = _decode(model)
    assert packed_tokens == plain != before  # the new weights decode, in every step (not only the first token)
    monkeypatch.setattr(packed, "PACKED_DECODING", True)
    assert _decode(other) == packed_tokens  # the same as the model the weights came from


def _edits(model):
    """``(name, in-place edit through .data)``: one row, one column, one bias entry, a whole weight scaled."""
    q = model.model.layers[0].self_attn.q_proj
    down = model.model.layers[-1].mlp.down_proj
    return [("one row of q_proj", lambda: q.weight.data[5].zero_()),
            ("one column of down_proj", lambda: down.weight.data[:, 17].mul_(-1)),
            ("one bias entry of q_proj", lambda: q.bias.data[3].add_(1.0)),
            ("lm_head scaled", lambda: model.lm_head.weight.data.mul_(0.5))]


@pytest.mark.parametrize(("dtype", "decoding"), PATHS)
@pytest.mark.parametrize("edit", range(4))
def test_row_column_and_bias_edits_through_data_are_seen(dtype, decoding, edit):
    model = _model(dtype, decoding)
    packs = pack_linears(model)
    assert pack_linears(model) is packs  # unchanged content: reused
    name, apply = _edits(model)[edit]
    versions = [p._version for p in model.parameters()]
    with torch.no_grad():
        apply()
    assert [p._version for p in model.parameters()] == versions, "the edit must be invisible to _version"
    repacked = pack_linears(model)
    assert repacked is not packs, name
    if not repacked[0].onednn:  # plain copies: each equals its live weight (and bias) again
        assert all(torch.equal(p.weight, p.module.weight.detach().to(p.weight.dtype)) for p in repacked)
        assert all(p.bias is None or torch.equal(p.bias, p.module.bias.detach().to(p.bias.dtype)) for p in repacked)
    assert pack_linears(model) is repacked  # and reused again from then on


def test_forget_packs_rebuilds_and_sample_covers_every_row_and_column():
    model = _model(torch.bfloat16, torch.float32)
    packs = pack_linears(model)
    forget_packs(model)
    assert pack_linears(model) is not packs
    for shape in [(3, 5), (5, 3), (64, 64), (128, 64), (384, 64), (7, 9000)]:
        offsets = packed._sample_index(torch.zeros(shape))
        assert set((offsets // shape[1]).tolist()) == set(range(shape[0]))
        assert set((offsets % shape[1]).tolist()) == set(range(shape[1]))
        assert int(offsets.max()) < shape[0] * shape[1]
    wide = torch.arange(7 * 9000, dtype=torch.float32).reshape(7, 9000).t()  # non-contiguous: indexed by row, col
    offsets = packed._sample_index(wide)
    assert torch.equal(packed._sampled(wide, offsets), wide.contiguous().reshape(-1)[offsets])
