"""Models with layers that apply no rotary (issue 52, item 11): SmolLM3 ``no_rope_layers``, Cohere-2 and EXAONE-4
global layers. Their window queries are rebuilt by recipes of their own (``relaylens.model.hf.QUERY_RECIPES``), so
an analysis whose selectors read window queries runs end to end, and EXAONE-4's global layers are not treated as
sliding (its modules carry the model's ``sliding_window`` on every layer, with ``is_sliding`` telling them apart).

The references are the model's own: the query each attention forward hands its attention kernel, and the logits of
one full forward pass.
"""

from __future__ import annotations

import json

import pytest
import torch

from relaylens.model.hf import attention_modules, attention_window
from relaylens.testing import NOPE_VARIANTS, tiny_model, tiny_tokenizer

IDS = torch.arange(3, 60)  # [T]


def _own_queries(model, monkeypatch) -> dict[int, torch.Tensor]:
    """Per layer, the post-rotary query ``[q_head, T, head_dim]`` the model's attention forward passes its sdpa
    kernel (the kernel wrapped for this call; masks are built exactly as for sdpa)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa, seen = ALL_ATTENTION_FUNCTIONS["sdpa"], {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen[module.layer_idx] = query[0].detach().clone()
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    with monkeypatch.context() as patch, torch.no_grad():
        patch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", capture)
        if "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping:  # an earlier registration overrides the global entry
            patch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", capture)
        model(IDS[None])
    return seen


@pytest.mark.parametrize("variant", NOPE_VARIANTS)
def test_window_queries_equal_the_models_own_queries(variant, monkeypatch):
    from relaylens.model.prefill import prefill_history

    model = tiny_model(variant)
    own = _own_queries(model, monkeypatch)
    prefill = prefill_history(model, IDS, window_size=8)  # refused before the recipes existed
    for layer, queries in enumerate(prefill.window_queries):  # [q_head, w, head_dim]
        reference = own[layer][:, -8:]
        error = float((queries.float() - reference).abs().max() / reference.abs().max())
        assert error < 1e-5, f"{variant} layer {layer}: window queries off by {error:.3g} (relative)"


def test_exaone4_global_layers_have_no_sliding_window():
    model = tiny_model("exaone4_nope")  # layer types: sliding, full, sliding, full; sliding_window=8
    windows = [attention_window(attn) for attn in attention_modules(model)]
    assert windows == [8, None, 8, None]


@pytest.mark.parametrize("variant", NOPE_VARIANTS)
def test_keep_all_original_equals_the_full_forward(variant):
    """The check `relaylens model check` runs (tiny EXAONE-4 failed it at 1.2-1.4 before the window fix)."""
    from relaylens.generation.single import run_condition
    from relaylens.geometry.selection import Selection
    from relaylens.model.prefill import prefill_history

    model = tiny_model(variant)
    history, question = IDS[:40], IDS[40:]
    prefill = prefill_history(model, history, window_size=8)
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    ours = run_condition(model, prefill, full, "original", question, max_new_tokens=0,
                         keep_question_logits=True).question_logits.float()
    with torch.no_grad():
        reference = model(IDS[None]).logits[0, 40:].float()
    error = float((ours - reference).abs().max() / reference.abs().max())
    assert error < 1e-4, f"{variant}: keep-all original vs full forward {error:.3g}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records

    root = tmp_path_factory.mktemp("nope_runs")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=800)))
    return root, data


@pytest.mark.parametrize("variant", NOPE_VARIANTS)
def test_a_coordinate_ablation_run_completes(workspace, variant):
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.results.store import load_tables

    root, data = workspace
    model_dir, out = root / variant, root / f"out-{variant}"
    tiny_model(variant).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    result = CliRunner().invoke(app, ["run", "coordinate_ablation", "--model", str(model_dir), "--data", str(data),
                                      "--max-new-tokens", "2", "--budget", "0.4", "--out", str(out), "--limit", "1"])
    assert result.exit_code == 0, result.output[-2000:]
    answers = load_tables(out)["answers"]
    assert {"relay", "original"} <= set(answers.condition) and not answers.empty
