"""Issue 51 item 2: the static decoding step gives the dynamic path's tokens, traces as one graph that does not
recompile from step to step, reads the host once every ``sync_every`` steps, and resolves newline stops from token
ids as the text rule does (falling back to the dynamic path where they disagree)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from relaylens.errors import RelaylensError
from relaylens.generation import static as static_module
from relaylens.generation.rows import Row, run_rows
from relaylens.generation.settings import DecodeSettings
from relaylens.generation.single import prefill_from_cache
from relaylens.generation.stops import StopTable, text_stop_index
from relaylens.geometry.selection import Selection
from relaylens.testing import NOPE_VARIANTS, ROPE_VARIANTS, tiny_model, tiny_tokenizer

HISTORY, QUESTION, TOKENS = 40, 5, 12
CONDITIONS = ["original", "relay", "key_only", "query_only(9)", "common_shift(7)", "reverse_order"]
SYNC_EVENTS = ("aten::item", "aten::is_nonzero", "aten::_local_scalar_dense")


def _setup(variant, seed=3):
    model = tiny_model(variant, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    history = torch.randint(3, model.config.vocab_size, (HISTORY,), generator=generator)
    question = torch.randint(3, model.config.vocab_size, (QUESTION,), generator=generator)
    with torch.no_grad():
        cache = model(history[None], use_cache=True, cache=DynamicCache()).cache
    pre = prefill_from_cache(history, cache, model)
    keep = [[sorted(torch.randperm(HISTORY, generator=generator)[: 6 + (3 * layer + head) % 11].tolist())
             for head in range(pre.num_kv_heads)] for layer in range(pre.num_layers)]  # ragged widths
    return model, pre, Selection.from_lists(keep, HISTORY), question


def _decode(model, pre, selection, question, conditions=CONDITIONS, static_answers=True, **settings):
    """Each row's ``(token_ids, positions, stop_reason, text)``; a static decode must answer on the static path
    (``static_answers``: what :func:`decode_static` must return, False where the host check overrules it)."""
    rows = [Row(selection, condition) for condition in conditions]
    answered = []
    decode = static_module.decode_static

    def spy(*args, **kwargs):
        answered.append(decode(*args, **kwargs))
        return answered[-1]

    static_module.decode_static = spy
    try:
        results = run_rows(model, pre, rows, question, DecodeSettings(**settings))
    finally:
        static_module.decode_static = decode
    assert answered == ([static_answers] if settings.get("decoding") == "static" else [])
    return [(r.token_ids, r.positions, r.stop_reason, r.text) for r in results]


@pytest.mark.parametrize("variant", ROPE_VARIANTS + NOPE_VARIANTS)
def test_static_tokens_equal_dynamic(variant):
    model, pre, selection, question = _setup(variant)
    dynamic = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=set())
    static = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=set(), decoding="static")
    assert static == dynamic
    assert all(len(ids) == TOKENS and reason == "limit" for ids, _, reason, _ in static)


@pytest.mark.parametrize("window_mode", ["condition", "source", "none"])
def test_static_windows_equal_dynamic(window_mode):
    """Gemma-3's sliding layers: the window test runs on the device, in the frame the mode names."""
    model, pre, selection, question = _setup("gemma3", seed=5)
    model.config.sliding_window = 12  # narrower than history + answer, so every mode's window cuts
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 12
    common = dict(max_new_tokens=TOKENS, eos_token_ids=set(), window_mode=window_mode)
    assert _decode(model, pre, selection, question, decoding="static", **common) == _decode(
        model, pre, selection, question, **common)


def test_rows_stop_at_eos_independently_and_keep_their_positions():
    model, pre, selection, question = _setup("qwen2")
    free = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=set())
    eos = {free[0][0][3], free[2][0][6]}  # tokens two rows produce mid-answer: those rows stop there
    dynamic = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=eos)
    static = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=eos, decoding="static",
                     sync_every=3)
    assert static == dynamic
    assert {reason for _, _, reason, _ in static} >= {"eos"}
    assert any(len(ids) < TOKENS for ids, _, _, _ in static)


def _newline_model(tokenizer, variant="qwen2"):
    """A tiny model that writes newlines: the unembedding row of a newline token becomes 1.05x that of the token the
    model writes most, so greedy decoding picks the newline wherever it picked that token (no ties)."""
    model, pre, selection, question = _setup(variant)
    free = _decode(model, pre, selection, question, max_new_tokens=TOKENS, eos_token_ids=set())
    counts = torch.bincount(torch.tensor([t for ids, _, _, _ in free for t in ids]))
    newline = tokenizer.convert_tokens_to_ids("Ċ")  # byte-level "\n"
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[newline] = head[int(counts.argmax())] * 1.05
    return model, pre, selection, question


def test_newline_stops_equal_the_text_rule():
    tokenizer = tiny_tokenizer()
    model, pre, selection, question = _newline_model(tokenizer)
    common = dict(max_new_tokens=TOKENS, eos_token_ids=set(), tokenizer=tokenizer, stop_at_newline=True)
    dynamic = _decode(model, pre, selection, question, **common)
    assert _decode(model, pre, selection, question, decoding="static", **common) == dynamic
    assert "newline" in {reason for _, _, reason, _ in dynamic}  # the case this test is about happens


def test_host_disagreement_falls_back_to_the_dynamic_path(monkeypatch):
    """A table that never stops at newlines: the host check sees the text rule fire and the batch decodes again the
    dynamic way, from the untouched cache (same answers as the dynamic path)."""
    tokenizer = tiny_tokenizer()
    model, pre, selection, question = _newline_model(tokenizer)
    common = dict(max_new_tokens=TOKENS, eos_token_ids=set(), tokenizer=tokenizer, stop_at_newline=True)
    dynamic = _decode(model, pre, selection, question, **common)
    build = StopTable.build
    calls = []

    def blind(*args, **kwargs):
        table = build(*args, **kwargs)
        blank = torch.zeros_like(table.newline_after_content)
        calls.append(1)
        return StopTable(table.eos, table.newline, blank, blank, table.stop_at_newline)

    monkeypatch.setattr(static_module.StopTable, "build", blind)
    assert _decode(model, pre, selection, question, decoding="static", static_answers=False, **common) == dynamic
    assert calls


def test_stop_table_agrees_with_the_text_rule_on_random_answers():
    tokenizer = tiny_tokenizer()
    table = StopTable.build(tokenizer, {0}, len(tokenizer), stop_at_newline=True)
    newline_ids = [i for i in range(len(tokenizer)) if bool(table.newline[i])]
    generator = torch.Generator().manual_seed(0)
    fired = 0
    for _ in range(300):
        pool = torch.randint(3, len(tokenizer), (8,), generator=generator).tolist()
        picks = torch.randint(0, len(newline_ids), (3,), generator=generator).tolist()
        ids = [newline_ids[p] if torch.rand(1, generator=generator) < 0.4 else pool[k] for k, p in
               enumerate(picks + picks + picks[:2])]
        seen, device_at = torch.zeros(1, dtype=torch.bool), None
        for index, token in enumerate(ids):
            code, seen = table.stops(torch.tensor([token]), seen)
            if int(code) and device_at is None:
                device_at = index
        assert device_at == text_stop_index(tokenizer, ids, table), tokenizer.decode(ids)
        fired += device_at is not None
    assert 30 < fired < 290  # both outcomes are exercised


def test_compiled_step_is_one_graph_that_does_not_recompile():
    """``torch.compile(advance, fullgraph=True)``: a graph break raises, and with ``error_on_recompile`` so does a
    recompile; 16 steps run on one graph and give the dynamic path's tokens."""
    import torch._dynamo  # noqa: PLC0415 - only this test compiles

    model, pre, selection, question = _setup("qwen2")
    common = dict(max_new_tokens=17, eos_token_ids=set())
    dynamic = _decode(model, pre, selection, question, conditions=["original", "relay"], **common)
    torch._dynamo.reset()
    static_module.compiled_advance.cache_clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = _decode(model, pre, selection, question, conditions=["original", "relay"], decoding="static",
                           compile_backend="eager", **common)
    assert compiled == dynamic
    torch._dynamo.reset()


def test_host_reads_once_every_sync_every_steps():
    model, pre, selection, question = _setup("llama")

    def syncs(sync_every):
        rows = [Row(selection, condition) for condition in ("original", "relay")]
        settings = DecodeSettings(max_new_tokens=17, eos_token_ids=set(), decoding="static", sync_every=sync_every)
        run_rows(model, pre, rows, question, settings)  # warm the code paths once (lazy imports, packs) unprofiled
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_rows(model, pre, rows, question, settings)
        return sum(e.count for e in prof.key_averages() if e.key in SYNC_EVENTS)

    every_step, every_eight = syncs(1), syncs(8)
    assert every_step - every_eight >= 14  # 16 fed steps: 16 host reads against 2
    dynamic = DecodeSettings(max_new_tokens=17, eos_token_ids=set())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_rows(model, pre, [Row(selection, "original"), Row(selection, "relay")], question, dynamic)
    assert sum(e.count for e in prof.key_averages() if e.key in SYNC_EVENTS) > every_eight + 16


def test_settings_refuse_what_they_cannot_do():
    with pytest.raises(RelaylensError, match="decoding must be one of"):
        DecodeSettings(decoding="graph")
    with pytest.raises(RelaylensError, match="sync_every must be at least 1"):
        DecodeSettings(decoding="static", sync_every=0)
    with pytest.raises(RelaylensError, match="compiles the static decoding step"):
        DecodeSettings(compile_backend="inductor")
    with pytest.raises(RelaylensError, match=r"unknown decode setting\(s\) \['max_tokens'\]"):
        DecodeSettings.build(None, max_tokens=3)
    with pytest.raises(RelaylensError, match="outside the model's 10 logits"):
        StopTable.build(None, {12}, 10, stop_at_newline=False)
    assert DecodeSettings(eos_token_ids=[3, 4]).eos_token_ids == frozenset({3, 4})
