"""Real-valued positions inside real models: the family's points give the logits (and tokens) of original, relay
and key_only on tiny models of every rope variant; a fractional common shift of keys, question and generated tokens
changes nothing; a compacted prefill (kept states only) builds the same caches; gradients w.r.t. the family's
parameters and the question start pass gradcheck in float64; answer_log_probs agrees with the question pass."""

from __future__ import annotations

import pytest
import torch

from relaylens.conditions.catalogue import Coordinates
from relaylens.conditions.family import family_coordinates, family_point
from relaylens.errors import ShapeError
from relaylens.generation.cache import build_cache, keep_selected
from relaylens.generation.rows import Row, run_rows
from relaylens.generation.single import answer_log_probs, frozen_weights, prefill_from_cache, run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.hf import new_cache
from relaylens.testing import NOPE_VARIANTS, ROPE_VARIANTS, exact_float64_norms, tiny_model

L = 48
QUESTION = torch.tensor([50, 51, 52, 53])
ANSWER = torch.tensor([7, 8, 9])


def _setup(variant: str, dtype=torch.float32, length: int = L):
    model = tiny_model(variant, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    history = torch.randint(3, model.config.vocab_size, (length,), generator=gen)
    with torch.no_grad():
        pre = prefill_from_cache(history, model(history[None], use_cache=True, cache=new_cache()).cache, model)
    keep = [[sorted(torch.randperm(length, generator=gen)[: 3 + 4 * h + l].tolist()) for h in range(pre.num_kv_heads)]
            for l in range(pre.num_layers)]
    return model, pre, Selection.from_lists(keep, length)


@pytest.mark.parametrize("variant", ROPE_VARIANTS + NOPE_VARIANTS)
def test_family_points_reproduce_the_conditions(variant):
    """Logits of the final question token within 1e-5 (measured <= 3e-7), the same greedy tokens, and the same
    caches from a compacted prefill."""
    model, pre, sel = _setup(variant)
    compact = keep_selected(pre, sel)
    for name in ("original", "relay", "key_only"):
        family = family_coordinates(sel, *family_point(name, sel), label="family")
        assert family.key_positions.dtype == torch.float64
        want = run_condition(model, pre, sel, name, QUESTION, max_new_tokens=3, eos_token_ids=set())
        got = run_condition(model, pre, sel, family, QUESTION, max_new_tokens=3, eos_token_ids=set())
        again = run_condition(model, compact, sel, family, QUESTION, max_new_tokens=3, eos_token_ids=set())
        assert got.question_start == want.question_start and got.token_ids == want.token_ids, (variant, name)
        assert float((got.last_logits - want.last_logits).abs().max()) <= 1e-5, (variant, name)
        assert torch.equal(again.last_logits, got.last_logits)


def test_fractional_common_shift_changes_nothing():
    """Keys, question and generated tokens all 0.37 further: every distance is unchanged, so are the logits (the
    question's real-valued phases come from the same factors as the keys')."""
    for variant in ("llama_yarn", "phi_partial", "cohere_interleaved", "gemma3"):
        model, pre, sel = _setup(variant)
        relay = family_coordinates(sel, *family_point("relay", sel))
        shifted = Coordinates("shifted", torch.where(sel.valid, relay.key_positions + 0.37, -1.0),
                              relay.question_start + 0.37)
        assert shifted.real and shifted.question_positions(2).dtype == torch.float64
        want = run_condition(model, pre, sel, "relay", QUESTION, max_new_tokens=4, eos_token_ids=set())
        got = run_condition(model, pre, sel, shifted, QUESTION, max_new_tokens=4, eos_token_ids=set())
        assert float((got.last_logits - want.last_logits).abs().max()) <= 1e-4, variant
        assert got.token_ids == want.token_ids and got.positions[0] == pytest.approx(want.positions[0] + 0.37)
        batched = run_rows(model, pre, [Row(sel, "relay"), Row(sel, shifted)], QUESTION, max_new_tokens=4,
                           eos_token_ids=set())
        assert batched[1].token_ids == want.token_ids and batched[0].token_ids == want.token_ids


def test_answer_log_probs_agree_with_the_question_pass():
    model, pre, sel = _setup("llama")
    result = run_condition(model, pre, sel, "relay", QUESTION, max_new_tokens=0, teacher_token=int(ANSWER[0]))
    log_probs = answer_log_probs(model, pre, sel, "relay", QUESTION, ANSWER)
    assert log_probs.shape == (3,)
    assert float(log_probs[0]) == pytest.approx(float(torch.log_softmax(result.last_logits, -1)[ANSWER[0]]), abs=1e-5)
    assert float(log_probs[1]) == pytest.approx(float(torch.log_softmax(result.teacher_logits, -1)[ANSWER[1]]),
                                                abs=1e-5)
    with pytest.raises(ShapeError, match="at least one answer token"):
        answer_log_probs(model, pre, sel, "relay", QUESTION, torch.tensor([], dtype=torch.long))


# every rope family through a float64 model (interleaved: GLM). Cohere's own apply_rotary_pos_emb rounds through
# float32, so finite differences cannot resolve it in a model; its layout is gradchecked at the relocation level
# (tests/geometry/test_real.py).
GRAD_VARIANTS = ["llama", "llama_yarn", "llama3", "qwen2_yarn", "phi_partial", "glm_partial_interleaved", "gemma3",
                 "smollm3_nope"]


@pytest.mark.parametrize("variant", GRAD_VARIANTS)
def test_gradcheck_in_the_family_parameters_and_the_question_start(variant):
    model, pre, sel = _setup(variant, dtype=torch.float64, length=24)
    factors = RotaryFactors.from_model(model)
    with exact_float64_norms(model), frozen_weights(model):
        def in_parameters(b, s, alpha):
            coords = family_coordinates(sel, b, s, alpha)
            return answer_log_probs(model, pre, sel, coords, QUESTION[:2], ANSWER[:2], factors)

        params = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (2.3, 0.7, 0.4)]
        assert torch.autograd.gradcheck(in_parameters, params, eps=1e-6, atol=1e-6, rtol=1e-4)
        keys = torch.where(sel.valid, sel.positions.double() * 0.5 + 0.25, -1.0)

        def in_question_start(start):
            return answer_log_probs(model, pre, sel, Coordinates("c", keys, start), QUESTION[:2], ANSWER[:2], factors)

        start = torch.tensor(30.3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(in_question_start, (start,), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_positions_that_require_grad_relocate_every_head_and_integer_paths_build_no_graph():
    model, pre, sel = _setup("llama")
    b = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    point = family_point("original", sel)
    coords = family_coordinates(sel, point[0] + (b - 1.0), point[1], point[2])  # original, b differentiable
    relocated = build_cache(pre, sel, coords, RotaryFactors.from_model(model))
    assert all(layer.keys.requires_grad for layer in relocated.cache.layers)  # no head skipped as "not moving"
    plain = build_cache(pre, sel, "original", RotaryFactors.from_model(model))
    assert not any(layer.keys.requires_grad for layer in plain.cache.layers)
    assert torch.equal(relocated.cache.layers[0].keys.detach(), plain.cache.layers[0].keys)
