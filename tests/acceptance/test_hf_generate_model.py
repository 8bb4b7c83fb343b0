"""Hugging Face ``generate()`` over a relocated cache on the real embedded SmolLM2: token for token and logit for
logit equal to relaylens's own decoding, for every condition of the catalogue (SnapKV 10% of a 1,000-token history
of a bundled record)."""

from __future__ import annotations

import pytest
import torch

from relaylens.generation.cache import relocate_selection
from relaylens.generation.rows import forward_rows, stack_rows
from relaylens.generation.single import run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.integrations import relay_generate, relay_inputs, select_history

pytestmark = [pytest.mark.model, pytest.mark.slow]

CONDITIONS = ("original", "relay", "rank_sync", "key_only", "query_only(2048)", "common_shift(2048)",
              "compaction(0.5)", "half_gap", "score_order", "reverse_order", "random_order(0)", "relay@band=late")
STEPS = 8


@pytest.fixture(scope="module")
def real_case(smollm2):
    from relaylens.datasets import bundled_sample_path, load_records
    from relaylens.datasets.prompting import render_prompt

    model, tokenizer = smollm2
    prompt = render_prompt(load_records(bundled_sample_path())[0], tokenizer, mode="completion")
    history = prompt.history_ids[:1000]
    prefill, selection = select_history(model, history, "snapkv", 0.1)
    return model, tokenizer, prompt, prefill, selection


def _reference(model, prefill, selection, condition, question):
    """Tokens and per-step logits ``[STEPS, vocab]`` of relaylens's batched decoding path (no EOS)."""
    result = run_condition(model, prefill, selection, condition, question, max_new_tokens=STEPS, eos_token_ids=set())
    factors = RotaryFactors.from_model(model)
    batch = stack_rows([relocate_selection(prefill, selection, condition, factors)])
    batch.factors = factors
    start, length, history = result.question_start, question.numel(), prefill.history_length
    logits = [forward_rows(model, batch, question[None], (start + torch.arange(length))[None],
                           (history + torch.arange(length))[None])[0, -1]]
    for step, token in enumerate(result.token_ids[:-1]):
        logits.append(forward_rows(model, batch, torch.tensor([[token]]), torch.tensor([[start + length + step]]),
                                   torch.tensor([[history + length + step]]))[0, -1])
    return result.token_ids, torch.stack(logits)


def test_generate_equals_relaylens_decoding_for_every_condition_on_smollm2(real_case):
    model, tokenizer, prompt, prefill, selection = real_case
    question = prompt.question_ids
    figures = {}
    for condition in CONDITIONS:
        tokens, logits = _reference(model, prefill, selection, condition, question)
        with relay_inputs(model, prefill, selection, condition, question, max_new_tokens=STEPS) as inputs:
            out = model.generate(**inputs.generate_kwargs(), max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                                 pad_token_id=tokenizer.pad_token_id or 0, return_dict_in_generate=True,
                                 output_logits=True)
        generated = out.sequences[0, question.numel():].tolist()
        difference = float((torch.stack([s[0] for s in out.logits]).float() - logits).abs().max())
        figures[condition] = (difference, generated == tokens)
    print("max |logit difference| per condition over", STEPS, "steps, tokens equal:", figures)
    assert all(same for _, same in figures.values()), figures
    assert max(difference for difference, _ in figures.values()) <= 1e-4, figures


def test_relay_generate_text_on_smollm2(real_case):
    model, tokenizer, prompt, prefill, selection = real_case
    history_text = tokenizer.decode(prompt.history_ids[:1000])
    ours = run_condition(model, prefill, selection, "relay", prompt.question_ids, max_new_tokens=STEPS,
                         eos_token_ids=set())
    text = relay_generate(model, tokenizer, prompt.history_ids[:1000], prompt.question_ids, "snapkv", 0.1, "relay",
                          max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                          pad_token_id=tokenizer.pad_token_id or 0)
    assert text == tokenizer.decode(ours.token_ids, skip_special_tokens=True)
    assert history_text  # the history is real text (the bundled record), not ids drawn at random
