"""History prefill on tiny random models (every rope variant) and on the embedded SmolLM2 (``-m model``)."""

from __future__ import annotations

import pytest
import torch
from support.prefill_shared import eager_rows, rows_from_queries  # noqa: F401 - shared with the model tier

from relaylens.errors import PositionError, RelaylensError, RopeError, ShapeError
from relaylens.model import hf
from relaylens.model.hf import decoder_layers
from relaylens.model.prefill import prefill_history
from relaylens.testing import ROPE_VARIANTS, tiny_model

L, W = 40, 8


def _ids(n: int = L, seed: int = 0, vocab: int = 384) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))  # [n]


def _plain_forward_cache(model, ids):
    """Keys/values per layer ``[kv_head, n, head_dim]`` from an ordinary ``model(ids, use_cache=True)``."""
    with torch.inference_mode():
        out = model(ids[None], use_cache=True)
    cache = out.past_key_values
    return [layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers]


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
def test_cache_equals_plain_forward(variant):
    model, ids = tiny_model(variant), _ids()
    res = prefill_history(model, ids, window_size=W)
    ref_k, ref_v = _plain_forward_cache(model, ids)
    assert res.num_layers == model.config.num_hidden_layers
    for got_k, got_v, k, v in zip(res.keys, res.values, ref_k, ref_v):
        assert got_k.shape == (model.config.num_key_value_heads, L, got_k.shape[-1])
        n = k.shape[1]  # Gemma-3's own cache keeps only the window in sliding layers: compare what it kept
        torch.testing.assert_close(got_k[:, -n:], k, rtol=0, atol=1e-5)
        torch.testing.assert_close(got_v[:, -n:], v, rtol=0, atol=1e-5)
    attn = decoder_layers(model)[0].self_attn
    assert res.scaling == attn.scaling and res.num_key_value_groups == attn.num_key_value_groups
    assert torch.equal(res.history_ids, ids) and res.window_size == W


def test_gemma3_keeps_sliding_layer_history():
    model = tiny_model("gemma3")
    assert model.config.sliding_window < L
    res = prefill_history(model, _ids(), window_size=W)
    assert all(k.shape[1] == L for k in res.keys)  # the default Gemma-3 cache would keep only the window


@pytest.mark.parametrize("variant", ["llama", "qwen2_yarn", "gemma3", "phi_partial"])
@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_chunked_equals_unchunked(variant, chunk):
    model, ids = tiny_model(variant), _ids()
    full = prefill_history(model, ids, window_size=W)
    part = prefill_history(model, ids, window_size=W, chunk_size=chunk)  # w=8 straddles chunk borders for 7 and 1
    for a, b in zip(full.keys + full.values + full.window_queries, part.keys + part.values + part.window_queries):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


EXTRA_ATTENTION_CASES = [  # query norms and a non-default attention scaling
    ("cohere_interleaved", {"use_qk_norm": True}),
    ("phi_partial", {"qk_layernorm": True}),
    ("gemma3", {"query_pre_attn_scalar": 64}),
]


@pytest.mark.parametrize("variant, overrides", [(v, {}) for v in ROPE_VARIANTS] + EXTRA_ATTENTION_CASES)
def test_window_queries_reproduce_eager_attention_rows(variant, overrides):
    model, ids = tiny_model(variant, **overrides), _ids()
    res = prefill_history(model, ids, window_size=W, chunk_size=13)
    real = eager_rows(model, ids)
    for layer, block in enumerate(decoder_layers(model)):
        rows = rows_from_queries(res, layer, getattr(block.self_attn, "sliding_window", None))  # [q_head, w, L]
        torch.testing.assert_close(rows, real[layer][:, L - W:], rtol=0, atol=1e-5)


def test_row_check_detects_queries_one_position_off():
    """The row comparison is sensitive: queries of the wrong positions miss by far more than the tolerance."""
    model, ids = tiny_model("llama"), _ids()
    res = prefill_history(model, ids, window_size=W)
    shifted = prefill_history(model, ids[:-1], window_size=W)  # queries of positions L-W-1 .. L-2
    res.window_queries = shifted.window_queries
    real = eager_rows(model, ids)
    assert (rows_from_queries(res, 1, None) - real[1][:, L - W:]).abs().max() > 1e-3  # tolerance is 1e-5


def test_never_materialises_full_logits_and_restores_kernel():
    model = tiny_model("llama", attn_implementation="eager")
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    try:
        prefill_history(model, _ids(), window_size=W, chunk_size=16)
    finally:
        handle.remove()
    assert seen == [(1, 1, model.config.vocab_size)] * 3  # logits_to_keep=1 in each of the 3 chunks
    assert model.config._attn_implementation == "eager"


def test_hooks_are_removed_after_success_and_error():
    model = tiny_model("llama")
    attns = [layer.self_attn for layer in decoder_layers(model)]
    prefill_history(model, _ids(), window_size=W)
    assert all(not a._forward_pre_hooks for a in attns)

    def boom(module, args, output):
        raise RuntimeError("boom")

    handle = decoder_layers(model)[1].mlp.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            prefill_history(model, _ids(), window_size=W)
    finally:
        handle.remove()
    assert all(not a._forward_pre_hooks for a in attns)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models(dtype):
    model, ids = tiny_model("qwen2_yarn", dtype=dtype), _ids()
    res = prefill_history(model, ids, window_size=W, chunk_size=16)
    assert res.keys[0].dtype == dtype and res.window_queries[0].dtype == dtype
    ref_k, _ = _plain_forward_cache(model, ids)
    torch.testing.assert_close(res.keys[1], ref_k[1])  # dtype-aware default tolerances


def test_outputs_are_ordinary_tensors():
    res = prefill_history(tiny_model("llama"), _ids(), window_size=W)
    assert not res.keys[0].is_inference() and not res.window_queries[0].is_inference()
    res.keys[0][:, 0] = 0  # in-place edits outside inference mode work


def test_without_window_queries():
    res = prefill_history(tiny_model("llama"), _ids(5), window_size=W, capture_window_queries=False)
    assert res.window_queries is None and res.window_size == 0 and res.keys[0].shape[1] == 5


def test_accepts_batch_of_one():
    model, ids = tiny_model("llama"), _ids()
    a, b = prefill_history(model, ids, window_size=W), prefill_history(model, ids[None], window_size=W)
    torch.testing.assert_close(a.keys[0], b.keys[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "ids, kw, err, match",
    [
        (torch.zeros(0, dtype=torch.long), {}, ShapeError, "empty"),
        (_ids(5), {"window_size": 8}, ShapeError, "shorter than window_size=8"),
        (_ids(5), {"window_size": 0}, ShapeError, "window_size must be >= 1"),
        (_ids(12).reshape(3, 4), {}, ShapeError, r"\[L\] or \[1, L\]"),
        (_ids(12).float(), {}, ShapeError, "integer token ids"),
        (_ids(12), {"window_size": 4, "chunk_size": 0}, ShapeError, "chunk_size"),
    ],
)
def test_input_errors(ids, kw, err, match):
    with pytest.raises(err, match=match):
        prefill_history(tiny_model("llama"), ids, **kw)


def test_too_long_history_needs_allow_long():
    model = tiny_model("llama", max_position_embeddings=16)
    with pytest.raises(PositionError, match="max_position_embeddings=16.*allow_long=True"):
        prefill_history(model, _ids(20), window_size=4)
    assert prefill_history(model, _ids(20), window_size=4, allow_long=True).keys[0].shape[1] == 20


def test_unsupported_attention_class_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(hf.QUERY_RECIPES, "LlamaAttention")
    with pytest.raises(RopeError, match="LlamaAttention.*capture_window_queries=False"):
        prefill_history(tiny_model("llama"), _ids(), window_size=W)
    assert prefill_history(tiny_model("llama"), _ids(), capture_window_queries=False).window_queries is None


def test_wrong_recipe_is_caught_by_key_check(monkeypatch):
    def no_rotary(attn, hidden, cos, sin):  # forgets the rotation: keys will not match the cache
        q = attn.q_proj(hidden).view(1, hidden.shape[1], -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(hidden).view(1, hidden.shape[1], -1, attn.head_dim).transpose(1, 2)
        return q, k

    monkeypatch.setitem(hf.QUERY_RECIPES, "LlamaAttention", no_rotary)
    with pytest.raises(RopeError, match="differ from the cached keys"):
        prefill_history(tiny_model("llama"), _ids(), window_size=W)


def test_errors_are_value_errors():
    assert issubclass(ShapeError, RelaylensError) and issubclass(ShapeError, ValueError)


# ---------------------------------------------------------------------------------------------------- real model


@pytest.mark.parametrize("variant", ["llama", "gemma3", "cohere_interleaved"])
def test_two_prefills_interleaved_chunk_by_chunk_equal_each_run_alone(variant):
    """PrefillPieces leaves nothing attached between chunks, so two interleaved prefills equal their solo runs."""
    from relaylens.model.prefill import PrefillPieces

    model = tiny_model(variant)
    ids = [_ids(L, seed=1), _ids(L - 3, seed=2)]
    alone = [prefill_history(model, i, window_size=W, chunk_size=12) for i in ids]
    kernel = hf.attention_kernel_name(model)
    pieces = [PrefillPieces(model, i, window_size=W, chunk_size=12) for i in ids]
    steps = [iter(p) for p in pieces]
    counts = [0, 0]
    while any(s is not None for s in steps):
        for n, step in enumerate(steps):
            if step is None:
                continue
            try:
                next(step)
                counts[n] += 1
            except StopIteration:
                steps[n] = None
            attached = sum(len(layer.self_attn._forward_pre_hooks) for layer in decoder_layers(model))
            assert attached == 0 and hf.attention_kernel_name(model) == kernel
    assert counts == [4, 4]  # ceil(40 / 12) and ceil(37 / 12) chunks
    for solo, piece in zip(alone, pieces):
        for a, b in zip(solo.keys + solo.values + solo.window_queries,
                        piece.result.keys + piece.result.values + piece.result.window_queries):
            assert torch.equal(a, b)
