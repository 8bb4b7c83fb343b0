"""Probes against manual recomputation from captured q, k, v, phase replay consistency, planted cases, bands."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformers import DynamicCache

from relaylens.conditions.bands import bands
from relaylens.errors import RelaylensError
from relaylens.generation.single import build_cache, prefill_from_cache
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.probes.readouts import gold_slots, probe_condition, replay_conditions
from relaylens.reporting.summaries import band_table
from relaylens.testing import tiny_model

L, Q = 48, 5


def _setup(variant="llama", seed=0):
    model = tiny_model(variant, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    with torch.no_grad():
        out = model(history[None], use_cache=True, cache=DynamicCache())
    pre = prefill_from_cache(history, out.cache, model)
    keep = [[sorted(torch.randperm(L, generator=gen)[: 10 + 3 * h + l].tolist()) for h in range(pre.num_kv_heads)]
            for l in range(pre.num_layers)]
    sel = Selection.from_lists(keep, L)
    evidence = torch.zeros(L, dtype=torch.bool)
    evidence[10:22] = True
    return model, pre, sel, question, evidence


def _manual(model, pre, sel, question, evidence, condition):
    """Recompute the final question token's readouts from explicitly captured q, k, v with an explicit softmax."""
    factors = RotaryFactors.from_model(model)
    relocated = build_cache(pre, sel, condition, factors)
    captured = {}
    handles = []
    for index, layer in enumerate(model.model.layers):
        def grab(module, args, kwargs, output, index=index):
            captured[index] = kwargs  # position_embeddings and hidden states for the q recomputation
        handles.append(layer.self_attn.register_forward_hook(grab, with_kwargs=True))
    from relaylens.generation.single import _forward
    try:
        with torch.no_grad():
            _forward(model, question, relocated.coordinates.question_positions(Q), relocated, torch.arange(L, L + Q))
    finally:
        for handle in handles:
            handle.remove()
    import sys
    rows = {}
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        kwargs = captured[index]
        hidden = kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        q = attn.q_proj(hidden).view(1, Q, -1, attn.head_dim).transpose(1, 2)
        k_new = attn.k_proj(hidden).view(1, Q, -1, attn.head_dim).transpose(1, 2)
        apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k_new = apply(q, k_new, cos, sin)
        cache_layer = relocated.cache.layers[index]
        keys, values = cache_layer.keys[0], cache_layer.values[0]  # [kv_head, width + Q, D] after the pass
        width = relocated.widths[index]
        groups = attn.num_key_value_groups
        final_q = q[0, :, -1]  # [q_head, D]
        kv_of = torch.arange(final_q.shape[0]) // groups
        logits = torch.einsum("hd,hkd->hk", final_q, keys[kv_of]) * attn.scaling  # [q_head, width + Q]
        valid = torch.cat((sel.valid[index, :, :width], torch.ones(sel.num_kv_heads, Q, dtype=torch.bool)), -1)[kv_of]
        probs = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1)
        gold = torch.cat((gold_slots(sel, evidence)[index, :, :width],
                          torch.zeros(sel.num_kv_heads, Q, dtype=torch.bool)), -1)[kv_of]
        vec = torch.einsum("hk,hkd->hd", probs * gold, values[kv_of])
        rows[index] = {
            "evidence_share": (probs * gold).sum(-1),
            "history_share": probs[:, :width].sum(-1),
            "evidence_value_norm": vec.norm(dim=-1),
            "evidence_weighted_value": (probs * gold * values[kv_of].norm(dim=-1)).sum(-1),
        }
    return rows


@pytest.mark.parametrize("condition", ["original", "relay", "half_gap"])
def test_readouts_equal_manual_recomputation(condition):
    model, pre, sel, question, evidence = _setup()
    probed = probe_condition(model, pre, sel, condition, question, evidence, max_new_tokens=0)
    manual = _manual(model, pre, sel, question, evidence, condition)
    frame = probed.readouts
    for layer, metrics in manual.items():
        for metric, per_head in metrics.items():
            rows = (frame.layer == layer) & (frame.metric == metric) & (frame.probe_point == "question_final")
            got = frame[rows].sort_values("head")
            assert torch.allclose(torch.tensor(got.value.to_numpy(), dtype=torch.float32), per_head.float(),
                                  atol=1e-6), (layer, metric)


def test_shares_lie_in_unit_interval_and_ranks_are_consistent():
    model, pre, sel, question, evidence = _setup(seed=3)
    frame = probe_condition(model, pre, sel, "relay", question, evidence, max_new_tokens=0, teacher_token=7).readouts
    assert set(frame.probe_point) == {"question_final", "first_answer_token"}
    shares = frame[frame.metric.isin(["evidence_share", "history_share"])]
    assert shares.value.between(0, 1).all()
    wide = frame.pivot_table(index=["probe_point", "layer", "head"], columns="metric", values="value")
    assert (wide.evidence_share <= wide.history_share + 1e-7).all()
    assert (wide.best_gold_rank >= 1).all()


def test_phase_replay_original_reproduces_real_history_share_and_relay_differs():
    model, pre, sel, question, evidence = _setup(seed=4)
    factors = RotaryFactors.from_model(model)
    reference = probe_condition(model, pre, sel, "original", question, evidence, factors=factors, max_new_tokens=0)
    replay = replay_conditions(reference, pre, sel, evidence, ["original", "relay"], Q, factors)
    real = reference.readouts.pivot_table(index=["layer", "head"], columns="metric", values="value")
    history_restricted = real.evidence_share / real.history_share
    gold_share = replay.metric == "replay_gold_share"
    replayed = replay[(replay.condition == "original") & gold_share].set_index(["layer", "head"]).value
    assert (replayed - history_restricted).abs().max() <= 1e-5
    relay = replay[(replay.condition == "relay") & gold_share].set_index(["layer", "head"]).value
    assert (relay - replayed).abs().max() > 1e-3


def test_planted_gold_takes_all_attention():
    """Layer 0's final query is known after one pass (its input is the embedding): plant gold keys along it."""
    model, pre, sel, question, evidence = _setup(seed=5)
    factors = RotaryFactors.from_model(model)
    first = probe_condition(model, pre, sel, "original", question, evidence, factors=factors, max_new_tokens=0)
    query = first.question_recorder.queries[0]  # [q_head, D] post-rotary, layer 0
    groups = pre.num_key_value_groups
    gold = gold_slots(sel, evidence)
    for head in range(pre.num_kv_heads):
        own = query[head * groups : (head + 1) * groups]
        direction = (own / own.norm(dim=-1, keepdim=True)).sum(0)
        kept = sel.positions[0, head][sel.valid[0, head]]
        is_gold = gold[0, head][sel.valid[0, head]]
        pre.keys[0][head, kept[is_gold]] = 1000.0 * direction
        pre.keys[0][head, kept[~is_gold]] = 0.0
    planted = probe_condition(model, pre, sel, "original", question, evidence, factors=factors,
                              max_new_tokens=0).readouts
    share = planted[(planted.layer == 0) & (planted.metric == "evidence_share")].value
    assert share.min() >= 1 - 1e-6
    assert planted[(planted.layer == 0) & (planted.metric == "best_gold_rank")].value.eq(1).all()


def test_record_without_evidence_raises():
    model, pre, sel, question, _ = _setup()
    with pytest.raises(RelaylensError, match="no gold evidence"):
        probe_condition(model, pre, sel, "relay", question, torch.zeros(L, dtype=torch.bool), max_new_tokens=0)
    with pytest.raises(RelaylensError, match="covers"):
        probe_condition(model, pre, sel, "relay", question, torch.ones(L - 1, dtype=torch.bool), max_new_tokens=0)


def test_bands_and_band_aggregates():
    assert bands(30)["early"] == list(range(10)) and bands(30)["late"] == list(range(20, 30))
    assert bands(7, boundaries=(2, 5)) == {"early": [0, 1], "middle": [2, 3, 4], "late": [5, 6]}
    with pytest.raises(RelaylensError):
        bands(6, boundaries=(4, 2))
    rows = []
    for condition, offset in (("original", 0.0), ("relay", 0.1)):
        for layer in range(6):
            for head in range(2):
                rows.append(("r1", condition, layer, head, "evidence_share", 0.1 * layer + offset + 0.01 * head))
    frame = pd.DataFrame(rows, columns=["record", "condition", "layer", "head", "metric", "value"])
    table = band_table(frame, 6, ["record"])
    early = table[(table.condition == "relay") & (table.band == "early")].iloc[0]
    assert early.value == pytest.approx(frame[(frame.condition == "relay") & frame.layer.isin([0, 1])].value.mean())
    assert early.delta_pp == pytest.approx(10.0)
