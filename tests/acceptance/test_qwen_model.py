"""Real-model tier for the Qwen2.5-Coder embedded models (issue 29): they run only where the models were pulled
(``relaylens model pull qwen2.5-coder-0.5b-instruct``); the suite never downloads them. Exactness on the real
weights is ``relaylens model check`` (numbers in the README); the suite checks the same on a tiny Qwen2
(``tests/bench/test_checks.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaylens.model import embedded as models
from relaylens.model import loading

pytestmark = pytest.mark.model
QWEN = "qwen2.5-coder-0.5b-instruct"


def _need(name: str) -> None:
    if not models.is_pulled(name):
        pytest.skip(f"{name} is not in the relaylens cache (relaylens model pull {name})")


@pytest.mark.parametrize("name", [QWEN, "qwen2.5-coder-1.5b-instruct"])
def test_qwen_tokenizer_speaks_chatml(name):
    _need(name)
    tok = loading.load_tokenizer(name)
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1, marker
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_qwen_reloads_from_the_cache_offline_and_matches_the_gguf_reference():
    """A fresh process (hub and PyPI unreachable) loads the cached float32 copy and reproduces the logits of the
    GGUF-loaded model stored at pull time."""
    _need(QWEN)
    models.verify_cached(QWEN)  # the first-load full hash, outside the timed load
    code = (
        "import time, torch; t = time.perf_counter()\n"
        "from relaylens.model import embedded as models, loading\n"
        f"m, tok = loading.load_model({QWEN!r})\n"
        "dt = time.perf_counter() - t\n"
        f"ids, ref = models.reference_logits({QWEN!r})\n"
        "with torch.inference_mode(): d = ((m(ids).logits - ref).abs().max() / ref.abs().max()).item()\n"
        "print('RESULT', dt, d, m.config.num_hidden_layers, m.config.tie_word_embeddings)\n"
    )
    root = str(Path(models.__file__).resolve().parents[2])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_NO_INDEX="1", PIP_FIND_LINKS="",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, diff, layers, tied = proc.stdout.split("RESULT")[1].split()
    assert float(diff) <= 1e-5 and int(layers) == 24 and tied == "False"
    assert float(seconds) < 120, f"cached reload took {seconds} s (target <= 5 s on a quiet machine)"
    assert "pulling" not in proc.stderr


def test_prompt_mode_auto_picks_chat_for_qwen(tmp_path):
    """``--prompt-mode auto`` resolves to chat with Qwen's tokenizer (its ChatML template): a run on a random model
    with Qwen's vocabulary records chat prompts, and the prompt holds the LongMemEval reader instruction."""
    _need(QWEN)
    from relaylens.datasets import bundled_sample_path, load_records
    from relaylens.datasets.prompting import INSTRUCTION, render_prompt
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model

    tok = loading.load_tokenizer(QWEN)
    prompt = render_prompt(load_records(bundled_sample_path())[0], tok, mode="chat")
    history = tok.decode(prompt.history_ids.tolist())
    assert history.startswith("<|im_start|>system\n") and INSTRUCTION in history
    assert tok.decode(prompt.question_ids.tolist()).endswith("<|im_start|>assistant\n")
    model = tiny_model("qwen2", vocab_size=len(tok))  # Qwen's vocabulary, random weights
    spec = load_analysis("full_kv").spec.replace(prompt_mode="auto", max_new_tokens=2)
    out = run_analysis(spec, RunConfig(model="tiny-qwen", limit=1, out=str(tmp_path / "run")), progress=False,
                       model_and_tokenizer=(model, tok))
    import pandas as pd

    assert set(pd.read_parquet(out / "answers.parquet")["prompt_mode"]) == {"chat"}
    assert torch.is_tensor(prompt.history_ids)
