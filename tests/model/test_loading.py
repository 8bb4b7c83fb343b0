"""Model loading: spec resolution and errors, and fingerprints (pulling the embedded models, and loading a pulled
copy: tests/model/test_pull.py)."""

from __future__ import annotations

import pytest
import torch

import relaylens.model.pull as pulling
from relaylens.errors import ModelError
from relaylens.model import loading
from relaylens.testing import tiny_model, tiny_tokenizer

# ---------------------------------------------------------------------------------------------- spec resolution


def test_unknown_embedded_name_lists_known_ones():
    known = "gemma3-270m, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, smollm2-135m-instruct"
    with pytest.raises(ModelError, match=f"unknown embedded model 'smollm3'.*{known}"):
        loading.load_model("smollm3")
    with pytest.raises(ModelError, match=f"known: {known}"):
        pulling.pull("nope")


@pytest.mark.parametrize("spec", ["./missing-model", "/no/such/dir", "~/no/such/model.gguf", "a/b/c"])
def test_missing_paths(spec):
    with pytest.raises(ModelError, match="does not exist"):
        loading.resolve_spec(spec)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="without config.json"):
        loading.resolve_spec(tmp_path)


def test_hub_ids_pass_through():
    assert loading.resolve_spec("meta-llama/Llama-3.1-8B-Instruct") == ("hub", "meta-llama/Llama-3.1-8B-Instruct")


def test_device_and_device_map_are_exclusive():
    with pytest.raises(ModelError, match="either device"):
        loading.load_model("smollm2-135m-instruct", device="cpu", device_map="auto")


def test_local_directory_roundtrip(tmp_path):
    model, tok = tiny_model("qwen2_yarn"), tiny_tokenizer()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = loading.load_model(tmp_path, attn_implementation="eager")
    assert loading.model_fingerprint(loaded) == loading.model_fingerprint(model)
    assert loaded.config._attn_implementation == "eager" and not loaded.training
    assert loading.load_tokenizer(tmp_path)("hello dog")["input_ids"] == tok("hello dog")["input_ids"]
    ids = torch.arange(3, 30)[None]
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


def test_fingerprints_see_every_weight(tmp_path):
    a, b = tiny_model("llama", seed=0), tiny_model("llama", seed=0)
    assert loading.model_fingerprint(a) == loading.model_fingerprint(b)
    with torch.no_grad():
        b.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-6
    assert loading.model_fingerprint(a) != loading.model_fingerprint(b)
    a.save_pretrained(tmp_path)
    assert len(pulling.weights_sha256(tmp_path)) == 64
    with pytest.raises(ModelError, match="no .safetensors"):
        pulling.weights_sha256(tmp_path / "nothing")


# ---------------------------------------------------------------------------------------------- real model


