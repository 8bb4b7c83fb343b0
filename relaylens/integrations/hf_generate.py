"""Hugging Face ``model.generate()`` over a relocated cache: RoPERelay (or any coordinate condition) in the decoding
loop researchers already use, with its logits processors, stopping criteria, streamers and sampling.

Axes: ``layer``, ``kv_head``, ``slot``, ``head_dim``; ``Q`` question tokens (:mod:`relaylens.geometry`).

Flow: :func:`select_history` prefills the history and runs a selector; :func:`relay_inputs` relocates the kept keys
to the condition's positions (:func:`relaylens.generation.cache.relocate_selection`, one row of
:func:`relaylens.generation.rows.stack_rows`) and, inside its ``with`` block only, selects the ``relaylens`` attention
function (per-slot validity, windows on condition coordinates) and records the position of every token the model is
fed; :func:`relay_generate` does both and calls ``model.generate()``.

Positions are passed explicitly. transformers 5.x ``generate()`` derives positions from the cache length when none
are given (``N_0`` slots of layer 0, not ``M`` or ``L``), so :class:`RelayInputs` carries ``position_ids``
``question_start .. question_start + Q - 1``; ``generate()`` continues them one by one (the first answer token at
``question_start + Q``). A forward pre-hook checks every call's positions against that rule and refuses a call
without them, so a transformers release that stops forwarding them fails loudly instead of decoding at the wrong
coordinates. Its ``attention_mask`` is longer than the question on purpose: with a mask as long as ``input_ids``,
``generate()`` would slice the question by the cache length.

Example:
    >>> from relaylens.testing import tiny_model, tiny_tokenizer
    >>> model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    >>> history = "user: My dog is called Biscuit and she is a Vizsla. " * 6
    >>> text = relay_generate(model, tokenizer, history, "Question: What is the name of my dog? Answer:",
    ...                       selector="snapkv", budget=0.5, condition="relay", selector_options={"window": 8},
    ...                       max_new_tokens=4, do_sample=False)
    >>> isinstance(text, str)
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from relaylens.conditions.catalogue import Condition, Coordinates
from relaylens.conditions.scoped import get_condition
from relaylens.datasets.spans import RenderedPrompt
from relaylens.errors import PositionError, RelaylensError, RopeError, ShapeError
from relaylens.generation.attention import AttentionState, attention_context
from relaylens.generation.cache import relocate_selection
from relaylens.generation.rows import stack_rows
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.integrations.learned_use import check_learned_use
from relaylens.model.hf import hook_cache
from relaylens.model.prefill import PrefillResult, prefill_history
from relaylens.selectors import Selector, make_selector
from relaylens.selectors.base import Budget
from relaylens.selectors.protection import select_protected

__all__ = ["RelayInputs", "generation_condition", "relay_generate", "relay_inputs", "require_rotary", "select_history",
           "condition_shift"]

#: Condition names that are readouts rather than coordinates: nothing to decode under, each with its fix.
PROBE_ONLY = {
    "randommean": "RandomMean is a mean of random_order(seed) scores over seeds, not one cache; generate under "
                  "random_order(0), random_order(1), ... and average the scores",
    "phase_replay": "phase replay is a probe without a forward pass; run it with relaylens.replay_conditions "
                    "(or relaylens.probe_condition) and generate under the condition itself",
    "replay": "phase replay is a probe without a forward pass; run it with relaylens.replay_conditions "
              "(or relaylens.probe_condition) and generate under the condition itself",
}


def require_rotary(model, what: str = "relay_generate") -> RotaryFactors:
    """The model's :class:`RotaryFactors`, or a one-line :class:`RopeError` for a model relaylens cannot relocate
    (no rotary embedding, or a length-dependent rope type).

    >>> from relaylens.testing import tiny_model
    >>> require_rotary(tiny_model("llama")).layout
    'split_half'
    """
    try:
        return RotaryFactors.from_model(model)
    except RopeError as err:
        reason = str(err).splitlines()[0]
        raise RopeError(f"{what}: {type(model).__name__} cannot be relocated ({reason}). Fix: use a causal LM with "
                        "rotary position embeddings of a static type (Llama, Qwen2, Gemma-3, Phi, ...)") from None


def generation_condition(condition: str | Condition, model=None) -> Condition:
    """Parse a condition spec for decoding; refuse, in one line, a name that only a probe can evaluate.

    >>> generation_condition("query_only(64)").label
    'query_only(64)'
    >>> generation_condition("RandomMean")
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: condition 'RandomMean' needs probes, not generate(): RandomMean is a mean of random_order(seed) scores over seeds, not one cache; generate under random_order(0), random_order(1), ... and average the scores
    """  # noqa: E501 - doctest: an exception message is matched on one line
    if isinstance(condition, str):
        key = condition.strip().lower()
        reason = PROBE_ONLY.get(key) or (PROBE_ONLY["replay"] if key.startswith(("replay:", "phase_replay:")) else None)
        if reason:
            raise RelaylensError(f"condition {condition!r} needs probes, not generate(): {reason}")
    return get_condition(condition, model)


def condition_shift(condition: Condition) -> int:
    """The positions a condition adds past the history (``query_only`` / ``common_shift``, also inside a scope).

    >>> scoped, plain = generation_condition("common_shift(300)@layers=0"), generation_condition("relay")
    >>> condition_shift(scoped), condition_shift(plain)
    (300, 0)
    """
    parts = [condition] + [getattr(condition, name, None) for name in ("inner", "base")]
    return max(int(getattr(part, "shift", 0) or 0) for part in parts if part is not None)


def _token_ids(value, tokenizer, special: bool, what: str) -> torch.Tensor:
    """``[n]`` long ids of text (encoded by ``tokenizer``) or of ids given as a list / tensor."""
    if isinstance(value, str):
        if tokenizer is None:
            raise ShapeError(f"the {what} is text but no tokenizer was given; pass the model's tokenizer or token ids")
        ids = tokenizer(value, add_special_tokens=special)["input_ids"]
        return torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    ids = torch.as_tensor(value)
    if ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise ShapeError(f"the {what} token ids are {str(ids.dtype).removeprefix('torch.')}; token ids are integers "
                         "(a cast to long would truncate them silently). Fix: pass integer ids (a long tensor, a list "
                         "of ints) or text with the tokenizer")
    ids = ids.to(torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ShapeError(f"the {what} must be one sequence of token ids ([n] or [1, n]); got shape {tuple(ids.shape)}")
    return ids


def select_history(model, history_ids: torch.Tensor, selector: str | Selector = "snapkv",
                   budget: Budget | float | int | str = 0.1, prompt=None, window_size: int = 32,
                   factors: RotaryFactors | None = None, selector_options: dict | None = None,
                   protect_instructions: bool | torch.Tensor | None = None,
                   ) -> tuple[PrefillResult, Selection]:
    """Prefill ``history_ids`` ``[L]`` and select with ``selector`` at ``budget``: ``(prefill, selection)``.

    The prefill captures the last ``max(window_size, selector window)`` queries (capped at ``L``) and, for H2O / CaM,
    the attention column sums. ``prompt`` (a :class:`~relaylens.datasets.spans.RenderedPrompt`) is needed by the
    selectors that read the question text or spans (BM25, FINCH).

    ``protect_instructions`` is the framing regime, as ``relaylens run --protect-instructions``: True keeps the
    prompt's framing (instruction, chat template, separators) outside the budget, the paper's regime
    (:func:`relaylens.selectors.protection.select_protected`); False lets it compete for the budget (the *framing
    evicted* ablation); None (default) is the run's default: protected where ``prompt`` has spans, else evicted
    (token ids carry no spans). A ``[L]`` bool tensor names the protected tokens itself (the lm-eval model's
    ``framing_tokens``).

    >>> from relaylens.testing import tiny_model
    >>> prefill, selection = select_history(tiny_model("llama"), torch.arange(3, 67), "snapkv", 0.25,
    ...                                     selector_options={"window": 8})
    >>> selection.counts.tolist()
    [[16, 16], [16, 16]]
    """
    chosen = make_selector(selector, **(selector_options or {})) if isinstance(selector, str) else selector
    if selector_options and not isinstance(selector, str):
        raise RelaylensError("selector_options go with a selector name; a Selector instance carries its own options")
    if getattr(chosen, "needs_prompt", False) and prompt is None:
        raise RelaylensError(f"selector {chosen.name!r} reads the rendered prompt (question text, session spans); "
                             "pass history=relaylens.render_prompt(record, tokenizer), or choose an attention-based "
                             "selector such as snapkv")
    budget = Budget.coerce(budget)
    history_ids = torch.as_tensor(history_ids, dtype=torch.long).reshape(-1)
    length = int(history_ids.numel())
    window = max(int(window_size), int(getattr(chosen, "window", 0) or 0), int(getattr(chosen, "query_window", 0) or 0))
    factors = factors or RotaryFactors.from_model(model)
    prefill = prefill_history(model, history_ids, window_size=max(1, min(window, length)),
                              column_sums=bool(getattr(chosen, "needs_column_sums", False)))
    prepared = chosen.prepare(model, prefill, prompt, factors)
    mask = protect_instructions if isinstance(protect_instructions, torch.Tensor) else None  # [L] explicit framing
    if mask is not None or framing_protected(prompt, protect_instructions):
        return prefill, select_protected(prepared, prefill, prompt, budget, mask)
    return prefill, prepared.select(prefill, prompt, budget)


def framing_protected(prompt, protect_instructions: bool | None = None) -> bool:
    """Whether a selection keeps the prompt's framing outside the budget (the paper's regime): ``protect_instructions``
    when given, else the run's default (protected) wherever ``prompt`` has spans; a True without a prompt is refused.

    >>> framing_protected(None), framing_protected(None, False)
    (False, False)
    """
    if protect_instructions is None:
        return prompt is not None
    if protect_instructions and prompt is None:
        raise RelaylensError("protect_instructions=True keeps the prompt's framing (instruction, chat template) "
                             "outside the budget, but token ids carry no spans; pass history=relaylens.render_prompt("
                             "record, tokenizer), or protect_instructions=False (the framing-evicted ablation)")
    return bool(protect_instructions)


@dataclass
class RelayInputs:
    """What ``model.generate(**inputs.generate_kwargs(), ...)`` needs to decode under one condition.

    Attributes:
        input_ids: ``[1, Q]`` question tokens.
        cache: a transformers ``DynamicCache``, per layer ``[1, kv_head, slot, head_dim]`` (the layer's widest head;
            padding slots masked by the attention function).
        position_ids: ``[1, Q]`` long, ``question_start .. question_start + Q - 1``.
        attention_mask: ``[1, N_0 + Q]`` ones (``N_0``: slots of layer 0); longer than ``input_ids`` on purpose.
        coordinates: the condition's key positions and question start.
        state: the attention state (validity, key positions, the positions of every token fed so far).
        history_length: ``L``: new tokens sit at ``L, L + 1, ...`` in the source frame (``window_mode="source"``).
    """

    input_ids: torch.Tensor
    cache: object
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    coordinates: Coordinates
    state: AttentionState
    history_length: int

    @property
    def question_start(self) -> int:
        """The position of the first question token (``M`` for ``relay``, ``L`` for ``original``)."""
        return int(self.position_ids[0, 0])

    def generate_kwargs(self) -> dict:
        """``input_ids``, ``cache``, ``position_ids`` and ``attention_mask`` for ``model.generate``."""
        return {"input_ids": self.input_ids, "cache": self.cache, "position_ids": self.position_ids,
                "attention_mask": self.attention_mask}


def _new_token_limit(model, generate_kwargs: dict, question_length: int) -> int:
    """How many tokens ``generate()`` may add with these kwargs (its ``max_new_tokens`` / ``max_length`` rule)."""
    config = generate_kwargs.get("generation_config") or getattr(model, "generation_config", None)
    if generate_kwargs.get("max_new_tokens") is not None:
        return int(generate_kwargs["max_new_tokens"])
    if generate_kwargs.get("max_length") is not None:
        return max(int(generate_kwargs["max_length"]) - question_length, 0)
    if config is not None and getattr(config, "max_new_tokens", None) is not None:
        return int(config.max_new_tokens)
    return max(int(getattr(config, "max_length", None) or 20) - question_length, 0)


@contextlib.contextmanager
def relay_inputs(model, prefill: PrefillResult, selection: Selection, condition: str | Condition | Coordinates,
                 question_ids: torch.Tensor, factors: RotaryFactors | None = None, window_mode: str = "condition",
                 max_new_tokens: int = 0) -> Iterator[RelayInputs]:
    """``with relay_inputs(...) as inputs: model.generate(**inputs.generate_kwargs(), ...)``: one condition's cache
    and positions, with the relaylens attention function active inside the block only (restored on exit).

    The cache is built exactly as :func:`relaylens.generation.rows.run_rows` builds a row's (so ``generate()`` greedy
    decoding reproduces relaylens's own token for token). One ``generate()`` call per block: the cache grows with
    the tokens fed. ``max_new_tokens`` is checked against the model's rotary range before anything runs.

    Example:
        >>> from relaylens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> prefill, selection = select_history(model, torch.arange(3, 43), "streaming", 0.5)
        >>> with relay_inputs(model, prefill, selection, "relay", torch.tensor([50, 51]), max_new_tokens=3) as inputs:
        ...     out = model.generate(**inputs.generate_kwargs(), max_new_tokens=3, do_sample=False, eos_token_id=None)
        >>> inputs.position_ids.tolist(), inputs.state.new_positions.tolist()
        ([[20, 21]], [[20, 21, 22, 23]])
    """
    factors = factors or require_rotary(model)
    question_ids = _token_ids(question_ids, None, False, "question")
    if question_ids.numel() == 0:
        raise ShapeError("the question has no tokens; generate() needs at least one token to feed after the cache")
    if isinstance(condition, str):
        condition = generation_condition(condition, model)
    if not isinstance(condition, Coordinates):  # a learned geometry: its model, selector and window mode
        check_learned_use(condition, model, "relay_inputs", selector=selection.info.get("selector"),
                          window_mode=window_mode)
    layers = relocate_selection(prefill, selection, condition, factors, window_mode)
    coords = layers.coordinates
    start = coords.question_start
    if isinstance(start, torch.Tensor) or not float(start).is_integer():
        raise PositionError(f"condition {coords.condition}: the question starts at a real-valued position "
                            f"({float(start):g}); generate() feeds integer position_ids. Fix: use "
                            "relaylens.run_condition for real-valued question positions")
    start = int(start)
    length = int(question_ids.numel())
    factors.check_any_positions(torch.tensor([start + length - 1 + max(int(max_new_tokens), 0)]),
                                f"condition {coords.condition}: question/generation positions",
                                fix="use a shorter history, fewer max_new_tokens or a smaller shift, or a model with a "
                                    "longer context")
    batch = stack_rows([layers], window_mode)  # one row: the cache and state run_rows builds for it
    device = model.device
    inputs = RelayInputs(
        input_ids=question_ids[None].to(device),
        cache=batch.cache,
        position_ids=(start + torch.arange(length))[None].to(device),  # [1, Q]
        attention_mask=torch.ones(1, batch.cache.get_seq_length() + length, dtype=torch.long, device=device),
        coordinates=coords,
        state=batch.state,
        history_length=prefill.history_length,
    )
    with attention_context(model, batch.state), _recorded_positions(model, inputs, factors):
        yield inputs


#: What ``generate()`` can be asked for that one relocated cache cannot serve: the refusal of each, with its fix.
REFUSED_CALLS = {
    "rows": "relay_inputs decodes one sequence over one relocated cache; this generate() call decodes {rows} rows "
            "at once (num_beams > 1 or num_return_sequences > 1: beam search and several return sequences are "
            "refused). Fix: num_beams=1 and num_return_sequences=1; for several sampled answers call generate() once "
            "per relay_inputs block",
    "use_cache": "generate(use_cache=False) re-feeds the question and every answer token at each step instead of "
                 "extending the relocated cache, so nothing would decode at the condition's coordinates (refused). "
                 "Fix: leave use_cache at its default (True)",
    "inputs_embeds": "generate(inputs_embeds=...) is refused: generate() slices embeddings by the cache length, "
                     "which over a relocated cache is neither M nor L, so the model would get no question tokens. "
                     "Fix: pass the question as token ids (**inputs.generate_kwargs())",
}


def _refuse_unsupported_call(kwargs: dict, args: tuple) -> None:
    """Refuse, in one line, a model call inside :func:`relay_inputs` that the relocated cache cannot serve."""
    if kwargs.get("inputs_embeds") is not None:
        raise RelaylensError(REFUSED_CALLS["inputs_embeds"])
    ids = kwargs.get("input_ids", args[0] if args else None)
    rows = 1 if ids is None else int(ids.shape[0])
    if rows != 1:
        raise RelaylensError(REFUSED_CALLS["rows"].format(rows=rows))
    if kwargs.get("use_cache") is False:
        raise RelaylensError(REFUSED_CALLS["use_cache"])


def _refuse_generate_kwargs(model, generate_kwargs: dict) -> None:
    """:func:`relay_generate`'s check of the ``generate()`` options (its keywords, else the generation config)
    before any model work: the refusals of :data:`REFUSED_CALLS`."""
    config = generate_kwargs.get("generation_config") or getattr(model, "generation_config", None)

    def option(name, default):
        value = generate_kwargs.get(name, getattr(config, name, default))
        return default if value is None else value

    if generate_kwargs.get("inputs_embeds") is not None:
        raise RelaylensError(REFUSED_CALLS["inputs_embeds"])
    rows = int(option("num_beams", 1)) * int(option("num_return_sequences", 1))
    if rows != 1:
        raise RelaylensError(REFUSED_CALLS["rows"].format(rows=rows))
    if option("use_cache", True) is False:
        raise RelaylensError(REFUSED_CALLS["use_cache"])


def _room(factors: RotaryFactors, inputs: RelayInputs) -> int | str:
    """How many answer tokens fit after the question in the model's rotary range."""
    if factors.max_position is None:
        return "any number of"
    return max(int(factors.max_position) - inputs.question_start - int(inputs.input_ids.shape[-1]), 0)


@contextlib.contextmanager
def _recorded_positions(model, inputs: RelayInputs, factors: RotaryFactors) -> Iterator[None]:
    """A forward pre-hook (removed on exit) that appends each call's ``position_ids`` to the attention state and
    refuses calls that would decode at other coordinates than the condition's, past the rotary range, or in a way
    the relocated cache cannot serve (several rows, no cache, embeddings instead of token ids)."""
    state = inputs.state

    def record(module, args, kwargs):
        _refuse_unsupported_call(kwargs, args)
        positions = kwargs.get("position_ids")
        cache = hook_cache(kwargs)
        if cache is not inputs.cache:
            raise RelaylensError("inside relay_inputs(...) the model runs over the relocated cache only; pass "
                                 "**inputs.generate_kwargs() to model.generate (one call per with-block)")
        if positions is None:
            raise PositionError("model.generate() called the model without position_ids, so transformers would derive "
                                "them from the cache length instead of the condition's coordinates. Fix: pass "
                                "**inputs.generate_kwargs() (it carries position_ids)")
        positions = positions.detach().to("cpu", torch.long).reshape(1, -1)  # [1, T]
        fed = state.new_positions.shape[-1]
        expected = inputs.question_start + fed + torch.arange(positions.shape[-1])
        if not torch.equal(positions[0], expected):
            raise PositionError(f"model call at positions {positions[0].tolist()[:4]}..., expected "
                                f"{expected.tolist()[:4]}...: tokens after the cache run consecutively from the "
                                f"question start {inputs.question_start}. Fix: one generate() call per relay_inputs "
                                "block")
        factors.check_positions(positions, f"condition {inputs.coordinates.condition}: generation positions",
                                fix=f"pass max_new_tokens= to generate() (at most {_room(factors, inputs)} tokens fit "
                                    "after this question), or use a shorter history or a model with a longer context")
        state.new_positions = torch.cat((state.new_positions, positions), dim=-1)
        source = inputs.history_length + fed + torch.arange(positions.shape[-1])[None]  # [1, T] source frame
        state.new_source_positions = torch.cat((state.new_source_positions, source), dim=-1)

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def relay_generate(model=None, tokenizer=None, /, history=None, question=None, selector: str | Selector = "snapkv",
                   budget: Budget | float | int | str = 0.1, condition: str | Condition = "relay", *,
                   selector_options: dict | None = None, window_size: int = 32, window_mode: str = "condition",
                   protect_instructions: bool | None = None, **generate_kwargs) -> str:
    """Prefill ``history``, keep ``budget`` of it with ``selector``, place the kept keys under ``condition`` and return
    the text ``model.generate()`` produces after ``question`` (the new tokens, special tokens skipped).

    Args:
        history: text (tokenized with special tokens, e.g. BOS), token ids ``[L]``, or a
            :class:`~relaylens.datasets.spans.RenderedPrompt` (``render_prompt``; its question is used when
            ``question`` is None, and BM25 / FINCH read its spans and question).
        question: text (tokenized without special tokens) or token ids ``[Q]``: everything after the history,
            the chat template's generation prompt included.
        selector: a selector name (``snapkv``, ``bm25``, ``kvpress:SnapKVPress``, ...) or a :class:`Selector`;
            ``selector_options`` are its hyperparameters (``{"window": 8}``).
        budget: a ratio in (0, 1], a number of states (int, ``"B2048"``) or a ``Budget``.
        protect_instructions: the framing regime (:func:`select_history`): default protected for a
            ``RenderedPrompt`` (the run's default), evicted for text or ids (no spans).
        condition: any decodable condition spec (``relay``, ``original``, ``query_only(2048)``,
            ``relay@band=late``, ...). Probe-only names (``RandomMean``, phase replay) are refused in one line.
        generate_kwargs: passed to ``model.generate`` (``max_new_tokens``, ``do_sample``, ``eos_token_id``,
            ``logits_processor``, ``stopping_criteria``, ``streamer``, ``stop_strings``, ...). ``stop_strings`` get
            the tokenizer (``generate()`` needs one); a ``tokenizer=`` keyword, as ``generate()`` takes it, is the
            same tokenizer and may be given instead of, or as well as, the positional one.

    Refused in one line before any model work: beam search and ``num_return_sequences > 1`` (one relocated cache
    decodes one sequence), ``use_cache=False``, ``inputs_embeds``, and float token ids.

    A model without rotary embeddings (or with a length-dependent rope type) is refused in one line before any
    model work. Greedy decoding equals :func:`relaylens.run_condition` token for token (tests/integrations).

    Example:
        >>> from relaylens import load_model  # doctest: +SKIP
        >>> model, tokenizer = load_model("smollm2-135m-instruct")  # doctest: +SKIP
        >>> relay_generate(model, tokenizer, long_history, "Question: where did I park? Answer:", "snapkv", 0.1,
        ...                "relay", max_new_tokens=32, do_sample=False)  # doctest: +SKIP
    """
    model = model if model is not None else generate_kwargs.pop("model", None)
    given = generate_kwargs.pop("tokenizer", None)  # generate()'s keyword for stop_strings: the same tokenizer
    if tokenizer is not None and given is not None and given is not tokenizer:
        raise ShapeError("relay_generate got two different tokenizers (positional and tokenizer=); it decodes the "
                         "answer and matches stop_strings with one. Fix: pass the model's tokenizer once")
    tokenizer = tokenizer if tokenizer is not None else given
    if model is None or history is None:
        raise ShapeError("relay_generate needs a model and a history: relay_generate(model, tokenizer, history, "
                         "question, ...)")
    factors = require_rotary(model)
    parsed = generation_condition(condition, model)
    _refuse_generate_kwargs(model, generate_kwargs)
    if tokenizer is None:
        raise ShapeError("relay_generate decodes the answer with the tokenizer; pass the model's tokenizer (or call "
                         "model.generate inside relay_inputs(...) to work with token ids)")

    prompt = history if isinstance(history, RenderedPrompt) else None
    if prompt is not None:
        history_ids = prompt.history_ids
        question = prompt.question_ids if question is None else question
    else:
        history_ids = _token_ids(history, tokenizer, True, "history")
    if question is None:
        raise ShapeError("no question: pass question= (text or token ids), or a RenderedPrompt as history")
    question_ids = _token_ids(question, tokenizer, False, "question")
    check_learned_use(parsed, model, "relay_generate", selector=selector, budget=budget,  # as relaylens run does
                      selector_options=dict(selector_options or {}) if isinstance(selector, str) else None,
                      protect_instructions=framing_protected(prompt, protect_instructions), window_mode=window_mode)
    prefill, selection = select_history(model, history_ids, selector, budget, prompt, window_size, factors,
                                        selector_options, protect_instructions)
    limit = _new_token_limit(model, generate_kwargs, int(question_ids.numel()))
    config = generate_kwargs.get("generation_config") or getattr(model, "generation_config", None)
    if generate_kwargs.get("stop_strings") or getattr(config, "stop_strings", None):
        generate_kwargs["tokenizer"] = tokenizer  # generate() matches stop strings through the tokenizer
    with relay_inputs(model, prefill, selection, parsed, question_ids, factors, window_mode, limit) as inputs:
        output = model.generate(**inputs.generate_kwargs(), **generate_kwargs)
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return tokenizer.decode(sequences[0, question_ids.numel():].tolist(), skip_special_tokens=True)
