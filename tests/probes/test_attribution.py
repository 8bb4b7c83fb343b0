"""The differentiable path and evidence attribution, against finite differences and independent forward passes.

* gradcheck (float64) on relocation / rotation, and on a tiny model's question pass through a relocated cache;
* ``evidence_grad_x_input`` against a central finite difference of the answer log-probability when the gold
  states' keys and values of one (layer, kv head) are scaled by ``1 + eps``;
* ``evidence_logit_contribution`` against a forward pass with one layer's gold values zeroed: the change of that
  layer's ``o_proj`` output, pushed through the final norm (scale frozen) onto the answer's unembedding row; the
  norm/unembedding direction itself against the model's own logit;
* the default path stays autograd-free.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.attribution_shared import check_logit_attribution, o_proj_row  # noqa: F401 - shared with the model tier
from transformers import DynamicCache

from relaylens.errors import RelaylensError
from relaylens.generation.single import prefill_from_cache, run_condition
from relaylens.geometry.rotary import (
    RotaryFactors,
    relocate_keys,
    rotate_keys,
    unrotate_keys,
)
from relaylens.geometry.selection import Selection
from relaylens.probes.attribution import ATTRIBUTION_READOUTS
from relaylens.probes.readouts import gold_slots, probe_condition
from relaylens.testing import exact_float64_norms, tiny_model

L, Q = 24, 4
TARGET, NEXT = 17, 23


def _setup(variant: str, dtype=torch.float64, seed: int = 0, keep: int = 8):
    model = tiny_model(variant, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norm gains away from 1 (random init leaves them at exactly 1), so the gain is exercised
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(0.5 + torch.rand(param.shape, generator=gen, dtype=param.dtype))
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    with torch.no_grad():
        out = model(history[None], use_cache=True, cache=DynamicCache())
    pre = prefill_from_cache(history, out.cache, model)
    kept = [[sorted(torch.randperm(L, generator=gen)[: keep + h + l].tolist()) for h in range(pre.num_kv_heads)]
            for l in range(pre.num_layers)]
    evidence = torch.zeros(L, dtype=torch.bool)
    evidence[4:12] = True
    return model, pre, Selection.from_lists(kept, L), question, evidence


# ------------------------------------------------------------------------------------------------ gradcheck
@pytest.mark.parametrize("variant", ["llama_yarn", "qwen2_yarn", "phi_partial", "glm_partial_interleaved", "gemma3"])
def test_relocation_gradcheck_float64(variant):
    factors = RotaryFactors.from_model(tiny_model(variant))
    layer = 2 if factors.per_layer else None
    keys = torch.randn(2, 6, factors.head_dim, dtype=torch.float64, requires_grad=True)
    source = torch.tensor([[0, 3, 9, 10, 40, 900]] * 2)
    target = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 3, 9, 10, 40, 900]])
    assert relocate_keys(keys, source, target, factors, layer).dtype == torch.float64
    for fn in (lambda k: relocate_keys(k, source, target, factors, layer),
               lambda k: rotate_keys(k, source, factors, layer),
               lambda k: unrotate_keys(k, source, factors, layer)):
        assert torch.autograd.gradcheck(fn, (keys,))


def test_default_path_builds_no_graph():
    factors = RotaryFactors.from_model(tiny_model("llama"))
    keys = torch.randn(2, 5, factors.head_dim, requires_grad=True)
    with torch.no_grad():
        assert not relocate_keys(keys, torch.arange(5), torch.arange(5) + 3, factors).requires_grad
    assert not relocate_keys(keys.detach(), torch.arange(5), torch.arange(5) + 3, factors).requires_grad
    model, pre, sel, question, _ = _setup("llama", dtype=torch.float32)
    result = run_condition(model, pre, sel, "relay", question, max_new_tokens=2, teacher_token=TARGET)
    assert not result.last_logits.requires_grad and result.inputs is None and result.head_inputs is None
    graded = run_condition(model, pre, sel, "relay", question, max_new_tokens=2, teacher_token=TARGET, grad=True)
    assert graded.question_logits.requires_grad and graded.teacher_logits.requires_grad
    assert graded.token_ids == result.token_ids
    assert torch.allclose(graded.last_logits, result.last_logits, atol=1e-5)


@pytest.mark.parametrize("variant", ["llama_yarn", "phi_partial", "gemma3"])
def test_question_pass_gradcheck_through_relocated_cache(variant):
    """Logits of the question pass and the teacher-forced token w.r.t. the prefill keys/values of one layer."""
    model, pre, sel, question, _ = _setup(variant)
    layer = pre.num_layers - 1
    factors = RotaryFactors.from_model(model)
    keys, values = pre.keys[layer].clone().requires_grad_(), pre.values[layer].clone().requires_grad_()

    def logits(k, v):
        swapped = dataclasses.replace(pre, keys=pre.keys[:layer] + [k], values=pre.values[:layer] + [v])
        out = run_condition(model, swapped, sel, "relay", question, max_new_tokens=0, factors=factors,
                            teacher_token=TARGET, grad=True)
        return out.question_logits[:, :12], out.teacher_logits[:12]

    with exact_float64_norms(model):
        assert torch.autograd.gradcheck(logits, (keys, values), fast_mode=True)


# ------------------------------------------------------------------------------------- gradient x input vs FD
def _scaled_gold(pre, sel, gold, layer, kv_head, factor):
    """The prefill with the gold retained states of (layer, kv_head) scaled by ``factor`` (keys and values)."""
    positions = sel.positions[layer, kv_head][gold[layer, kv_head]]
    keys, values = pre.keys[layer].clone(), pre.values[layer].clone()
    keys[kv_head, positions] *= factor
    values[kv_head, positions] *= factor
    swap = lambda items, new: items[:layer] + [new] + items[layer + 1:]  # noqa: E731
    return dataclasses.replace(pre, keys=swap(pre.keys, keys), values=swap(pre.values, values))


@pytest.mark.parametrize(("variant", "condition"),
                         [("llama", "relay"), ("qwen2_yarn", "half_gap"), ("gemma3", "original")])
def test_grad_x_input_matches_finite_differences(variant, condition):
    model, pre, sel, question, evidence = _setup(variant)
    gold = gold_slots(sel, evidence)
    groups = pre.num_key_value_groups
    with exact_float64_norms(model):
        probed = probe_condition(model, pre, sel, condition, question, evidence, teacher_token=TARGET,
                                 next_answer_token=NEXT, grad=True, max_new_tokens=0)
        table = probed.readouts.set_index(["probe_point", "layer", "head", "metric"])["value"]
        eps = 1e-5
        checked = 0
        for layer in range(pre.num_layers):
            for kv_head in range(pre.num_kv_heads):
                if not bool(gold[layer, kv_head].any()):
                    continue
                logp = {}
                for sign in (1, -1):
                    scaled = _scaled_gold(pre, sel, gold, layer, kv_head, 1 + sign * eps)
                    out = run_condition(model, scaled, sel, condition, question, max_new_tokens=0, teacher_token=TARGET,
                                        grad=True)
                    logp[sign] = (torch.log_softmax(out.question_logits[-1].detach(), -1)[TARGET],
                                  torch.log_softmax(out.teacher_logits.detach(), -1)[NEXT])
                for index, point in enumerate(("question_final", "first_answer_token")):
                    fd = float(logp[1][index] - logp[-1][index]) / (2 * eps)
                    heads = range(kv_head * groups, (kv_head + 1) * groups)
                    attributed = sum(table[(point, layer, h, "evidence_grad_x_input")] for h in heads)
                    assert attributed == pytest.approx(fd, rel=1e-5, abs=1e-9), (point, layer, kv_head)
                    checked += 1
    assert checked >= 4


@pytest.mark.parametrize("variant", ["llama", "gemma3"])
def test_logit_attribution_matches_zeroed_values_forward(variant):
    model, pre, sel, question, evidence = _setup(variant, dtype=torch.float32)
    pairs, table = check_logit_attribution(model, pre, sel, question, evidence, "relay", TARGET, range(pre.num_layers))
    for layer, (attributed, predicted) in pairs.items():
        assert attributed == pytest.approx(predicted, rel=1e-3, abs=1e-5), layer
    assert any(abs(a) > 1e-4 for a, _ in pairs.values())
    assert set(ATTRIBUTION_READOUTS) - {"evidence_grad_x_input_share"} <= set(table.index.get_level_values("metric"))


def test_share_lies_in_unit_interval_and_grad_needs_a_target():
    model, pre, sel, question, evidence = _setup("llama", dtype=torch.float32)
    probed = probe_condition(model, pre, sel, "relay", question, evidence, teacher_token=TARGET, grad=True,
                             max_new_tokens=0)
    share = probed.readouts[probed.readouts.metric == "evidence_grad_x_input_share"]["value"]
    assert len(share) and share.between(0, 1).all()
    assert set(probed.readouts.probe_point) == {"question_final", "first_answer_token"}
    with pytest.raises(RelaylensError, match="teacher_token"):
        probe_condition(model, pre, sel, "relay", question, evidence, grad=True)


