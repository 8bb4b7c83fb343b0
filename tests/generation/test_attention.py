"""The relaylens attention function: sliding windows on the condition's coordinates (Gemma-3), restoration, errors."""

from __future__ import annotations

import pytest
import torch
from support.prefill_shared import plain_prefill

from relaylens.generation.attention import (
    AttentionState,
    attention_context,
    relaylens_attention,
)
from relaylens.generation.single import run_condition
from relaylens.geometry.selection import Selection
from relaylens.probes.readouts import FinalTokenRecorder
from relaylens.testing import tiny_model

L, Q = 40, 3


def _gemma_rows(condition: str, window_mode: str):
    model = tiny_model("gemma3", seed=4)  # window 8; layers: sliding, sliding, full
    gen = torch.Generator().manual_seed(0)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    pre = plain_prefill(model, history)
    kept = [5, 36, 37, 38, 39]  # position 5 is 35+ tokens before the question: outside an 8-token window at L
    selection = Selection.from_lists([[kept]] * pre.num_layers, L)
    recorder = FinalTokenRecorder()
    run_condition(model, pre, selection, condition, question, max_new_tokens=0, observers=[recorder],
                  window_mode=window_mode)
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
    pre = plain_prefill(model, history)
    selection = Selection.from_lists([[list(range(0, 40, 3)), list(range(1, 40, 5))]] * pre.num_layers, L)
    recorder = FinalTokenRecorder()
    run_condition(model, pre, selection, "relay", torch.tensor([7, 8, 9]), max_new_tokens=0, observers=[recorder])
    for layer, row in recorder.rows.items():
        assert torch.allclose(row.sum(-1), torch.ones(row.shape[0]), atol=1e-6)
        width = recorder.widths[layer]
        kv_of = torch.arange(row.shape[0]) // pre.num_key_value_groups
        invalid = ~selection.valid[layer, :, :width][kv_of]
        assert float(row[:, :width][invalid].abs().max()) == 0.0, "padded slots never receive probability"


def _row_state(valid: list[torch.Tensor], key_positions: list[torch.Tensor], new_positions: torch.Tensor,
               recorders: list, teachers: list | None) -> AttentionState:
    """A batched state as relaylens.generation.rows builds it: each row's history padded to the widest row (invalid,
    far away)."""
    width = max(v.shape[-1] for v in valid)
    pad = [width - v.shape[-1] for v in valid]
    state = AttentionState(
        valid={0: torch.stack([torch.nn.functional.pad(v, (0, p), value=False) for v, p in zip(valid, pad)])},
        key_positions={0: torch.stack([torch.nn.functional.pad(k, (0, p), value=-(10**9)) for k,
                                       p in zip(key_positions, pad)])},
        new_positions=new_positions)
    state.row_states = [AttentionState(valid={0: v}, key_positions={0: k}, new_positions=n)
                        for v, k, n in zip(valid, key_positions, new_positions)]
    state.row_observers = [[r] for r in recorders]
    state.row_teacher_observers = [[t] for t in teachers] if teachers else []
    return state


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("teacher", [False, True])
def test_observed_batch_computes_each_row_exactly_as_alone(window, teacher):
    """An observed pass of ragged rows: every row's output, probabilities and readouts equal, bit for bit, a batch of
    that row alone; padding slots get exactly zero probability; a teacher-forced last token is hidden from the
    question's observers."""
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(3)
    widths, kv_heads, q_heads, new, dim = (5, 11, 8), 2, 4, 13, 16
    valid = [torch.rand(kv_heads, w, generator=gen) < 0.7 for w in widths]
    key_positions = [torch.sort(torch.randperm(30, generator=gen)[:w]).values.expand(kv_heads, -1) for w in widths]
    new_positions = torch.stack([torch.arange(new) + 30 - 2 * b for b in range(len(widths))])  # [row, new]
    query = torch.randn(len(widths), q_heads, new, dim, generator=gen)
    history = [(torch.randn(1, kv_heads, w, dim, generator=gen), torch.randn(1, kv_heads, w, dim, generator=gen))
               for w in widths]
    fresh = torch.randn(2, len(widths), kv_heads, new, dim, generator=gen)  # new tokens' keys and values
    module = SimpleNamespace(layer_idx=0, sliding_window=window)
    model = tiny_model("llama")

    def call(rows: list[int]):
        width = max(widths[b] for b in rows)
        pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[-2]))  # noqa: E731
        key = torch.cat([torch.cat((pad(history[b][0]), fresh[0, b:b + 1]), dim=-2) for b in rows])
        value = torch.cat([torch.cat((pad(history[b][1]), fresh[1, b:b + 1]), dim=-2) for b in rows])
        recorders = [FinalTokenRecorder() for _ in rows]
        teachers = [FinalTokenRecorder() for _ in rows] if teacher else None
        state = _row_state([valid[b] for b in rows], [key_positions[b] for b in rows], new_positions[rows],
                           recorders, teachers)
        with attention_context(model, state):
            output, probs = relaylens_attention(module, query[rows], key, value, None)
        return output, probs, recorders, teachers, width

    output, probs, recorders, teachers, width = call([0, 1, 2])
    for b, own in enumerate(widths):
        alone, alone_probs, (recorder,), alone_teachers, _ = call([b])
        assert torch.equal(output[b], alone[0]), b
        assert torch.equal(probs[b, ..., :own], alone_probs[0, ..., :own])
        assert torch.equal(probs[b, ..., width:], alone_probs[0, ..., own:])
        assert int(probs[b, ..., own:width].count_nonzero()) == 0, "padding slots receive no probability"
        assert torch.equal(recorders[b].rows[0], recorder.rows[0])
        assert torch.equal(recorders[b].values[0], recorder.values[0])
        question_final = alone_probs[0, :, -2 if teacher else -1, : own + new - teacher]
        assert torch.equal(recorder.rows[0], question_final), "question observers see the question's final token"
        if teacher:
            assert torch.equal(teachers[b].rows[0], alone_teachers[0].rows[0])
            assert torch.equal(alone_teachers[0].rows[0], alone_probs[0, :, -1]), "teacher observers see the whole call"


@pytest.mark.parametrize("variant", ["llama", "qwen2", "phi_partial", "cohere_interleaved", "gemma3", "smollm3_nope"])
@pytest.mark.parametrize("condition", ["original", "relay"])
def test_fused_unobserved_passes_equal_the_probability_path(variant, condition, monkeypatch):
    """Passes nobody observes (decoding steps, an unprobed question pass) run the fused kernel; it must give the
    logits (float32 rounding) and greedy tokens of the path that materialises probabilities."""
    import relaylens.generation.attention as attention

    model = tiny_model(variant, seed=2)
    gen = torch.Generator().manual_seed(1)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    pre = plain_prefill(model, history)
    heads = pre.keys[0].shape[0]  # kv heads
    kept = [[0, 4, 9, 20, 33, 38, 39], [1, 2, 9, 30, 39]]  # heads keep different slots: padded, masked widths
    selection = Selection.from_lists([[kept[h % 2] for h in range(heads)]] * pre.num_layers, L)
    outcomes = {}
    for fused in (True, False):
        monkeypatch.setattr(attention, "FUSED_UNOBSERVED", fused)
        outcomes[fused] = run_condition(model, pre, selection, condition, question, max_new_tokens=6,
                                        eos_token_ids=set())
    assert outcomes[True].token_ids == outcomes[False].token_ids
    torch.testing.assert_close(outcomes[True].last_logits, outcomes[False].last_logits, atol=1e-5, rtol=1e-5)


def test_fused_kernel_is_not_used_when_probabilities_are_read(monkeypatch):
    """An observed pass must keep the probability path (probes read its probabilities)."""
    import relaylens.generation.attention as attention

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran on an observed pass")

    monkeypatch.setattr(attention, "_attend_fused", refuse)
    model = tiny_model("llama", seed=1)
    history = torch.randint(3, 300, (L,))
    pre = plain_prefill(model, history)
    selection = Selection.from_lists([[list(range(0, 40, 3)), list(range(1, 40, 5))]] * pre.num_layers, L)
    recorder = FinalTokenRecorder()
    run_condition(model, pre, selection, "relay", torch.tensor([7, 8, 9]), max_new_tokens=0, observers=[recorder])
    assert recorder.rows


@pytest.mark.parametrize(("batch", "kv_heads", "groups", "q_len"),
                         [(1, 1, 1, 1), (3, 2, 4, 1), (2, 2, 3, 5), (4, 1, 2, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernel_equals_the_probability_kernel(batch, kv_heads, groups, q_len, dtype):
    """The kernels themselves, on random tensors and random per-(row, kv head) masks with a causal tail (every query
    sees at least its own key): outputs equal to float32 rounding (bfloat16: its rounding)."""
    from relaylens.generation.attention import _attend, _attend_fused

    gen = torch.Generator().manual_seed(batch * 100 + q_len)
    total, dim = 23, 16
    query = torch.randn(batch, kv_heads * groups, q_len, dim, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, total, dim, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, total, dim, generator=gen).to(dtype)
    history = total - q_len
    allow = torch.rand(batch, kv_heads, 1, history, generator=gen).expand(-1, -1, q_len, -1) > 0.4
    causal = torch.ones(q_len, q_len).tril().bool().expand(batch, kv_heads, -1, -1)
    allow = torch.cat((allow, causal), dim=-1)  # [B, kv_head, query, key]
    expected, _ = _attend(query, key, value, allow, dim**-0.5, None)
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(_attend_fused(query, key, value, allow, dim**-0.5), expected, **tolerance)
