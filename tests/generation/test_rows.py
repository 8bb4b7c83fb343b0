"""Batched rows: batch and sequential runs agree (tokens exactly, readouts within 1e-5), rows stop independently."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from relaylens.conditions.scoped import get_condition
from relaylens.errors import ShapeError
from relaylens.generation.rows import Row, run_rows
from relaylens.generation.single import prefill_from_cache, run_condition
from relaylens.geometry.selection import Selection
from relaylens.probes.readouts import probe_condition, probe_rows
from relaylens.testing import tiny_model

VARIANTS = ["llama", "qwen2_yarn", "phi_partial", "glm_partial_interleaved", "gemma3"]
HISTORY, QUESTION, TOKENS = 48, 5, 6
#: one condition of every family (scores make score_order meaningful)
CONDITIONS = ["original", "relay", "rank_sync", "key_only", "query_only(9)", "common_shift(7)", "compaction(0.25)",
              "half_gap", "score_order", "reverse_order", "random_order(3)"]


def _tokens(model, n, seed):
    return torch.randint(3, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def _ragged(pre, seed, low=4, high=30):
    """Ragged per-(layer, head) selection with scores: every head keeps its own count of states."""
    generator = torch.Generator().manual_seed(seed)
    keep = [[sorted(torch.randperm(HISTORY, generator=generator)
                    [:int(torch.randint(low, high, (1,), generator=generator))].tolist())
             for _ in range(pre.num_kv_heads)] for _ in range(pre.num_layers)]
    sel = Selection.from_lists(keep, HISTORY)
    return Selection(sel.positions, sel.valid, HISTORY, scores=torch.rand(sel.positions.shape, generator=generator))


@pytest.fixture(scope="module", params=VARIANTS)
def setup(request):
    model = tiny_model(request.param, seed=7)
    history, question = _tokens(model, HISTORY, 0), _tokens(model, QUESTION, 1)
    with torch.no_grad():
        cache = model(history[None], use_cache=True, cache=DynamicCache()).cache
    pre = prefill_from_cache(history, cache, model)
    evidence = torch.zeros(HISTORY, dtype=torch.bool)
    evidence[12:30] = True
    return request.param, model, question, pre, evidence


def _rows(pre):
    """Two different ragged selections, crossed with every condition family (22 rows of differing widths)."""
    selections = [_ragged(pre, 11), _ragged(pre, 12, low=2, high=10)]
    return [(sel, condition) for sel in selections for condition in CONDITIONS]


def test_batched_tokens_and_logits_equal_sequential(setup):
    variant, model, question, pre, _ = setup
    rows = _rows(pre)
    sequential = [run_condition(model, pre, sel, cond, question, max_new_tokens=TOKENS, eos_token_ids=set(),
                                keep_question_logits=True) for sel, cond in rows]
    batched = run_rows(model, pre, [Row(sel, cond) for sel, cond in rows], question, max_new_tokens=TOKENS,
                       eos_token_ids=set(), keep_question_logits=True)
    for (sel, cond), one, many in zip(rows, sequential, batched):
        assert many.condition == one.condition == get_condition(cond).label
        assert many.token_ids == one.token_ids, (variant, cond)
        assert many.positions == one.positions and many.question_start == one.question_start
        assert float((many.question_logits - one.question_logits).abs().max()) <= 1e-5, (variant, cond)


def test_batched_probes_and_teacher_readouts_equal_sequential(setup):
    variant, model, question, pre, evidence = setup
    rows = _rows(pre)[::2]
    sequential = [probe_condition(model, pre, sel, cond, question, evidence, teacher_token=9, max_new_tokens=3,
                                  eos_token_ids=set()) for sel, cond in rows]
    batched = probe_rows(model, pre, rows, question, evidence, teacher_token=9, max_new_tokens=3, eos_token_ids=set())
    for (_, cond), one, many in zip(rows, sequential, batched):
        assert many.generation.token_ids == one.generation.token_ids, (variant, cond)
        left, right = one.readouts, many.readouts
        assert list(left.columns) == list(right.columns) and len(left) == len(right) > 0
        columns = ["probe_point", "layer", "head", "metric"]
        assert (left[columns].values == right[columns].values).all()
        difference = (left["value"] - right["value"]).abs()
        assert float(difference.fillna(0).max()) <= 1e-5, (variant, cond)
        assert (left["value"].isna() == right["value"].isna()).all()


def test_teacher_token_leaves_decoding_unchanged():
    model = tiny_model("llama", seed=3)
    history, question = _tokens(model, HISTORY, 5), _tokens(model, QUESTION, 6)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    rows = [Row(_ragged(pre, 1), "relay"), Row(_ragged(pre, 2), "original")]
    plain = run_rows(model, pre, rows, question, max_new_tokens=TOKENS, eos_token_ids=set())
    forced = run_rows(model, pre, rows, question, max_new_tokens=TOKENS, eos_token_ids=set(), teacher_token=11)
    assert [r.token_ids for r in plain] == [r.token_ids for r in forced]
    for row, without, with_teacher in zip(rows, plain, forced):  # the token rides in the question pass: causal
        assert float((with_teacher.last_logits - without.last_logits).abs().max()) <= 1e-5
        separate = run_condition(model, pre, row.selection, row.condition, question, max_new_tokens=0,
                                 eos_token_ids=set(), teacher_token=11, grad=True)  # its own forward on a copy
        assert float((with_teacher.teacher_logits - separate.teacher_logits.detach()).abs().max()) <= 1e-5


@pytest.mark.parametrize("window_mode", ["condition", "source", "none"])
def test_gemma3_window_modes_batched_equal_sequential(window_mode):
    model = tiny_model("gemma3", seed=4)  # sliding window 8 on layers 0 and 1
    history, question = _tokens(model, HISTORY, 2), _tokens(model, QUESTION, 3)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    rows = [(_ragged(pre, seed), cond) for seed in (3, 4)
            for cond in ("original", "relay", "half_gap", "query_only(5)")]
    sequential = [run_condition(model, pre, sel, cond, question, max_new_tokens=TOKENS, eos_token_ids=set(),
                                window_mode=window_mode, keep_question_logits=True) for sel, cond in rows]
    batched = run_rows(model, pre, [Row(sel, cond) for sel, cond in rows], question, max_new_tokens=TOKENS,
                       eos_token_ids=set(), window_mode=window_mode, keep_question_logits=True)
    for one, many in zip(sequential, batched):
        assert many.token_ids == one.token_ids
        assert float((many.question_logits - one.question_logits).abs().max()) <= 1e-5


def test_rows_stop_independently_and_leave_the_batch():
    """An EOS that only some rows produce stops them; the forward passes after that carry fewer rows."""
    model = tiny_model("llama", seed=5)
    history, question = _tokens(model, HISTORY, 8), _tokens(model, QUESTION, 9)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    rows = [(_ragged(pre, seed), cond) for seed in (5, 6) for cond in ("original", "relay", "query_only(30)")]
    free = [run_condition(model, pre, sel, cond, question, max_new_tokens=8, eos_token_ids=set()) for sel, cond in rows]
    stop = [t for t in free[0].token_ids[1:] if t not in free[-1].token_ids][0]  # stops row 0 early, never the last row
    expected = [run_condition(model, pre, sel, cond, question, max_new_tokens=8, eos_token_ids={stop}) for sel,
                cond in rows]
    sizes = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: sizes.append(args[0].shape[0]))
    try:
        batched = run_rows(model, pre, [Row(sel, cond) for sel, cond in rows], question, max_new_tokens=8,
                           eos_token_ids={stop})
    finally:
        handle.remove()
    for one, many in zip(expected, batched):
        assert (many.token_ids, many.stop_reason, many.positions) == (one.token_ids, one.stop_reason, one.positions)
    alive = [sum(len(r.token_ids) > step for r in expected) for step in range(1, 8)]
    assert sizes[0] == len(rows) and sizes[1:] == [n for n in alive if n][: len(sizes) - 1]
    assert min(sizes) < len(rows), "the EOS must stop at least one row early for this test to mean anything"


def test_observer_sees_its_row_alone_without_padding():
    model = tiny_model("llama", seed=6)
    history, question = _tokens(model, HISTORY, 1), _tokens(model, QUESTION, 2)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    narrow, wide = _ragged(pre, 7, low=2, high=5), _ragged(pre, 8, low=30, high=40)
    seen = []
    run_rows(model, pre, [Row(narrow, "relay", (lambda layer, q, k, v, p, s: seen.append((layer, k.shape, p.shape)),)),
                          Row(wide, "relay")], question, max_new_tokens=0)
    for layer, key_shape, prob_shape in seen:
        width = int(narrow.valid[layer].sum(-1).max())
        assert key_shape[0] == 1 and key_shape[2] == width + QUESTION and prob_shape[-1] == width + QUESTION


def test_empty_rows_refused():
    model = tiny_model("llama")
    history = _tokens(model, HISTORY, 0)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    with pytest.raises(ShapeError, match="at least one"):
        run_rows(model, pre, [], torch.tensor([5, 6]))


@pytest.mark.parametrize("variant", ["llama", "gemma3"])
def test_scoped_conditions_batched_equal_sequential(variant):
    """Layer/head-scoped conditions are ordinary coordinates: batched rows decode them as one by one."""
    from relaylens.conditions.scoped import expand_conditions

    model = tiny_model(variant, seed=9)
    history, question = _tokens(model, HISTORY, 4), _tokens(model, QUESTION, 5)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=DynamicCache()).cache, model)
    specs = ["original", "relay@layers=0", "relay@band=late@base=key_only", "half_gap@heads=1.0", "relay@layer_type=*"]
    conditions = expand_conditions(specs, model)
    rows = [(_ragged(pre, seed), cond) for seed in (21, 22) for cond in conditions]
    sequential = [run_condition(model, pre, sel, cond, question, max_new_tokens=TOKENS, eos_token_ids=set(),
                                keep_question_logits=True) for sel, cond in rows]
    batched = run_rows(model, pre, [Row(sel, cond) for sel, cond in rows], question, max_new_tokens=TOKENS,
                       eos_token_ids=set(), keep_question_logits=True)
    for (_, cond), one, many in zip(rows, sequential, batched):
        assert many.condition == one.condition == cond.label
        assert many.token_ids == one.token_ids and many.question_start == one.question_start, cond.label
        assert float((many.question_logits - one.question_logits).abs().max()) <= 1e-5, cond.label


@pytest.mark.parametrize("packed_flag, fused_flag", [(True, True), (False, False)])
def test_decoding_path_names_what_the_steps_run_and_why(monkeypatch, packed_flag, fused_flag):
    from relaylens.generation import attention
    from relaylens.generation.rows import decoding_path
    from relaylens.model import packed

    monkeypatch.setattr(packed, "PACKED_DECODING", packed_flag)
    monkeypatch.setattr(attention, "FUSED_UNOBSERVED", fused_flag)
    bf16 = decoding_path(tiny_model("llama", dtype=torch.bfloat16))
    f32 = decoding_path(tiny_model("llama"))
    packs = packed_flag and packed.packing_available()
    assert bf16["linear_layers"] == ("prepacked bfloat16 (oneDNN)" if packs else "F.linear")
    assert f32["linear_layers"] == "F.linear"
    off = "turned off (relaylens.model.packed.PACKED_DECODING = False)"
    assert f32["linear_layers_why"] == ("the linear layers are float32 on cpu; packing is for bfloat16 on a CPU"
                                        if packed_flag else off)
    assert bf16["unobserved_attention"].startswith("fused" if fused_flag else "relaylens's own")
