"""Real-model tier of test_transformer_lens.py: TransformerLens backend (b) against the default backend (a): same
readouts; the cache= shim's effect and scope."""

from __future__ import annotations

import time

import pytest
import torch
from support.probes_tl_shared import KEYS, disagreement  # noqa: F401 - shared with the model tier

from relaylens.geometry.selection import Selection
from relaylens.probes.readouts import probe_condition
from relaylens.probes.transformer_lens import (
    bridge_model,
    probe_condition_tl,
)

pytestmark = pytest.mark.model


def _heterogeneous_selection(history_length, num_layers, num_kv_heads, evidence, seed=0):
    """Per-(layer, kv_head) subsets of different sizes: a sink, a recent window, random states, and in every other
    head the gold evidence (so some heads keep gold and some may not)."""
    gen = torch.Generator().manual_seed(seed)
    keep = []
    for layer in range(num_layers):
        heads = []
        for head in range(num_kv_heads):
            count = int(torch.randint(64, 192, (1,), generator=gen))
            window = 16 + 8 * ((layer + head) % 4)
            chosen = set(range(4)) | set(range(history_length - window, history_length))
            chosen |= set(torch.randperm(history_length, generator=gen)[:count].tolist())
            if (layer + head) % 2 == 0:
                chosen |= set(torch.nonzero(evidence).flatten().tolist())
            heads.append(sorted(chosen))
        keep.append(heads)
    return Selection.from_lists(keep, history_length)


PREFIX = 512


@pytest.mark.model
def test_backends_agree_on_smollm2_real_record(smollm2):
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.model.prefill import prefill_history

    model, tokenizer = smollm2
    record = load_records("relaylens/data/sample_longmemeval.json")[1]
    prompt = render_prompt(record, tokenizer, mode="completion")
    # keep the run short on CPU: the first PREFIX history tokens of the record (its gold turn lies inside them)
    history, evidence = prompt.history_ids[:PREFIX], prompt.evidence_mask("turn")[:PREFIX]
    assert evidence.any() and prompt.history_length > PREFIX
    pre = prefill_history(model, history, capture_window_queries=False)
    sel = _heterogeneous_selection(pre.history_length, pre.num_layers, pre.num_kv_heads, evidence)
    assert not sel.is_uniform and len(set(sel.counts.max(-1).values.tolist())) > 1  # ragged layers and heads

    start = time.perf_counter()
    bridge = bridge_model(model, tokenizer)
    boot = time.perf_counter() - start
    assert model.config._attn_implementation == "sdpa"
    for condition in ("original", "relay"):
        a = probe_condition(model, pre, sel, condition, prompt.question_ids, evidence, max_new_tokens=0)
        start = time.perf_counter()
        b = probe_condition_tl(bridge, pre, sel, condition, prompt.question_ids, evidence)
        elapsed = time.perf_counter() - start
        gap = disagreement(a.readouts, b.readouts)
        logit_gap = float((a.generation.last_logits - b.generation.last_logits).abs().max())
        print(f"\n{condition}: L={pre.history_length} Q={prompt.question_ids.numel()} max|readout diff|={gap:.2e} "
              f"max|logit diff|={logit_gap:.2e} bridge boot {boot:.2f}s probed pass {elapsed:.2f}s")
        assert gap <= 1e-5, condition
        assert logit_gap <= 1e-3, condition
    shares = b.readouts[b.readouts.metric == "evidence_share"].value
    assert shares.between(0, 1).all() and shares.max() > 0  # gold is really read
