"""Hugging Face ``generate()`` over a relocated cache equals relaylens's own decoding, token for token and logit for
logit, for every condition of the catalogue on a tiny model of each rope family; bad input is refused in one line
before any model work.

The reference is relaylens's batched decoding path: :func:`relaylens.run_condition` (one row of ``run_rows``) for
the tokens, and the same path's per-step forward (``forward_rows``, what ``decode_steps`` calls) for the logits of
every step. ``generate()`` runs with ``output_logits=True`` (raw logits, before any processor).
"""

from __future__ import annotations

import pytest
import torch

from relaylens.errors import PositionError, RelaylensError, RopeError
from relaylens.generation.cache import relocate_selection
from relaylens.generation.rows import forward_rows, stack_rows
from relaylens.generation.single import run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.integrations import relay_generate, relay_inputs, select_history
from relaylens.testing import ROPE_VARIANTS, tiny_model, tiny_tokenizer

CONDITIONS = ("original", "relay", "rank_sync", "key_only", "query_only(64)", "common_shift(64)", "compaction(0.25)",
              "half_gap", "score_order", "reverse_order", "random_order(0)", "random_order(1)", "relay@layers=0",
              "relay@band=late@base=key_only")
STEPS = 6


def relaylens_decoding(model, prefill, selection, condition, question: torch.Tensor, steps: int = STEPS):
    """``(tokens, per-step logits [steps, vocab])`` of relaylens's own greedy decoding (no EOS)."""
    reference = run_condition(model, prefill, selection, condition, question, max_new_tokens=steps, eos_token_ids=set())
    factors = RotaryFactors.from_model(model)
    batch = stack_rows([relocate_selection(prefill, selection, condition, factors)])
    batch.factors = factors
    start, length, history = reference.question_start, question.numel(), prefill.history_length
    logits = [forward_rows(model, batch, question[None], (start + torch.arange(length))[None],
                           (history + torch.arange(length))[None])[0, -1]]
    for step, token in enumerate(reference.token_ids[:-1]):
        logits.append(forward_rows(model, batch, torch.tensor([[token]]), torch.tensor([[start + length + step]]),
                                   torch.tensor([[history + length + step]]))[0, -1])
    logits = torch.stack(logits)  # [steps, vocab]
    assert logits.argmax(-1).tolist() == reference.token_ids  # the per-step path is the decoding itself
    return reference.token_ids, logits


def hf_generate(model, prefill, selection, condition, question: torch.Tensor, steps: int = STEPS):
    """``(tokens, per-step raw logits [steps, vocab])`` of ``model.generate()`` inside :func:`relay_inputs`."""
    with relay_inputs(model, prefill, selection, condition, question, max_new_tokens=steps) as inputs:
        out = model.generate(**inputs.generate_kwargs(), max_new_tokens=steps, do_sample=False, eos_token_id=None,
                             pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    return out.sequences[0, question.numel():].tolist(), torch.stack([step[0] for step in out.logits]).float()


def compare(model, prefill, selection, question, conditions=CONDITIONS) -> dict[str, tuple[float, float]]:
    """Per condition: ``(max |logit difference| over every step, token agreement)``."""
    figures = {}
    for condition in conditions:
        tokens, logits = relaylens_decoding(model, prefill, selection, condition, question)
        generated, generated_logits = hf_generate(model, prefill, selection, condition, question)
        agreement = sum(a == b for a, b in zip(tokens, generated)) / max(len(tokens), len(generated))
        figures[condition] = (float((logits - generated_logits).abs().max()), agreement)
    return figures


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
def test_generate_equals_relaylens_decoding_for_every_condition(variant):
    """AdaKV: uneven per-head budgets (ragged, validity-masked slots); PyramidKV uneven per-layer budgets on gemma3
    (one kv head), which adds sliding windows on condition coordinates; phi / glm partial rotary, cohere / glm
    interleaved rotary, yarn an amplitude."""
    model = tiny_model(variant)
    torch.manual_seed(1)
    history, question = torch.randint(3, 380, (96,)), torch.randint(3, 380, (5,))
    selector = "adakv" if model.config.num_key_value_heads > 1 else "pyramidkv"
    prefill, selection = select_history(model, history, selector, 0.25, selector_options={"window": 8})
    assert len({int(c) for c in selection.counts.flatten()}) > 1, "the selection should be ragged"
    figures = compare(model, prefill, selection, question)
    worst = max(diff for diff, _ in figures.values())
    assert all(agreement == 1.0 for _, agreement in figures.values()), figures
    assert worst <= 1e-5, figures


def test_question_and_answer_positions_are_the_conditions():
    """relay: question at M .. M+Q-1, answers from M+Q (not the cache length, not L); query_only: from L + shift."""
    model = tiny_model("llama")
    history, question = torch.arange(3, 83), torch.tensor([90, 91, 92])
    prefill, selection = select_history(model, history, "adakv", 0.25, selector_options={"window": 8})
    m = selection.max_count
    for condition, start in (("relay", m), ("original", 80), ("query_only(64)", 144)):
        with relay_inputs(model, prefill, selection, condition, question, max_new_tokens=4) as inputs:
            model.generate(**inputs.generate_kwargs(), max_new_tokens=4, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
        assert inputs.state.new_positions[0].tolist() == list(range(start, start + 3 + 3)), condition
        assert inputs.state.new_source_positions[0].tolist() == list(range(80, 86))
    assert inputs.cache.get_seq_length() < 80  # generate() would have started at this length without positions


def test_eos_stops_both_at_the_same_token():
    model = tiny_model("qwen2")
    torch.manual_seed(2)
    history, question = torch.randint(3, 380, (64,)), torch.randint(3, 380, (4,))
    prefill, selection = select_history(model, history, "snapkv", 0.5, selector_options={"window": 8})
    free = run_condition(model, prefill, selection, "relay", question, max_new_tokens=8, eos_token_ids=set()).token_ids
    stop = free[3]
    ours = run_condition(model, prefill, selection, "relay", question, max_new_tokens=8, eos_token_ids={stop})
    with relay_inputs(model, prefill, selection, "relay", question, max_new_tokens=8) as inputs:
        out = model.generate(**inputs.generate_kwargs(), max_new_tokens=8, do_sample=False, eos_token_id=stop,
                             pad_token_id=0)
    assert out[0, question.numel():].tolist() == ours.token_ids == free[: free.index(stop) + 1]


def test_relay_generate_text_equals_run_condition():
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    history = "user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name! " * 4
    question = "Question: What is the name of my dog?\nAnswer:"
    text = relay_generate(model, tokenizer, history, question, "snapkv", 0.5, "relay", selector_options={"window": 8},
                          max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    history_ids = torch.tensor(tokenizer(history)["input_ids"])
    question_ids = torch.tensor(tokenizer(question, add_special_tokens=False)["input_ids"])
    prefill, selection = select_history(model, history_ids, "snapkv", 0.5, selector_options={"window": 8})
    ours = run_condition(model, prefill, selection, "relay", question_ids, max_new_tokens=6, eos_token_ids=set())
    assert text == tokenizer.decode(ours.token_ids, skip_special_tokens=True)


def test_relay_generate_with_a_rendered_prompt_and_bm25():
    """BM25 reads the rendered prompt's sessions and question; the prompt's question is used when none is given."""
    from relaylens.datasets import bundled_sample_path, load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.selectors import make_selector

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    prompt = render_prompt(load_records(bundled_sample_path())[0], tokenizer, mode="completion")
    text = relay_generate(model, tokenizer, prompt, None, "bm25", 0.1, "relay", max_new_tokens=4, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    prefill, selection = select_history(model, prompt.history_ids, make_selector("bm25"), 0.1, prompt)
    ours = run_condition(model, prefill, selection, "relay", prompt.question_ids, max_new_tokens=4, eos_token_ids=set())
    assert text == tokenizer.decode(ours.token_ids, skip_special_tokens=True)
    with pytest.raises(RelaylensError, match="reads the rendered prompt"):
        relay_generate(model, tokenizer, "some history " * 20, "q", "bm25", 0.1, max_new_tokens=2)


class CountingForward:
    """Counts forward calls of a model (a refusal must come before any)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and "Fix" in message, message
    return message


def test_a_model_without_rotary_embeddings_is_refused_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=384, n_positions=256)).eval()
    counter = CountingForward(model)
    with pytest.raises(RopeError) as err:
        relay_generate(model, tiny_tokenizer(), "a history " * 20, "a question", "snapkv", 0.5, max_new_tokens=2)
    assert "GPT2LMHeadModel" in _one_line(err) and counter.calls == 0


@pytest.mark.parametrize("condition", ["RandomMean", "phase_replay", "replay:relay"])
def test_a_condition_that_needs_probes_is_refused_in_one_line(condition):
    model = tiny_model("llama")
    counter = CountingForward(model)
    with pytest.raises(RelaylensError, match="needs probes, not generate") as err:
        relay_generate(model, tiny_tokenizer(), "a history " * 20, "a question", "snapkv", 0.5, condition,
                       max_new_tokens=2)
    assert "\n" not in str(err.value) and counter.calls == 0


def test_positions_past_the_rotary_range_are_refused_before_decoding():
    model = tiny_model("llama", max_position_embeddings=128)
    prefill, selection = select_history(model, torch.arange(3, 83), "snapkv", 0.5, selector_options={"window": 8})
    counter = CountingForward(model)
    with pytest.raises(PositionError, match="past what this model's rotary supports"):
        with relay_inputs(model, prefill, selection, "query_only(40)", torch.tensor([5, 6]), max_new_tokens=8):
            pass
    assert counter.calls == 0
    with relay_inputs(model, prefill, selection, "relay", torch.tensor([5, 6]), max_new_tokens=8):
        pass  # relay's compact coordinates fit where query_only's do not


def test_the_attention_function_is_active_inside_the_block_only():
    from relaylens.model.hf import attention_kernel_name

    model = tiny_model("llama")
    prefill, selection = select_history(model, torch.arange(3, 43), "streaming", 0.5)
    with relay_inputs(model, prefill, selection, "relay", torch.tensor([5, 6]), max_new_tokens=2) as inputs:
        assert attention_kernel_name(model) == "relaylens"
        model.generate(**inputs.generate_kwargs(), max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)
        with pytest.raises(PositionError, match="one generate\\(\\) call per relay_inputs block"):
            model.generate(**inputs.generate_kwargs(), max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert attention_kernel_name(model) == "sdpa"
    assert not model._forward_pre_hooks  # the position recorder is gone too


def test_generate_is_unchanged_under_kvpress_wrapping_the_attention_functions():
    """``import kvpress`` wraps every registered attention function and calls it with ``dropout`` as the sixth
    positional argument; relaylens's function takes that order, so a kvpress user's process decodes the same."""
    from transformers import AttentionInterface

    from relaylens.generation.attention import ATTENTION_NAME, relaylens_attention
    from relaylens.model.hf import preserved_attention_functions

    model = tiny_model("llama")
    torch.manual_seed(3)
    prefill, selection = select_history(model, torch.randint(3, 380, (64,)), "adakv", 0.5,
                                        selector_options={"window": 8})
    question = torch.randint(3, 380, (4,))
    plain = hf_generate(model, prefill, selection, "relay", question)

    def kvpress_style(module, query, key, value, attention_mask, dropout, **kwargs):
        return relaylens_attention(module, query, key, value, attention_mask, dropout, **kwargs)

    with preserved_attention_functions():
        AttentionInterface.register(ATTENTION_NAME, kvpress_style)
        wrapped = hf_generate(model, prefill, selection, "relay", question)
    assert wrapped[0] == plain[0] and torch.equal(wrapped[1], plain[1])
