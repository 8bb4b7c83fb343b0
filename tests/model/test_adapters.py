"""Model families (relaylens.model.adapters): one record per family, looked up by attention class (the query/key
recipes behind relaylens.model.hf.QUERY_RECIPES) or by ``model_type`` (the layers that apply no rotary)."""

from __future__ import annotations

import pytest

from relaylens.model import adapters, hf
from relaylens.testing import NOPE_VARIANTS, ROPE_VARIANTS, tiny_model


def test_every_attention_class_has_one_family_and_the_recipes_are_theirs():
    classes = [name for family in adapters.FAMILIES for name in family.attention_classes]
    assert len(classes) == len(set(classes))
    assert hf.QUERY_RECIPES == adapters.query_recipes() and hf.QUERY_RECIPES is not adapters.query_recipes()
    assert {"LlamaAttention", "Qwen2Attention", "Gemma3Attention", "PhiAttention", "SmolLM3Attention",
            "Cohere2Attention", "Exaone4Attention"} <= set(hf.QUERY_RECIPES)
    assert hf.rotary_function is adapters.rotary_function
    assert adapters.FAMILIES[0] is adapters.DEFAULT_FAMILY


@pytest.mark.parametrize(("model_type", "family"), [
    ("llama", "llama"), ("qwen2", "llama"), ("gemma3_text", "llama"), ("unknown", "llama"), ("", "llama"),
    ("phi", "phi"), ("smollm3", "smollm3"), ("cohere2", "cohere2"), ("cohere", "llama"), ("exaone4", "exaone4"),
    ("exaone4_text", "exaone4"),
])
def test_a_model_type_names_its_family(model_type, family):
    assert adapters.family_for(model_type).name == family


@pytest.mark.parametrize("variant", ROPE_VARIANTS + NOPE_VARIANTS)
def test_each_tiny_model_reads_as_its_family(variant):
    model = tiny_model(variant)
    attn = hf.attention_modules(model)[0]
    owner = [f for f in adapters.FAMILIES if type(attn).__name__ in f.attention_classes]
    assert len(owner) == 1 and hf.QUERY_RECIPES[type(attn).__name__] is owner[0].query_key
    expected = {1, 3} if variant in NOPE_VARIANTS else set()
    assert hf.nope_layers(model) == expected


def test_the_family_rule_follows_the_model_type():
    """A family's own NoPE rule is chosen by ``model_type``: Cohere-2's (no sliding window: a global layer without
    rotary) applied to Llama's modules, which have no window, marks every layer."""
    model = tiny_model("llama")
    assert hf.nope_layers(model) == frozenset()
    model.config.model_type = "cohere2"
    assert hf.nope_layers(model) == frozenset(range(model.config.num_hidden_layers))
    assert not adapters.DEFAULT_FAMILY.applies_no_rotary(hf.attention_module(model))
