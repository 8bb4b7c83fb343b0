"""Runtime exactness on the real embedded SmolLM2 (a ~1,000-token history of a bundled record)."""

from __future__ import annotations

import pytest
import torch

from relaylens.generation.single import run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import prefill_history

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def real_case(smollm2):
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import bundled_sample_path

    model, tokenizer = smollm2
    prompt = render_prompt(load_records(bundled_sample_path())[0], tokenizer, mode="completion")
    history = prompt.history_ids[:1000]
    prefill = prefill_history(model, history)
    return model, tokenizer, history, prompt.question_ids, prefill


def test_keep_all_original_matches_full_forward_and_generate(real_case):
    model, tokenizer, history, question, prefill = real_case
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    result = run_condition(model, prefill, full, "original", question, max_new_tokens=8, eos_token_ids=set(),
                           keep_question_logits=True)
    prompt = torch.cat((history, question))[None]
    with torch.no_grad():
        reference = model(prompt).logits[0, history.numel():].float()
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                                   eos_token_id=None, pad_token_id=tokenizer.pad_token_id or 0)
    assert float((result.question_logits - reference).abs().max()) <= 1e-4
    assert result.token_ids == generated[0, prompt.shape[1]:].tolist()


def test_keep_all_relay_equals_original_and_a_real_selection_moves_the_answer_logits(real_case):
    model, _, _, question, prefill = real_case
    factors = RotaryFactors.from_model(model)
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    relay = run_condition(model, prefill, full, "relay", question, max_new_tokens=0, factors=factors)
    original = run_condition(model, prefill, full, "original", question, max_new_tokens=0, factors=factors)
    assert float((relay.last_logits - original.last_logits).abs().max()) <= 1e-4
    sparse = Selection.from_lists([[list(range(0, 1000, 9))] * prefill.num_kv_heads] * prefill.num_layers,
                                  prefill.history_length)
    sparse_original = run_condition(model, prefill, sparse, "original", question, max_new_tokens=0, factors=factors)
    sparse_relay = run_condition(model, prefill, sparse, "relay", question, max_new_tokens=0, factors=factors)
    assert float((sparse_relay.last_logits - sparse_original.last_logits).abs().max()) > 1e-2
