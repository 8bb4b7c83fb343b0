"""Scoped conditions: parsing and labels, the relative-geometry construction, and exactness on tiny models.

Model-level references are independent of :mod:`relaylens.conditions.scoped`: the mixed-scope reference runs every layer
at its *own* condition's coordinates (the keys of that condition's relocated cache, the question at that condition's
positions through a pre-hook that hands the layer the model's own cos/sin at those positions), so the scoped
construction (one shared anchor, shifted keys) is never used to build it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaylens.conditions.scoped import (
    Scoped,
    expand_conditions,
    format_layers,
    get_condition,
    model_layer_types,
)
from relaylens.errors import PositionError, RelaylensError
from relaylens.generation.attention import AttentionState, attention_context
from relaylens.generation.single import build_cache, run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import prefill_history
from relaylens.testing import tiny_model

VARIANTS = ("llama", "qwen2_yarn", "gemma3")
#: Common-shift tolerance: max |logit| difference between a mixed scope (the minority condition's keys and question
#: shifted by S - q_c) and the per-layer reference at unshifted positions, float32 tiny models (40-token history).
#: Measured (2026-12-01): shifts <= 104 positions: <= 5.1e-7 (llama 1.8e-7, qwen2-yarn 1.2e-7, gemma3 5.1e-7);
#: a 20,000-position shift: llama 5.8e-7, qwen2-yarn 3.0e-7, gemma3 6.1e-5 (its sliding layers' base-10k angles).
#: The float32 angle p * theta rounds with |error| ~ p * theta * 6e-8, so the tolerance grows with the anchor.
COMMON_SHIFT_ATOL = 2e-6
LARGE_SHIFT_ATOL = 2e-4


# ------------------------------------------------------------------------------------------ parsing and labels

@pytest.mark.parametrize("spec, label", [
    ("relay@layers=0-9", "relay@layers=0-9"),
    ("relay@layers=9,0-3,4", "relay@layers=0-4,9"),
    ("relay@band=early", "relay@band=early"),
    ("relay@layer_type=sliding_attention", "relay@layer_type=sliding_attention"),
    ("relay@heads=3.1,3.0", "relay@heads=3.0,3.1"),
    ("key_only@layers=20-29", "key_only@layers=20-29"),
    ("relay @ layers = 0 @ base = original", "relay@layers=0"),
    ("relay@base=key_only@band=late", "relay@band=late@base=key_only"),
    ("compaction(0.5)@layers=none@base=query_only(64)", "compaction(0.5)@layers=none@base=query_only(64)"),
    ("relay@layers=all", "relay"),
])
def test_labels_are_canonical_and_parse_back(spec, label):
    condition = get_condition(spec)
    assert condition.label == label
    assert get_condition(label).label == label


@pytest.mark.parametrize("spec, fragment", [
    ("relay@", "CONDITION@CLAUSE"),
    ("relay@layer=3", "unknown scope clause"),
    ("relay@layers=3-1", "runs backwards"),
    ("relay@layers=a", "not a list"),
    ("relay@heads=3", "layer.kv_head"),
    ("relay@band=top", "band must be one of"),
    ("relay@layers=1@layers=2", "given twice"),
    ("nope@layers=1", "unknown condition"),
    ("relay@layers=0@base=relay(3)", "takes no parameter"),
])
def test_bad_specs_fail_with_one_clear_error(spec, fragment):
    with pytest.raises(RelaylensError, match=fragment):
        get_condition(spec)


def test_nested_scopes_are_refused():
    with pytest.raises(RelaylensError, match="do not nest"):
        Scoped(get_condition("relay@layers=0"), layers=(1,))


def test_layers_label_formatting():
    assert format_layers([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_layers([]) == "none"


SEL = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]], [[1, 3], [4, 8, 12]]], history_length=20,
                           scores=[[[0.9, 0.1, 0.5, 0.7, 0.2, 0.3], [0.4, 0.8, 0.6, 0.1]],
                                   [[0.5, 0.2], [0.1, 0.9, 0.3]]])


@pytest.mark.parametrize("spec, fragment", [
    ("relay@layers=2", "layer 2 does not exist; the model has 2 layers"),
    ("relay@heads=1.2", "head 1.2 does not exist"),
    ("relay@layer_type=full_attention", "get_condition\\(spec, model=model\\)"),
    ("relay@layer_type=*", "family"),
])
def test_scope_outside_the_model_is_named(spec, fragment):
    with pytest.raises(RelaylensError, match=fragment):
        get_condition(spec).coordinates(SEL)


def test_layer_type_absent_from_model():
    model = tiny_model("llama")
    assert model_layer_types(model) == ("full_attention", "full_attention")
    with pytest.raises(RelaylensError, match="no 'sliding_attention' layers"):
        get_condition("relay@layer_type=sliding_attention", model=model).coordinates(SEL)


# ------------------------------------------------------------------------------------------ geometry (integers)

@st.composite
def selections(draw):
    length = draw(st.integers(8, 200))
    layers, heads = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    keep = [[sorted(draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=min(length, 30), unique=True)))
             for _ in range(heads)] for _ in range(layers)]
    return Selection.from_lists(keep, length, scores=[[[float(i % 3) for i in range(len(h))] for h in l] for l in keep])


INNERS = ["relay", "key_only", "rank_sync", "query_only(64)", "compaction(0.25)", "score_order"]
BASES = ["original", "relay", "key_only", "common_shift(10)"]


@settings(max_examples=60, deadline=None)
@given(sel=selections(), inner=st.sampled_from(INNERS), base=st.sampled_from(BASES), data=st.data())
def test_every_head_sees_its_own_conditions_distances(sel, inner, base, data):
    heads = data.draw(st.lists(st.tuples(st.integers(0, sel.num_layers - 1), st.integers(0, sel.num_kv_heads - 1)),
                               max_size=6))
    scoped = Scoped(get_condition(inner), heads=tuple(heads), base=get_condition(base))
    coords = scoped.coordinates(sel)
    own = {name: get_condition(name).coordinates(sel) for name in (inner, base)}
    for layer in range(sel.num_layers):
        for head in range(sel.num_kv_heads):
            mine = own[inner if (layer, head) in heads else base]
            valid = sel.valid[layer, head]
            distance = coords.question_start - coords.key_positions[layer, head][valid]
            assert torch.equal(distance, mine.question_start - mine.key_positions[layer, head][valid])
            assert bool((coords.key_positions[layer, head][~valid] == -1).all())
    used = {inner} if heads else set()
    if len(set(heads)) < sel.num_layers * sel.num_kv_heads:
        used.add(base)
    assert coords.question_start == max(own[name].question_start for name in used)  # the anchor S
    assert int(coords.key_positions.min()) >= -1


@pytest.mark.parametrize("inner", INNERS)
@pytest.mark.parametrize("base", BASES)
def test_full_and_empty_scopes_are_the_plain_coordinates(inner, base):
    full = get_condition(f"{inner}@layers=all@base={base}").coordinates(SEL)
    empty = get_condition(f"{inner}@layers=none@base={base}").coordinates(SEL)
    for scoped, plain in ((full, get_condition(inner).coordinates(SEL)), (empty, get_condition(base).coordinates(SEL))):
        assert torch.equal(scoped.key_positions, plain.key_positions)
        assert scoped.question_start == plain.question_start


def test_bands_and_layer_types_select_layers():
    sel = Selection.from_lists([[[0, 5]]] * 6, history_length=10)
    mask = get_condition("relay@band=middle").scope_mask(sel)
    assert mask[:, 0].tolist() == [False, False, True, True, False, False]
    types = ("sliding_attention", "full_attention") * 3
    scoped = Scoped(get_condition("relay"), layer_type="full_attention", layer_types=types)
    assert scoped.scope_mask(sel)[:, 0].tolist() == [False, True] * 3
    both = Scoped(get_condition("relay"), band="late", layer_type="full_attention", layer_types=types)
    assert both.scope_mask(sel)[:, 0].tolist() == [False] * 5 + [True]


def test_expand_conditions_binds_and_expands():
    model = tiny_model("gemma3")
    labels = [c.label for c in expand_conditions(["original", "relay@band=early", "relay@layer_type=*"], model)]
    assert labels == ["original", "relay@band=early", "relay@layer_type=sliding_attention",
                      "relay@layer_type=full_attention"]
    assert all(c.layer_types == model_layer_types(model) for c in expand_conditions(["relay@layer_type=*"], model))


# ------------------------------------------------------------------------------------------ model-level exactness

def _setup(variant: str, num_layers: int | None = None, kv_heads: int | None = None, seed: int = 0):
    overrides = {}
    if num_layers == 2:
        overrides["num_hidden_layers"] = 2
        if variant == "gemma3":
            overrides["layer_types"] = ["sliding_attention", "full_attention"]
    if kv_heads is not None:
        overrides["num_key_value_heads"] = kv_heads
    model = tiny_model(variant, seed=seed, **overrides)
    gen = torch.Generator().manual_seed(seed)
    length = 40
    history = torch.randint(3, 300, (length,), generator=gen)
    question = torch.randint(3, 300, (5,), generator=gen)
    prefill = prefill_history(model, history, window_size=4)
    keep = []
    for _ in range(prefill.num_layers):
        keep.append([sorted(torch.randperm(length,
                                           generator=gen)[: int(torch.randint(6, 16, (1,), generator=gen))].tolist())
                     for _ in range(prefill.num_kv_heads)])
    return model, prefill, Selection.from_lists(keep, length), question


def _logits(model, prefill, sel, condition, question, factors=None):
    result = run_condition(model, prefill, sel, condition, question, max_new_tokens=0, keep_question_logits=True,
                           factors=factors)
    return result.question_logits  # [Q, vocab]


def per_layer_reference(model, prefill, sel, layer_conditions: list[str], question: torch.Tensor) -> torch.Tensor:
    """``[Q, vocab]`` logits with layer ``l`` run at ``layer_conditions[l]``'s own coordinates (no shared anchor)."""
    factors = RotaryFactors.from_model(model)
    built = {name: build_cache(prefill, sel, name, factors) for name in set(layer_conditions)}
    rotary = model.model.rotary_emb
    types = getattr(model.config, "layer_types", None)
    state = AttentionState()
    data, positions = [], []
    for layer, name in enumerate(layer_conditions):
        relocated = built[name]
        cached = relocated.cache.layers[layer]
        data.append((cached.keys, cached.values))
        for table in ("valid", "key_positions", "source_positions"):
            getattr(state, table)[layer] = getattr(relocated.state, table)[layer]
        positions.append(relocated.coordinates.question_positions(question.numel()))

    from transformers import DynamicCache

    def pre_hook(module, args, kwargs):
        layer = module.layer_idx
        hidden = kwargs["hidden_states"]
        extra = (types[layer],) if isinstance(rotary.rope_type, dict) else ()  # per-layer-type rotary (Gemma-3)
        kwargs["position_embeddings"] = rotary(hidden, positions[layer][None], *extra)
        state.new_positions = positions[layer]
        return args, kwargs

    handles = [layer.self_attn.register_forward_pre_hook(pre_hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad(), attention_context(model, state):
            out = model(input_ids=question[None], position_ids=positions[0][None],
                        cache=DynamicCache(ddp_cache_data=data),
                        use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    return out.logits[0].float()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("spec, plain", [("relay@layers=all", "relay"), ("key_only@layers=0-1", "key_only"),
                                         ("relay@heads=0.0,0.1,1.0,1.1@base=key_only", "relay")])
def test_full_scope_reproduces_the_unscoped_logits_exactly(variant, spec, plain):
    model, prefill, sel, question = _setup(variant, num_layers=2, kv_heads=2)
    assert torch.equal(_logits(model, prefill, sel, spec, question), _logits(model, prefill, sel, plain, question))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("spec, base",
                         [("relay@layers=none", "original"), ("relay@heads=none@base=key_only", "key_only"),
                                        ("query_only(64)@layers=none@base=relay", "relay")])
def test_empty_scope_reproduces_the_base_exactly(variant, spec, base):
    model, prefill, sel, question = _setup(variant, num_layers=2)
    assert torch.equal(_logits(model, prefill, sel, spec, question), _logits(model, prefill, sel, base, question))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("spec, per_layer, atol", [
    ("relay@layers=0", ["relay", "original"], COMMON_SHIFT_ATOL),
    ("relay@layers=1", ["original", "relay"], COMMON_SHIFT_ATOL),
    ("key_only@layers=0@base=relay", ["key_only", "relay"], COMMON_SHIFT_ATOL),
    ("query_only(64)@layers=1", ["original", "query_only(64)"], COMMON_SHIFT_ATOL),
    ("query_only(20000)@layers=1", ["original", "query_only(20000)"], LARGE_SHIFT_ATOL),
])
def test_mixed_scope_equals_the_per_layer_reference(variant, spec, per_layer, atol):
    model, prefill, sel, question = _setup(variant, num_layers=2)
    scoped = _logits(model, prefill, sel, spec, question)
    reference = per_layer_reference(model, prefill, sel, per_layer, question)
    error = float((scoped - reference).abs().max())
    print(f"common shift {variant} {spec}: max |logit diff| {error:.3g}")
    assert error <= atol, f"{variant} {spec}: max |logit diff| {error:.3g}"
    # the test can fail: each pure condition is far from the mixed one
    for name in set(per_layer):
        gap = float((_logits(model, prefill, sel, name, question) - reference).abs().max())
        assert gap > 10 * atol, f"{variant} {spec}: {name} alone is only {gap:.3g} away"


def test_reference_reproduces_a_plain_condition():
    """The reference itself is right: all layers at one condition equal the runtime's logits (no shift involved)."""
    model, prefill, sel, question = _setup("gemma3", num_layers=2)
    reference = per_layer_reference(model, prefill, sel, ["relay", "relay"], question)
    assert float((reference - _logits(model, prefill, sel, "relay", question)).abs().max()) <= 1e-6


def test_gemma3_layer_type_scope_is_the_layer_scope():
    model, prefill, sel, question = _setup("gemma3", num_layers=2)
    by_type = _logits(model, prefill, sel, get_condition("relay@layer_type=sliding_attention", model=model), question)
    assert torch.equal(by_type, _logits(model, prefill, sel, "relay@layers=0", question))


@pytest.mark.parametrize("variant", VARIANTS)
def test_head_scope_gives_each_head_its_own_conditions_attention(variant):
    """Layer 0's input does not depend on the condition, so its per-head attention output under a head scope must
    equal, head group by head group, the output of that head's own condition run alone."""
    model, prefill, sel, question = _setup(variant, kv_heads=2)
    groups = model.config.num_attention_heads // 2

    def layer0_heads(condition):
        captured = {}

        def hook(module, args):
            captured["x"] = args[0][0, -1].reshape(model.config.num_attention_heads, -1)  # [q_head, head_dim]

        handle = model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(hook)
        try:
            run_condition(model, prefill, sel, condition, question, max_new_tokens=0)
        finally:
            handle.remove()
        return captured["x"]

    mixed = layer0_heads("relay@heads=0.1")
    original, relay = layer0_heads("original"), layer0_heads("relay")
    assert float((mixed[:groups] - original[:groups]).abs().max()) <= COMMON_SHIFT_ATOL
    assert float((mixed[groups:] - relay[groups:]).abs().max()) <= COMMON_SHIFT_ATOL
    assert float((original[groups:] - relay[groups:]).abs().max()) > 100 * COMMON_SHIFT_ATOL  # the heads differ


def test_anchor_past_the_rotary_range_is_refused_with_the_label():
    model, prefill, sel, question = _setup("llama", num_layers=2)
    with pytest.raises(PositionError, match=r"relay@layers=0@base=query_only\(200000\)"):
        run_condition(model, prefill, sel, "relay@layers=0@base=query_only(200000)", question, max_new_tokens=2)


def test_scoped_shift_is_the_largest_part_shift():
    assert get_condition("relay@layers=0@base=query_only(2048)").shift == 2048
    assert get_condition("common_shift(100)@band=late").shift == 100
    assert get_condition("relay@band=late").shift == 0
