"""RelayPress against kvpress and against relaylens: the wrapped press keeps the states the bare press keeps, and the
keys it relocates and the question positions kvpress's pipeline then runs equal relaylens's ``relay`` on that
selection.

kvpress runs in its own pinned environment (kvpress 0.5.5, transformers 5.2; ``make kvpress-env``, found through
``RELAYLENS_KVPRESS_PYTHON`` or ``.kvpress-env/``): ``kvpress_relay_reference.py`` loads tiny random models saved here
(Llama, Llama with YaRN x4, Qwen2; 4 layers, 2 kv heads), runs each press bare (the pipeline's compression step) and
as ``RelayPress(press)`` through ``pipeline("kv-press-text-generation")``, and saves the uncompressed prefill, the
kept positions, the cache the question pass found, every call's ``position_ids`` and logits. relaylens then builds a
:class:`~relaylens.geometry.selection.Selection` from those kept positions and compares:

* relocated keys, same inputs: relaylens's ``relocate_keys`` on kvpress's own cached keys (the relocation maths
  alone, float32);
* relocated keys, end to end: relaylens's own prefill (transformers 5.24) relocated to ``relay`` (two transformers
  versions' prefills included);
* values and padding: kept values bit for bit, padded slots zero;
* positions: the question at ``M .. M + Q - 1`` (relaylens's ``question_start``), decoding from ``M + Q``;
* the first answer token's logits and the greedy tokens against relaylens's own ``run_condition(..., "relay")``.

Without the environment the test is skipped locally and FAILS under ``CI=true``. ``RELAYLENS_KVPRESS_RELAY_REPORT=
path`` writes the per-case figures as markdown.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PRESS_MODULE = ROOT / "relaylens" / "integrations" / "kvpress_relay.py"
RATIO = 0.1  # budget: kvpress compression_ratio 0.9
NEW_TOKENS = 4
VARIANTS = {"llama": {}, "llama_yarn": {}, "qwen2": {"layer_types": ["full_attention"] * 4}}
# (case, press, press kwargs, inner press, inner kwargs, attention kernel): a uniform budget, one budget per layer
# (PyramidKV) and one per kv head (AdaKV), on every variant; eager attention once (the additive-mask path)
PRESSES = [
    ("snapkv", "SnapKVPress", {"window_size": 16}, None, {}, "sdpa"),
    ("pyramidkv", "PyramidKVPress", {"window_size": 4, "beta": 4}, None, {}, "sdpa"),
    ("adakv", "AdaKVPress", {}, "SnapKVPress", {"window_size": 16}, "sdpa"),
]
EXTRA = [("llama", "pyramidkv-eager", "PyramidKVPress", {"window_size": 4, "beta": 4}, None, {}, "eager"),
         ("llama", "knorm", "KnormPress", {}, None, {}, "sdpa"),
         ("llama", "critical-adakv", "CriticalAdaKVPress", {}, "KnormPress", {}, "sdpa")]
WORDS = ("I will give you several history chats between you and a user. Please answer the question based on the "
         "relevant chat history. user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name "
         "for a Vizsla! The quick brown fox jumps over the lazy dog").split()


def _kvpress_python() -> str | None:
    for candidate in (os.environ.get("RELAYLENS_KVPRESS_PYTHON"), str(ROOT / ".kvpress-env" / "bin" / "python")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _need(what: str):
    if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI=true requires {what}", pytrace=False)
    pytest.skip(f"{what} unavailable")


def _context(tokenizer, tokens: int = 420) -> str:
    g = torch.Generator().manual_seed(0)
    text = []
    while len(tokenizer.encode(" ".join(text))) < tokens:
        text.append(WORDS[int(torch.randint(len(WORDS), (1,), generator=g))])
    return " ".join(text)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The models (relaylens side) and kvpress's run of every case (one subprocess)."""
    python = _kvpress_python()
    if python is None:
        _need("the pinned kvpress environment (make kvpress-env, or RELAYLENS_KVPRESS_PYTHON)")
    from relaylens.testing import peaked_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("kvpress-relay")
    tokenizer, models, cases = tiny_tokenizer(), {}, []
    for variant, overrides in VARIANTS.items():
        model = peaked_model(variant, num_hidden_layers=4, sharpen=3.0, **overrides)
        model.save_pretrained(folder / variant)
        tokenizer.save_pretrained(folder / variant)
        models[variant] = model
        for case, press, kwargs, inner, inner_kwargs, attn in PRESSES:
            cases.append(dict(id=f"{variant}-{case}", model=str(folder / variant), press=press, kwargs=kwargs,
                              inner=inner, inner_kwargs=inner_kwargs, attn=attn, compression_ratio=1.0 - RATIO))
    for variant, case, press, kwargs, inner, inner_kwargs, attn in EXTRA:
        cases.append(dict(id=f"{variant}-{case}", model=str(folder / variant), press=press, kwargs=kwargs, inner=inner,
                          inner_kwargs=inner_kwargs, attn=attn, compression_ratio=1.0 - RATIO))
    spec = {"context": _context(tokenizer), "question": "What is the name of my dog?", "max_new_tokens": NEW_TOKENS,
            "cases": cases}
    (folder / "cases.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # kvpress's environment, not relaylens's
    env.update(HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    command = [python, str(HERE / "kvpress_relay_reference.py"), str(PRESS_MODULE), str(folder / "cases.json"),
               str(folder / "out.pt")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = torch.load(folder / "out.pt", weights_only=False)
    return models, out


def _relaylens_side(model, prefill_ids, case):
    """relaylens's relay on the kept positions of ``case``: selection, coordinates, relocated layers, a decode."""
    from relaylens.conditions.scoped import get_condition
    from relaylens.generation.cache import relocate_selection
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.geometry.selection import Selection
    from relaylens.model.prefill import prefill_history

    selection = Selection.from_lists(case["kept"], int(prefill_ids.numel()))
    factors = RotaryFactors.from_model(model)
    prefill = prefill_history(model, prefill_ids, window_size=8)
    layers = relocate_selection(prefill, selection, "relay", factors)
    return selection, get_condition("relay").coordinates(selection), factors, layers, prefill


def _figures(models, out, case_id) -> dict:
    from relaylens.generation.single import run_condition
    from relaylens.geometry.rotary import relocate_keys

    case = out["cases"][case_id]
    variant = Path(case["model"]).name
    model, prefill_kv = models[variant], out["prefills"][case["prefill"]]
    selection, coords, factors, layers, prefill = _relaylens_side(model, prefill_kv["context_ids"], case)
    big_m, q_len = selection.max_count, int(prefill_kv["question_ids"].numel())
    same_inputs = end_to_end = 0.0
    values_exact = padding_zero = True
    for layer in range(selection.num_layers):
        keys_kv, values_kv = case["keys"][layer], case["values"][layer]  # [kv_head, M, head_dim]
        for head in range(selection.num_kv_heads):
            m = int(selection.counts[layer, head])
            source = selection.positions[layer, head, :m]
            target = coords.key_positions[layer, head, :m]  # = the slots RelayPress wrote them to
            ours = relocate_keys(prefill_kv["keys"][layer][head, source], source, target, factors)
            same_inputs = max(same_inputs, float((ours - keys_kv[head, target]).abs().max()))
            end_to_end = max(end_to_end, float((layers.data[layer][0][head, :m] - keys_kv[head, target]).abs().max()))
            values_exact &= bool(torch.equal(values_kv[head, target], prefill_kv["values"][layer][head, source]))
            pad = torch.ones(big_m, dtype=torch.bool)
            pad[target] = False
            padding_zero &= bool((keys_kv[head, pad] == 0).all() and (values_kv[head, pad] == 0).all())
    decodes = [[big_m + q_len + i] for i in range(len(case["calls"]) - 1)]  # the first answer token at M + Q
    expected = [coords.question_positions(q_len).tolist()] + decodes
    relay = run_condition(model, prefill, selection, "relay", prefill_kv["question_ids"], max_new_tokens=NEW_TOKENS,
                          eos_token_ids=set())
    kv_tokens = [int(call["logits"].argmax()) for call in case["calls"]]  # fewer when kvpress stopped at EOS
    return {
        "M": big_m, "question_start": coords.question_start, "Q": q_len,
        "positions_equal": [call["position_ids"] for call in case["calls"]] == expected,
        "kept_equal": case["kept"] == case["bare_kept"], "values_exact": values_exact, "padding_zero": padding_zero,
        "keys_same_inputs": same_inputs, "keys_end_to_end": end_to_end,
        "logit_diff": float((relay.last_logits - case["calls"][0]["logits"]).abs().max()),
        "tokens_agree": f"{sum(a == b for a, b in zip(relay.token_ids, kv_tokens))}/{len(kv_tokens)}",
        "tokens_agreed": relay.token_ids[: len(kv_tokens)] == kv_tokens,
        "counts": sorted({int(c) for c in selection.counts.flatten()}),
    }


def test_relay_press_equals_relaylens_relay(reference):
    models, out = reference
    rows, failures = [], []
    for case_id in out["cases"]:
        f = _figures(models, out, case_id)
        rows.append(f"| {case_id} | {f['kept_equal']} | {f['M']} (q at {f['question_start']}, Q {f['Q']}) | "
                    f"{f['positions_equal']} | {f['keys_same_inputs']:.2e} | {f['keys_end_to_end']:.2e} | "
                    f"{f['values_exact'] and f['padding_zero']} | {f['logit_diff']:.2e} | {f['tokens_agree']} | "
                    f"{f['counts'][0]}..{f['counts'][-1]} |")
        ok = (f["kept_equal"] and f["positions_equal"] and f["values_exact"] and f["padding_zero"]
              and f["M"] == f["question_start"] and f["keys_same_inputs"] < 1e-5 and f["keys_end_to_end"] < 1e-4
              and f["logit_diff"] < 1e-4 and f["tokens_agreed"])
        if not ok:
            failures.append(case_id)
    table = "\n".join([
        f"kvpress {out['kvpress']} on transformers {out['transformers']}; budget {RATIO} (compression_ratio "
        f"{1 - RATIO:g}); relaylens relay on the same kept positions", "",
        "| case | kept = bare press | M | positions | keys, same inputs | keys, end to end | values, padding | "
        "first-token logits | greedy tokens | kept per head |", "|---|---|---|---|---|---|---|---|---|---|", *rows])
    if os.environ.get("RELAYLENS_KVPRESS_RELAY_REPORT"):
        Path(os.environ["RELAYLENS_KVPRESS_RELAY_REPORT"]).write_text(table + "\n")
    assert not failures, f"RelayPress and relaylens's relay differ for {failures}:\n{table}"


def test_refusals_in_kvpress(reference):
    """One line each, what arrived and the fix: a batch of two, a wrapper that cannot be reproduced, a press that
    already re-rotates."""
    refusals = reference[1]["refusals"]
    assert refusals["batch"].startswith("RelayPressError: RelayPress compresses one sequence at a time") \
        and "run the sequences one by one" in refusals["batch"]
    assert "got ChunkKVPress: wrap its inner scorer press" in refusals["chunkkv"]
    assert "got KeyRerotationPress, which already re-rotates keys" in refusals["rerotation"]
    assert all("\n" not in message for message in refusals.values())


@pytest.mark.parametrize("variant, message", [
    ("gemma3", "mixes layer types ['full_attention', 'sliding_attention']"),
    ("smollm3_nope", "has layers without rotary (no_rope_layers [1, 0, 1, 0])"),
    ("gpt2", "has no rotary embedding"),
])
def test_models_relay_press_cannot_relocate_are_refused_before_any_work(variant, message):
    pytest.importorskip("kvpress")
    from relaylens.integrations.kvpress_relay import RelayPressError, check_model
    from relaylens.testing import tiny_model

    if variant == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    else:
        model = tiny_model(variant)
    with pytest.raises(RelayPressError, match="^[^\n]*$") as caught:
        check_model(model)
    assert message in str(caught.value)


def test_the_press_module_imports_only_torch_and_kvpress():
    """Self-contained: it must run in kvpress's environment, where relaylens's transformers is absent."""
    import ast

    roots = set()
    for node in ast.walk(ast.parse(PRESS_MODULE.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "contextlib", "dataclasses", "weakref", "torch", "kvpress"}, roots


def test_the_press_imports_from_the_package_in_kvpress_environment():
    """What the how-to tells kvpress users (``pip install --no-deps relaylens`` next to kvpress): the package path
    imports on kvpress's pinned transformers, whatever ``relaylens.integrations`` itself imports."""
    python = _kvpress_python()
    if python is None:
        _need("the pinned kvpress environment (make kvpress-env, or RELAYLENS_KVPRESS_PYTHON)")
    code = ("import transformers; from relaylens.integrations.kvpress_relay import RelayPress; "
            "from kvpress import SnapKVPress; "
            "print(transformers.__version__, RelayPress(SnapKVPress(0.5)).compression_ratio)")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]
    version, ratio = done.stdout.split()[-2:]
    assert version.startswith("5.2") and ratio == "0.5"
