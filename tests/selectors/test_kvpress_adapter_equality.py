"""Proof against kvpress itself: the states relaylens's ``kvpress:<Press>`` selectors keep equal the states kvpress's
own pipeline keeps, per layer and kv head, on the same model and context.

kvpress runs in its own environment with its pinned dependencies (kvpress 0.5.5, transformers 5.2; ``make
kvpress-env``, found through ``RELAYLENS_KVPRESS_PYTHON`` or ``.kvpress-env/``): ``kvpress_reference.py`` loads a
tiny random Llama and tokenizer saved here with ``save_pretrained``, runs ``KVPressTextGenerationPipeline`` with
each press and reads the kept positions off the compressed cache. relaylens runs the same presses as selectors on
its own transformers (the pipeline's ``context_ids``, budget ``1 - compression_ratio``). Without the environment the
test is skipped locally and FAILS under ``CI=true``. ``RELAYLENS_KVPRESS_REPORT=path`` writes the per-press table
(exact-match count over (layer, kv head), mean Jaccard) as markdown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RATIO = 0.1  # budget: kvpress compression_ratio 0.9

# (case id, press, press kwargs, inner press, inner kwargs, attention kernel of kvpress's run, torch seed before the
# pipeline / relaylens's ``seed`` for the presses that sketch with torch's global generator)
CASES = [
    ("SnapKVPress", "SnapKVPress", {}, None, {}, "sdpa", None),
    ("KnormPress", "KnormPress", {}, None, {}, "sdpa", None),
    ("ExpectedAttentionPress", "ExpectedAttentionPress", {}, None, {}, "sdpa", None),
    ("StreamingLLMPress", "StreamingLLMPress", {}, None, {}, "sdpa", None),
    ("TOVAPress", "TOVAPress", {}, None, {}, "sdpa", None),
    ("KeyDiffPress", "KeyDiffPress", {}, None, {}, "sdpa", None),
    ("PyramidKVPress", "PyramidKVPress", {"window_size": 4, "beta": 4}, None, {}, "sdpa", None),  # a real pyramid
    ("LagKVPress", "LagKVPress", {"lag_size": 32}, None, {}, "sdpa", None),
    ("CURPress", "CURPress", {}, None, {}, "sdpa", None),
    ("CapPress", "CapPress", {}, None, {}, "sdpa", None),
    ("NonCausalAttnPress", "NonCausalAttnPress", {"chunk_size": 64}, None, {}, "sdpa", None),
    ("ObservedAttentionPress", "ObservedAttentionPress", {}, None, {}, "eager", None),
    ("RandomPress", "RandomPress", {"seed": 7}, None, {}, "sdpa", None),  # the press's own generator
    ("LeverageScorePress", "LeverageScorePress", {"sketch_dimension": 8}, None, {}, "sdpa", 3),
    ("CompactorPress", "CompactorPress", {"sketch_dimension": 8, "chunk_size": 64}, None, {}, "sdpa", 3),
    ("CriticalKVPress", "CriticalKVPress", {}, "SnapKVPress", {"window_size": 16}, "sdpa", None),
]
# kvpress 0.5.5's pipeline cannot answer after a real pyramid (per-layer cache lengths differ, the question's
# attention mask has one length): kvpress runs only the pipeline's compression step for these
PREFILL_ONLY = ("PyramidKVPress",)
SIX = ("SnapKVPress", "KnormPress", "ExpectedAttentionPress", "StreamingLLMPress", "TOVAPress", "KeyDiffPress")


def _kvpress_python() -> str | None:
    for candidate in (os.environ.get("RELAYLENS_KVPRESS_PYTHON"), str(ROOT / ".kvpress-env" / "bin" / "python")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _need(what: str):
    if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI=true requires {what}", pytrace=False)
    pytest.skip(f"{what} unavailable")


WORDS = ("I will give you several history chats between you and a user. Please answer the question based on the "
         "relevant chat history. user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name "
         "for a Vizsla! The quick brown fox jumps over the lazy dog").split()


def _need_kvpress() -> None:
    try:
        import kvpress  # noqa: F401
    except ImportError:
        _need("kvpress in relaylens's environment (pip install --no-deps kvpress==0.5.5)")


def _context(tokenizer, tokens: int = 420) -> str:
    words = WORDS
    g = torch.Generator().manual_seed(0)
    text = []
    while len(tokenizer.encode(" ".join(text))) < tokens:
        text.append(words[int(torch.randint(len(words), (1,), generator=g))])
    return " ".join(text)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The model, the context ids and kvpress's kept positions per case (one subprocess for every case)."""
    python = _kvpress_python()
    if python is None:
        _need("the pinned kvpress environment (make kvpress-env, or RELAYLENS_KVPRESS_PYTHON)")
    _need_kvpress()
    from relaylens.testing import peaked_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("kvpress")
    model, tokenizer = peaked_model("llama", num_hidden_layers=4, sharpen=3.0), tiny_tokenizer()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    cases = [dict(id=c[0], press=c[1], kwargs=c[2], inner=c[3], inner_kwargs=c[4], attn=c[5], seed=c[6],
                  compression_ratio=1.0 - RATIO, pipeline=c[0] not in PREFILL_ONLY) for c in CASES]
    spec = {"context": _context(tokenizer), "question": "What is the name of my dog?", "cases": cases}
    (folder / "cases.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # kvpress's environment, not relaylens's
    command = [python, str(HERE / "kvpress_reference.py"), str(folder / "model"), str(folder / "cases.json"),
               str(folder / "out.json")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return model, json.loads((folder / "out.json").read_text())


def _compare(relaylens_kept, kvpress_kept) -> tuple[int, int, float]:
    """(exact matches, (layer, kv head) pairs, mean Jaccard)."""
    exact, pairs, jaccard = 0, 0, 0.0
    for ours_layer, theirs_layer in zip(relaylens_kept, kvpress_kept, strict=True):
        for ours, theirs in zip(ours_layer, theirs_layer, strict=True):
            a, b = set(ours), set(theirs)
            exact += a == b
            pairs += 1
            jaccard += len(a & b) / len(a | b)
    return exact, pairs, jaccard / pairs


def test_relaylens_keeps_what_kvpress_keeps(reference):
    from relaylens.model.prefill import prefill_history
    from relaylens.selectors import make_selector

    model, ref = reference
    ids = torch.tensor(ref["context_ids"])
    prefill = prefill_history(model, ids, window_size=8)
    rows, failures = [], []
    for case_id, press, kwargs, inner, inner_kwargs, _attn, seed in CASES:
        options = dict(kwargs)
        if inner:
            options["press"] = inner
            options.update({f"press.{k}": v for k, v in inner_kwargs.items()})
        selector = make_selector(f"kvpress:{press}", **options, **({"seed": seed} if seed is not None else {}))
        selection = selector.prepare(model, prefill).select(prefill, None, RATIO)
        ours = [[p.tolist() for p in selection.layer_positions(l)] for l in range(selection.num_layers)]
        exact, pairs, jaccard = _compare(ours, ref["kept"][case_id])
        rows.append(f"| {case_id} | {exact}/{pairs} | {jaccard:.4f} | {selection.info['budget']} |")
        if exact != pairs:
            failures.append(case_id)
    table = "\n".join([f"L = {ids.numel()} context tokens, budget {RATIO} (compression_ratio {1 - RATIO:g}); kvpress "
                       f"{ref['kvpress']} on transformers {ref['transformers']}, relaylens on transformers "
                       f"{sys.modules['transformers'].__version__}", "",
                       "| press | exact (layer, kv head) | mean Jaccard | kept per head |", "|---|---|---|---|", *rows])
    if os.environ.get("RELAYLENS_KVPRESS_REPORT"):
        Path(os.environ["RELAYLENS_KVPRESS_REPORT"]).write_text(table + "\n")
    assert not failures, f"relaylens and kvpress keep different states for {failures}:\n{table}"
    assert set(SIX) <= {c[0] for c in CASES}
