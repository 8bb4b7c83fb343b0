"""Helpers shared by tests/.../test_attribution.py and its model tier (not a test module)."""

from __future__ import annotations

import dataclasses

import pytest

from relaylens.generation.single import run_condition
from relaylens.model.hf import decoder_layers
from relaylens.probes.attribution import (
    final_residuals,
    logit_direction,
)
from relaylens.probes.readouts import gold_slots, probe_condition

# ------------------------------------------------------------------------------ direct logit attribution checks


def o_proj_row(model, layer, run):
    """Run ``run()``; return the last position's ``o_proj`` output of ``layer`` in its first forward."""
    rows = []
    handle = decoder_layers(model)[layer].self_attn.o_proj.register_forward_hook(
        lambda module, args, output: rows.append(output[0, -1].detach().double().clone()))
    try:
        run()
    finally:
        handle.remove()
    return rows[0]


def check_logit_attribution(model, pre, sel, question, evidence, condition, target, layers):
    """Per layer: (attributed, predicted) logit change of zeroing the gold values of that layer (question_final)."""
    gold = gold_slots(sel, evidence)
    probed = probe_condition(model, pre, sel, condition, question, evidence, teacher_token=target, grad=True,
                             max_new_tokens=0)
    table = probed.readouts.set_index(["probe_point", "layer", "head", "metric"])["value"]
    with final_residuals(model) as residuals:
        plain = run_condition(model, pre, sel, condition, question, max_new_tokens=0)
    direction = logit_direction(model, target, residuals[0]).double()
    # the frozen-norm direction reproduces the model's own logit of the target
    assert float(direction @ residuals[0].double()) == pytest.approx(float(plain.last_logits[target]), rel=1e-4,
                                                                     abs=1e-4)
    pairs = {}
    for layer in layers:
        values = pre.values[layer].clone()
        for kv_head in range(pre.num_kv_heads):
            values[kv_head, sel.positions[layer, kv_head][gold[layer, kv_head]]] = 0.0
        zeroed = dataclasses.replace(pre, values=pre.values[:layer] + [values] + pre.values[layer + 1:])
        before = o_proj_row(model, layer, lambda: run_condition(model, pre, sel, condition, question, max_new_tokens=0))
        after = o_proj_row(model, layer,
                           lambda: run_condition(model, zeroed, sel, condition, question, max_new_tokens=0))
        heads = range(model.config.num_attention_heads)
        attributed = sum(table[("question_final", layer, h, "evidence_logit_contribution")] for h in heads)
        pairs[layer] = (attributed, float(direction @ (before - after)))
    return pairs, table
