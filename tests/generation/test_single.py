"""Runtime exactness: relocated caches, the synchronised question pass and greedy generation."""

from __future__ import annotations

import sys

import pytest
import torch
from support.prefill_shared import plain_prefill
from transformers import DynamicCache

from relaylens.errors import PositionError, ShapeError
from relaylens.generation.single import build_cache, run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.hf import pre_rotary_keys
from relaylens.testing import tiny_model

VARIANTS = ["llama", "qwen2_yarn", "phi_partial", "glm_partial_interleaved", "gemma3"]
HISTORY, QUESTION = 40, 6


def _tokens(model, n, seed):
    return torch.randint(3, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=VARIANTS)
def setup(request):
    model = tiny_model(request.param, seed=2)
    history, question = _tokens(model, HISTORY, 0), _tokens(model, QUESTION, 1)
    return request.param, model, history, question, plain_prefill(model, history)


def test_keep_all_original_reproduces_full_forward(setup):
    variant, model, history, question, pre = setup
    full = Selection.full(HISTORY, pre.num_layers, pre.num_kv_heads)
    with torch.no_grad():
        reference = model(torch.cat((history, question))[None]).logits[0, HISTORY:].float()  # [Q, vocab]
        result = run_condition(model, pre, full, "original", question, max_new_tokens=0, keep_question_logits=True)
    assert float((result.question_logits - reference).abs().max()) <= 1e-4, variant


def test_keep_all_relay_equals_original(setup):
    _, model, history, question, pre = setup
    full = Selection.full(HISTORY, pre.num_layers, pre.num_kv_heads)
    with torch.no_grad():
        relay = run_condition(model, pre, full, "relay", question, max_new_tokens=4, keep_question_logits=True)
        original = run_condition(model, pre, full, "original", question, max_new_tokens=4, keep_question_logits=True)
    assert float((relay.question_logits - original.question_logits).abs().max()) <= 1e-4
    assert relay.token_ids == original.token_ids


def test_greedy_tokens_match_model_generate():
    model = tiny_model("llama", seed=5)
    history, question = _tokens(model, HISTORY, 3), _tokens(model, QUESTION, 4)
    pre = plain_prefill(model, history)
    full = Selection.full(HISTORY, pre.num_layers, pre.num_kv_heads)
    with torch.no_grad():
        ours = run_condition(model, pre, full, "original", question, max_new_tokens=10, eos_token_ids=set())
        prompt = torch.cat((history, question))[None]
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
    assert ours.token_ids == generated[0, prompt.shape[1]:].tolist()
    assert ours.positions == list(range(HISTORY + QUESTION, HISTORY + QUESTION + 9))


def _random_heterogeneous_selection(pre, seed):
    generator = torch.Generator().manual_seed(seed)
    keep = []
    for layer in range(pre.num_layers):
        keep.append([])
        for head in range(pre.num_kv_heads):
            count = int(torch.randint(5, HISTORY - 5, (1,), generator=generator))
            keep[-1].append(sorted(torch.randperm(HISTORY, generator=generator)[:count].tolist()))
    return Selection.from_lists(keep, HISTORY)


def test_heterogeneous_selection_matches_masked_full_cache_in_eager(setup):
    """Reference: stock eager attention over the full, unrelocated cache with an explicit per-(layer, head) mask."""
    variant, model, history, question, pre = setup
    sel = _random_heterogeneous_selection(pre, seed=9)
    assert not sel.is_uniform
    with torch.no_grad():
        ours = run_condition(model, pre, sel, "original", question, max_new_tokens=0, keep_question_logits=True)
    groups = pre.num_key_value_groups
    masks = {}
    for layer in range(pre.num_layers):
        allowed = torch.zeros(pre.num_kv_heads, HISTORY, dtype=torch.bool)
        for head, kept in enumerate(sel.layer_positions(layer)):
            allowed[head, kept] = True
        hist = allowed.repeat_interleave(groups, 0)[:, None, :].expand(-1, QUESTION, -1)  # [q_head, Q, L]
        causal = torch.ones(QUESTION, QUESTION, dtype=torch.bool).tril()[None].expand(hist.shape[0], -1, -1)
        keep = torch.cat((hist, causal), dim=-1)[None]  # [1, q_head, Q, L + Q]
        window = getattr(model.model.layers[layer].self_attn, "sliding_window", None)
        if window:  # Gemma-3 sliding layers: a query at u sees keys with u - p < window
            query_pos = torch.arange(HISTORY, HISTORY + QUESTION)[:, None]
            key_pos = torch.arange(HISTORY + QUESTION)[None]
            keep = keep & ((query_pos - key_pos) < window)
        masks[layer] = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    full_cache = DynamicCache()
    with torch.no_grad():
        model(history[None], use_cache=True, cache=full_cache)
    handles = []
    for layer, block in enumerate(model.model.layers):
        def swap_mask(module, args, kwargs, layer=layer):
            kwargs["attention_mask"] = masks[layer]
            return args, kwargs
        handles.append(block.self_attn.register_forward_pre_hook(swap_mask, with_kwargs=True))
    previous = model.config._attn_implementation
    try:
        model.set_attn_implementation("eager")
        with torch.no_grad():
            reference = model(question[None], position_ids=torch.arange(HISTORY, HISTORY + QUESTION)[None],
                              cache=full_cache).logits[0]
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    assert float((ours.question_logits - reference.float()).abs().max()) <= 1e-4, variant


@pytest.mark.parametrize(
    ("condition", "first_question_position"),
    [("relay", "M"), ("original", "L"), ("query_only(500)", "L+500"), ("half_gap", "half")],
)
def test_positions_seen_inside_the_model(condition, first_question_position):
    model = tiny_model("llama", seed=3)
    history, question = _tokens(model, HISTORY, 5), _tokens(model, QUESTION, 6)
    pre = plain_prefill(model, history)
    sel = _random_heterogeneous_selection(pre, seed=4)
    M = sel.max_count
    start = {"M": M, "L": HISTORY, "L+500": HISTORY + 500,
             "half": int((HISTORY + M) / 2 + 0.5)}[first_question_position]
    seen = []

    def record(module, args, kwargs):
        if args[0].dim() == 3:  # the model's own call (relaylens's factor tables pass a 1-D dummy)
            position_ids = args[1] if len(args) > 1 else kwargs["position_ids"]
            seen.append(position_ids[0].tolist())

    handle = model.model.rotary_emb.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            result = run_condition(model, pre, sel, condition, question, max_new_tokens=4, eos_token_ids=set())
    finally:
        handle.remove()
    assert seen[0] == list(range(start, start + QUESTION))
    assert [p[0] for p in seen[1:]] == list(range(start + QUESTION, start + QUESTION + 3))
    assert result.positions == list(range(start + QUESTION, start + QUESTION + 3))


@pytest.mark.parametrize("condition", ["relay", "half_gap", "common_shift(300)", "score_order"])
def test_relocated_cache_equals_direct_rotation(setup, condition):
    variant, model, history, question, pre = setup
    sel = _random_heterogeneous_selection(pre, seed=1)
    sel = Selection(sel.positions, sel.valid, sel.history_length, scores=torch.rand(sel.positions.shape))
    factors = RotaryFactors.from_model(model)
    relocated = build_cache(pre, sel, condition, factors)
    pre_keys = pre_rotary_keys(model, history)
    apply = sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb
    types = getattr(model.config, "layer_types", None)
    for layer in range(pre.num_layers):
        valid = relocated.state.valid[layer]
        width = valid.shape[-1]
        for head in range(pre.num_kv_heads):
            kept = sel.positions[layer, head, :width][valid[head]]
            target = relocated.coordinates.key_positions[layer, head, :width][valid[head]]
            content = pre_keys[layer][0, head, kept][None, None]  # [1, 1, n, D]
            args = (torch.zeros(1), target[None]) + ((types[layer],) if factors.per_layer else ())
            cos, sin = model.model.rotary_emb(*args)
            rot = cos.shape[-1]
            if variant == "phi_partial":
                _, rotated = apply(content[..., :rot], content[..., :rot], cos, sin)
                direct = torch.cat((rotated, content[..., rot:]), dim=-1)
            else:
                _, direct = apply(content, content, cos, sin)
            cached = relocated.cache.layers[layer].keys[0, head, : int(valid[head].sum())]
            assert float((cached - direct[0, 0]).abs().max()) <= 1e-5, (variant, condition, layer, head)
            values = relocated.cache.layers[layer].values[0, head, : int(valid[head].sum())]
            assert torch.equal(values, pre.values[layer][head, kept]), "conditions never touch values"


def test_bad_inputs():
    model = tiny_model("llama")
    history, question = _tokens(model, HISTORY, 0), _tokens(model, QUESTION, 1)
    pre = plain_prefill(model, history)
    wrong_layers = Selection.full(HISTORY, pre.num_layers + 1, pre.num_kv_heads)
    with pytest.raises(ShapeError, match="layers"):
        run_condition(model, pre, wrong_layers, "relay", question)
    wrong_length = Selection.full(HISTORY - 1, pre.num_layers, pre.num_kv_heads)
    with pytest.raises(ShapeError, match="history"):
        run_condition(model, pre, wrong_length, "relay", question)
    full = Selection.full(HISTORY, pre.num_layers, pre.num_kv_heads)
    with pytest.raises(PositionError, match="max_position_embeddings"):
        run_condition(model, pre, full, "query_only(200000)", question)
    with pytest.raises(ShapeError, match="no tokens"):
        run_condition(model, pre, full, "relay", torch.zeros(0, dtype=torch.long))
