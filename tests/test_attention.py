"""The relaylens attention function: sliding windows on the condition's coordinates (Gemma-3), restoration, errors."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from relaylens.attention import AttentionState, attention_context
from relaylens.generation import prefill_from_cache, run_condition
from relaylens.probes import FinalTokenRecorder
from relaylens.selection import Selection
from relaylens.testing import tiny_model

L, Q = 40, 3


def _gemma_rows(condition: str, window_mode: str):
    model = tiny_model("gemma3", seed=4)  # window 8; layers: sliding, sliding, full
    gen = torch.Generator().manual_seed(0)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    with torch.no_grad():
        cache = model(history[None], use_cache=True, cache=DynamicCache()).cache
    pre = prefill_from_cache(history, cache, model)
    kept = [5, 36, 37, 38, 39]  # position 5 is 35+ tokens before the question: outside an 8-token window at L
    selection = Selection.from_lists([[kept]] * pre.num_layers, L)
    recorder = FinalTokenRecorder()
    run_condition(model, pre, selection, condition, question, max_new_tokens=0, observers=[recorder], window_mode=window_mode)
    return recorder, model


def test_relocated_key_enters_the_window_only_under_compaction():
    original, model = _gemma_rows("original", "condition")
    relay, _ = _gemma_rows("relay", "condition")
    sliding = [i for i, t in enumerate(model.config.layer_types) if t == "sliding_attention"]
    full = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    for layer in sliding:
        assert float(original.rows[layer][:, 0].max()) == 0.0, "source position 5 lies outside the window at L"
        assert float(relay.rows[layer][:, 0].min()) > 0.0, "compacted to slot 0 next to the question: inside"
    for layer in full:
        assert float(original.rows[layer][:, 0].min()) > 0.0 and float(relay.rows[layer][:, 0].min()) > 0.0


def test_window_mode_options():
    no_window, model = _gemma_rows("original", "none")
    source_frame, _ = _gemma_rows("relay", "source")
    sliding = [i for i, t in enumerate(model.config.layer_types) if t == "sliding_attention"]
    for layer in sliding:
        assert float(no_window.rows[layer][:, 0].min()) > 0.0, "'none' keeps cached history visible"
        assert float(source_frame.rows[layer][:, 0].max()) == 0.0, "'source' measures the window on source positions"
    with pytest.raises(ValueError, match="window_mode"):
        AttentionState(window_mode="sideways")


def test_context_restores_implementation_and_refuses_use_outside():
    model = tiny_model("llama")
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with attention_context(model, AttentionState(new_positions=torch.arange(2))):
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    model.set_attn_implementation("relaylens")
    try:
        with pytest.raises(RuntimeError, match="attention_context"):
            model(torch.tensor([[3, 4]]))
    finally:
        model.set_attn_implementation(before)


def test_probability_rows_sum_to_one_over_visible_keys():
    model = tiny_model("llama", seed=1)
    history = torch.randint(3, 300, (L,))
    with torch.no_grad():
        cache = model(history[None], use_cache=True, cache=DynamicCache()).cache
    pre = prefill_from_cache(history, cache, model)
    selection = Selection.from_lists([[list(range(0, 40, 3)), list(range(1, 40, 5))]] * pre.num_layers, L)
    recorder = FinalTokenRecorder()
    run_condition(model, pre, selection, "relay", torch.tensor([7, 8, 9]), max_new_tokens=0, observers=[recorder])
    for layer, row in recorder.rows.items():
        assert torch.allclose(row.sum(-1), torch.ones(row.shape[0]), atol=1e-6)
        width = recorder.widths[layer]
        kv_of = torch.arange(row.shape[0]) // pre.num_key_value_groups
        invalid = ~selection.valid[layer, :, :width][kv_of]
        assert float(row[:, :width][invalid].abs().max()) == 0.0, "padded slots never receive probability"
