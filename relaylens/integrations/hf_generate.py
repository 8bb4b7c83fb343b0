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
from relaylens.model.hf import hook_cache
from relaylens.model.prefill import PrefillResult, prefill_history
from relaylens.selectors import Selector, make_selector
from relaylens.selectors.base import Budget

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
    ids = torch.as_tensor(value, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ShapeError(f"the {what} must be one sequence of token ids ([n] or [1, n]); got shape {tuple(ids.shape)}")
    return ids


def select_history(model, history_ids: torch.Tensor, selector: str | Selector = "snapkv",
                   budget: Budget | float | int | str = 0.1, prompt=None, window_size: int = 32,
                   factors: RotaryFactors | None = None, selector_options: dict | None = None,
                   ) -> tuple[PrefillResult, Selection]:
    """Prefill ``history_ids`` ``[L]`` and select with ``selector`` at ``budget``: ``(prefill, selection)``.

    The prefill captures the last ``max(window_size, selector window)`` queries (capped at ``L``) and, for H2O / CaM,
    the attention column sums. ``prompt`` (a :class:`~relaylens.datasets.spans.RenderedPrompt`) is needed by the
    selectors that read the question text or spans (BM25, FINCH).

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
    return prefill, prepared.select(prefill, prompt, budget)


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
    with attention_context(model, batch.state), _recorded_positions(model, inputs):
        yield inputs


@contextlib.contextmanager
def _recorded_positions(model, inputs: RelayInputs) -> Iterator[None]:
    """A forward pre-hook (removed on exit) that appends each call's ``position_ids`` to the attention state and
    refuses calls that would decode at other coordinates than the condition's."""
    state = inputs.state

    def record(module, args, kwargs):
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
        state.new_positions = torch.cat((state.new_positions, positions), dim=-1)
        source = inputs.history_length + fed + torch.arange(positions.shape[-1])[None]  # [1, T] source frame
        state.new_source_positions = torch.cat((state.new_source_positions, source), dim=-1)

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def relay_generate(model, tokenizer, history, question=None, selector: str | Selector = "snapkv",
                   budget: Budget | float | int | str = 0.1, condition: str | Condition = "relay", *,
                   selector_options: dict | None = None, window_size: int = 32, window_mode: str = "condition",
                   **generate_kwargs) -> str:
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
        condition: any decodable condition spec (``relay``, ``original``, ``query_only(2048)``,
            ``relay@band=late``, ...). Probe-only names (``RandomMean``, phase replay) are refused in one line.
        generate_kwargs: passed to ``model.generate`` (``max_new_tokens``, ``do_sample``, ``eos_token_id``,
            ``logits_processor``, ``stopping_criteria``, ``streamer``, ...).

    A model without rotary embeddings (or with a length-dependent rope type) is refused in one line before any
    model work. Greedy decoding equals :func:`relaylens.run_condition` token for token (tests/integrations).

    Example:
        >>> from relaylens import load_model  # doctest: +SKIP
        >>> model, tokenizer = load_model("smollm2-135m-instruct")  # doctest: +SKIP
        >>> relay_generate(model, tokenizer, long_history, "Question: where did I park? Answer:", "snapkv", 0.1,
        ...                "relay", max_new_tokens=32, do_sample=False)  # doctest: +SKIP
    """
    factors = require_rotary(model)
    parsed = generation_condition(condition, model)
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
    prefill, selection = select_history(model, history_ids, selector, budget, prompt, window_size, factors,
                                        selector_options)
    limit = _new_token_limit(model, generate_kwargs, int(question_ids.numel()))
    with relay_inputs(model, prefill, selection, parsed, question_ids, factors, window_mode, limit) as inputs:
        output = model.generate(**inputs.generate_kwargs(), **generate_kwargs)
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return tokenizer.decode(sequences[0, question_ids.numel():].tolist(), skip_special_tokens=True)
