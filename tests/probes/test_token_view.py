"""Token view: per-token attention against a manual per-head recomputation, storage, and the HTML fragment."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from relaylens.generation.single import prefill_from_cache
from relaylens.geometry.selection import Selection
from relaylens.probes.readouts import probe_condition
from relaylens.probes.token_view import final_token_attention
from relaylens.reporting.token_view import example_view, view_html
from relaylens.results.views import load_views, write_view
from relaylens.testing import tiny_model

L, Q = 30, 4


@pytest.fixture(scope="module")
def probed():
    model = tiny_model("llama", seed=3)
    gen = torch.Generator().manual_seed(3)
    history = torch.randint(3, 300, (L,), generator=gen)
    with torch.no_grad():
        out = model(history[None], use_cache=True, cache=DynamicCache())
    pre = prefill_from_cache(history, out.cache, model)
    keep = [[sorted(torch.randperm(L, generator=gen)[: 8 + 4 * h].tolist()) for h in range(pre.num_kv_heads)]
            for _ in range(pre.num_layers)]
    sel = Selection.from_lists(keep, L)
    evidence = torch.zeros(L, dtype=torch.bool)
    evidence[5:9] = True
    result = probe_condition(model, pre, sel, "relay", torch.arange(40, 40 + Q), evidence, max_new_tokens=0)
    return result, sel, keep


def test_final_token_attention_is_the_head_mean_on_source_positions(probed):
    result, sel, keep = probed
    per_layer = final_token_attention(result.question_recorder, sel, L)
    recorder = result.question_recorder
    for layer, weights in per_layer.items():
        q_heads = recorder.rows[layer].shape[0]
        expected = torch.zeros(L)
        for head in range(q_heads):  # loop over heads and slots: an independent, explicit scatter
            kv = head // (q_heads // len(keep[layer]))
            for slot, position in enumerate(keep[layer][kv]):
                expected[position] += float(recorder.rows[layer][head, slot]) / q_heads
        assert torch.allclose(weights, expected, atol=1e-7)
        evicted = torch.ones(L, dtype=torch.bool)
        evicted[sorted({p for head in keep[layer] for p in head})] = False
        assert float(weights[evicted].abs().max()) == 0.0
        # history share of the final token, mean over heads, equals the total shading
        shading = float(recorder.rows[layer][:, : recorder.widths[layer]].sum() / q_heads)
        assert float(weights.sum()) == pytest.approx(shading, abs=1e-6)


def test_views_round_trip_and_limit(tmp_path):
    for order, rid in enumerate(("b", "a", "c", "d")):
        for selector in ("snapkv", "bm25"):
            write_view(tmp_path, example_view() | {"record_id": rid, "selector": selector, "order": order})
    views = load_views(tmp_path, 3)
    assert [v["record_id"] for v in views] == ["b", "b", "a", "a", "c", "c"]
    assert load_views(tmp_path / "missing") == []


def test_view_html_is_self_contained():
    view = example_view() | {"tokens": ["<script>alert(1)</script> ", "http://x.org "] + [f"t{i} " for i in range(38)]}
    html = view_html([view])
    assert "://" not in html and "<script>alert" not in html and "http" not in html.replace("http:\\/\\/", "")
    payload = html.split('<script type="application/json">')[1].split("</script>")[0]
    data = json.loads(payload)
    assert data[0]["tokens"][0].startswith("<script>")
    labels = [o["label"].split(" (")[0] for o in data[0]["options"]]
    assert labels[:4] == ["band: early", "band: middle", "band: late", "layer 0"]
    assert view_html([]) == ""


