"""Issue 51 item 4: ``random:NAME`` specs (a named architecture's published config, random weights, no download)."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from relaylens.errors import ModelError
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model.loading import load_model, load_tokenizer
from relaylens.model.random_specs import RANDOM_SPECS, parse_random_spec, random_config, refuse_random

SMALL = ("num_hidden_layers=2&hidden_size=128&intermediate_size=256&num_attention_heads=4&num_key_value_heads=2"
         "&vocab_size=512")


@pytest.mark.parametrize("name", list(RANDOM_SPECS))
def test_bundled_configs_are_packaged_and_build(name):
    raw = json.loads(resources.files("relaylens.model").joinpath("configs", RANDOM_SPECS[name]).read_text("utf-8"))
    config = random_config(f"random:{name}")
    assert config.num_hidden_layers == raw["num_hidden_layers"]
    assert config.num_key_value_heads == raw["num_key_value_heads"]
    assert config.max_position_embeddings == raw["max_position_embeddings"]


def test_llama_3_1_keeps_its_llama3_rope_scaling():
    config = random_config("random:llama-3.1-8b")
    rope = config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("llama3", 8.0, 8192)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (4096, 32, 8)


def test_meta_device_builds_the_full_8b_shape():
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(random_config("random:llama-3.1-8b"))
    assert 7.9e9 < sum(p.numel() for p in model.parameters()) < 8.1e9  # the published 8.03B parameters


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-0.5b"])
def test_a_reduced_random_model_loads_runs_and_is_reproducible(name):
    spec = f"random:{name}?{SMALL}"
    model, tokenizer = load_model(spec, dtype="float32", device="cpu")
    again, _ = load_model(spec, dtype="float32", device="cpu")
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.float32
    ids = torch.tensor([tokenizer("hello there").input_ids])
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == 512
    assert torch.equal(logits, again(ids).logits.detach())  # seeded: the same weights on every load
    assert RotaryFactors.from_model(model).num_layers == 2
    assert load_tokenizer(spec).vocab_size == tokenizer.vocab_size


def test_bad_specs_are_refused_in_one_line():
    with pytest.raises(ModelError, match="unknown random-weights architecture 'gpt5'"):
        parse_random_spec("random:gpt5")
    with pytest.raises(ModelError, match="key=value"):
        parse_random_spec("random:qwen2-7b?num_hidden_layers")
    with pytest.raises(ModelError, match="no field 'num_layerz'"):
        random_config("random:qwen2-7b?num_layerz=2")
    with pytest.raises(ModelError, match="device_map"):
        load_model("random:qwen2-7b", device_map="auto")


def test_accuracy_analyses_refuse_random_weights_before_loading(monkeypatch, tmp_path):
    from relaylens.experiments import run_setup
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.specs import load_analysis
    from relaylens.model import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(ModelError, match="random weights"):
        run_setup.open_run(load_analysis("main_table").spec, RunConfig(model="random:llama-3.1-8b", out=str(tmp_path)))
    refuse_random("smollm2-135m-instruct", "x")  # trained weights pass
