"""Issue 52, items 10, 12 and 13: ``generate()`` inside :func:`relay_inputs` is held to the rotary range on every
call, ``stop_strings`` work through :func:`relay_generate`, and what one relocated cache cannot serve (beam search,
several return sequences, ``use_cache=False``, ``inputs_embeds``, float token ids) is refused in one line that names
it."""

from __future__ import annotations

import pytest
import torch

from relaylens.errors import PositionError, RelaylensError, ShapeError
from relaylens.integrations import relay_generate, relay_inputs, select_history
from relaylens.testing import tiny_model, tiny_tokenizer

WINDOW = {"window": 8}


@pytest.fixture(scope="module")
def short_model():
    """A tiny Llama whose rotary range is 128 positions, a 120-token history selected once."""
    model = tiny_model("llama", max_position_embeddings=128)
    gen = torch.Generator().manual_seed(1)
    history, question = torch.randint(3, 380, (120,), generator=gen), torch.randint(3, 380, (5,), generator=gen)
    prefill, selection = select_history(model, history, "snapkv", 0.5, selector_options=WINDOW)
    return model, history, question, prefill, selection


def _calls(model) -> list:
    """Every model call's ``position_ids`` (a forward pre-hook the caller removes)."""
    seen: list = []
    handle = model.register_forward_pre_hook(lambda m, a, k: seen.append(k.get("position_ids")), with_kwargs=True)
    return seen, handle


# ------------------------------------------------------------------------------------------------ item 10


def test_generate_with_the_default_limit_is_stopped_at_the_rotary_range(short_model):
    """relay_inputs left at max_new_tokens=0 (its default) and generate() asked for 20 tokens under ``original``
    (question at 120 .. 124): the call at position 128 is refused before it runs, so no key or query is ever
    rotated past the model's range."""
    model, _, question, prefill, selection = short_model
    seen, handle = _calls(model)
    try:
        with pytest.raises(PositionError, match=r"max_position_embeddings=128.*at most 3 tokens fit") as err:
            with relay_inputs(model, prefill, selection, "original", question) as inputs:
                model.generate(**inputs.generate_kwargs(), max_new_tokens=20, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
    finally:
        handle.remove()
    assert "\n" not in str(err.value)
    ran = torch.cat([p.reshape(-1) for p in seen[:-1]])  # the refused call never reached the model
    assert int(ran.max()) == 127 and int(seen[-1].max()) == 128
    assert int(inputs.state.new_positions.max()) == 127


def test_generation_that_fits_the_range_still_runs(short_model):
    model, _, question, prefill, selection = short_model
    with relay_inputs(model, prefill, selection, "original", question) as inputs:
        out = model.generate(**inputs.generate_kwargs(), max_new_tokens=4, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    assert out.shape[1] == question.numel() + 4 and int(inputs.state.new_positions.max()) == 127  # last one not fed


# ------------------------------------------------------------------------------------------------ item 12


def test_stop_strings_stop_where_generate_would():
    """``stop_strings`` with ``tokenizer=`` (generate()'s own idiom) or without it: the answer is the unstopped
    answer cut at the stop string."""
    model, tokenizer = tiny_model("llama", seed=4), tiny_tokenizer()
    gen = torch.Generator().manual_seed(3)
    history, question = torch.randint(3, 380, (64,), generator=gen), torch.randint(3, 380, (4,), generator=gen)
    common = dict(selector="snapkv", budget=0.5, selector_options=WINDOW, do_sample=False, eos_token_id=None,
                  pad_token_id=0)
    full = relay_generate(model, tokenizer, history, question, max_new_tokens=12, **common)
    token_texts = [tokenizer.decode([t]) for t in tokenizer(full, add_special_tokens=False)["input_ids"]]
    stop = next(text for text in token_texts[2:] if text.strip().isalnum() and text.isascii())
    for extra in ({"tokenizer": tokenizer}, {}):
        stopped = relay_generate(model, tokenizer, history, question, max_new_tokens=12, stop_strings=[stop],
                                 **common, **extra)
        assert full.startswith(stopped) and stop in stopped and len(stopped) < len(full), (full, stop, stopped)
        assert len(stopped) - (stopped.find(stop) + len(stop)) < len(stop) + 8  # cut right after the stop string
    keywords = relay_generate(model=model, tokenizer=tokenizer, history=history, question=question,
                              max_new_tokens=12, **common)
    assert keywords == full
    with pytest.raises(ShapeError, match="two different tokenizers"):
        relay_generate(model, tokenizer, history, question, tokenizer=tiny_tokenizer(), max_new_tokens=2)


# ------------------------------------------------------------------------------------------------ item 13

REFUSALS = [
    (dict(num_beams=2), r"decodes 2 rows at once \(num_beams > 1 or num_return_sequences > 1"),
    (dict(num_return_sequences=3, do_sample=True), r"decodes 3 rows at once \(num_beams > 1 or num_return_sequences"),
    (dict(use_cache=False), r"use_cache=False.*Fix: leave use_cache at its default"),
]


@pytest.mark.parametrize(("options", "message"), REFUSALS)
def test_generate_options_one_cache_cannot_serve_are_named(short_model, options, message):
    """Inside relay_inputs the refusal names the option (not a position mismatch); relay_generate refuses the same
    options before any model work."""
    model, history, question, prefill, selection = short_model
    kwargs = {"do_sample": False, "pad_token_id": 0, "max_new_tokens": 2, **options}
    with pytest.raises(RelaylensError, match=message) as err:
        with relay_inputs(model, prefill, selection, "relay", question) as inputs:
            model.generate(**inputs.generate_kwargs(), **kwargs)
    assert "\n" not in str(err.value) and "expected" not in str(err.value)
    seen, handle = _calls(model)
    try:
        with pytest.raises(RelaylensError, match=message):
            relay_generate(model, tiny_tokenizer(), history, question, "snapkv", 0.5, selector_options=WINDOW,
                           **kwargs)
    finally:
        handle.remove()
    assert seen == [], "refused before the prefill"


def test_inputs_embeds_are_refused_by_name(short_model):
    model, history, question, prefill, selection = short_model
    message = r"inputs_embeds=\.\.\.\) is refused.*pass the question as token ids"
    with pytest.raises(RelaylensError, match=message):
        with relay_inputs(model, prefill, selection, "relay", question) as inputs:
            kwargs = inputs.generate_kwargs()
            embeds = model.get_input_embeddings()(kwargs.pop("input_ids"))
            model.generate(inputs_embeds=embeds, **kwargs, max_new_tokens=2, do_sample=False)
    with pytest.raises(RelaylensError, match=message):
        relay_generate(model, tiny_tokenizer(), history, question, inputs_embeds=torch.zeros(1, 5, 64))


@pytest.mark.parametrize("ids", [torch.tensor([5.7, 9.2, 11.0]), [5.5, 7.0], torch.tensor([True, False])])
def test_non_integer_token_ids_are_refused_not_truncated(short_model, ids):
    model, history, _, prefill, selection = short_model
    with pytest.raises(ShapeError, match="token ids are integers .*would truncate them silently"):
        with relay_inputs(model, prefill, selection, "relay", ids):
            pass
    with pytest.raises(ShapeError, match="the history token ids are"):
        relay_generate(model, tiny_tokenizer(), ids, [5, 6], max_new_tokens=1)
    with relay_inputs(model, prefill, selection, "relay", [5, 9, 11]) as inputs:  # integers pass unchanged
        assert inputs.input_ids.tolist() == [[5, 9, 11]]
