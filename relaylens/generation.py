"""Relocated cache, synchronised question pass and greedy generation under one coordinate condition.

Axes: ``layer``, ``kv_head``, ``slot`` (kept state, valid slots first), ``head_dim``; ``Q`` question tokens.

Flow for one (record, selection, condition): :func:`build_cache` gathers the kept keys/values of the prefill,
relocates keys to the condition's positions and pads every layer to its own widest head (validity mask alongside);
:func:`run_condition` runs the question at ``question_start .. question_start + Q - 1`` and decodes greedily, the
first generated token fed at ``question_start + Q`` and one position more per token.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.prefill import PrefillResult
    >>> from relaylens.selection import Selection
    >>> model = tiny_model("llama")
    >>> history, question = torch.arange(3, 40), torch.tensor([50, 51, 52])
    >>> out = model(history[None], use_cache=True)
    >>> pre = prefill_from_cache(history, out.cache, model)
    >>> sel = Selection.full(pre.history_length, pre.num_layers, pre.num_kv_heads)
    >>> result = run_condition(model, pre, sel, "relay", question, max_new_tokens=3)
    >>> result.question_positions.tolist(), len(result.token_ids) <= 3
    ([37, 38, 39], True)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from relaylens.attention import AttentionState, attention_context
from relaylens.conditions import Condition, Coordinates, get_condition
from relaylens.errors import NonFiniteError, PositionError, ShapeError
from relaylens.geometry import RotaryFactors, relocate_keys
from relaylens.hf import attention_constants, cache_from_tensors, cache_tensors
from relaylens.prefill import PrefillResult
from relaylens.selection import Selection


@dataclass
class RelocatedCache:
    """A cache ready for the question pass, and the attention state that goes with it."""

    cache: DynamicCache
    state: AttentionState
    coordinates: Coordinates
    widths: list[int]  # per layer: slots kept in the cache (the layer's widest head)
    inputs: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # grad=True: per layer (keys, values) [kv_head, slot, D]


@dataclass
class GenerationResult:
    """Outcome of one condition: logits of the question pass and the greedy continuation."""

    condition: str
    question_start: int
    question_positions: torch.Tensor  # [Q]
    last_logits: torch.Tensor  # [vocab] float32, logits of the final question token
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # position each generated token was fed at (if fed)
    text: str = ""
    stop_reason: str = "limit"  # "eos", "newline", "limit"
    question_logits: torch.Tensor | None = None  # [Q, vocab] when requested
    teacher_logits: torch.Tensor | None = None  # [vocab] logits of the teacher-forced token, when one was fed
    inputs: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # grad=True: RelocatedCache.inputs
    head_inputs: dict | None = None  # grad=True: layer -> [(key, value) per-query-head views per pass], question first

    @property
    def hit_limit(self) -> bool:
        """True when ``max_new_tokens`` cut the answer (it may be incomplete)."""
        return self.stop_reason == "limit"


def prefill_from_cache(history_ids: torch.Tensor, cache, model) -> PrefillResult:
    """Wrap a transformers cache filled by a plain forward over the history as a :class:`PrefillResult`."""
    keys, values = cache_tensors(cache)
    scaling, groups = attention_constants(model)
    return PrefillResult(
        history_ids=history_ids.reshape(-1),
        keys=[k.detach() for k in keys],
        values=[v.detach() for v in values],
        window_queries=None,
        window_size=0,
        scaling=scaling,
        num_key_value_groups=groups,
    )


def _check_selection(prefill: PrefillResult, selection: Selection) -> None:
    if selection.num_layers != prefill.num_layers or selection.num_kv_heads != prefill.num_kv_heads:
        raise ShapeError(
            f"selection is [{selection.num_layers} layers, {selection.num_kv_heads} kv heads] but the cache has "
            f"[{prefill.num_layers}, {prefill.num_kv_heads}]; select on the same model's prefill"
        )
    if selection.history_length != prefill.history_length:
        raise ShapeError(
            f"selection indexes a history of {selection.history_length} tokens, the prefill has {prefill.history_length}"
        )
    if selection.values is not None and selection.values.shape[-1] != prefill.values[0].shape[-1]:
        raise ShapeError(f"replacement values have head_dim {selection.values.shape[-1]}, the cache {prefill.values[0].shape[-1]}")


def build_cache(
    prefill: PrefillResult,
    selection: Selection,
    condition: str | Condition | Coordinates,
    factors: RotaryFactors,
    window_mode: str = "condition",
    grad: bool = False,
) -> RelocatedCache:
    """Gather kept states, relocate keys to the condition's positions, and pad each layer to its widest head.

    ``condition`` may also be ready-made :class:`~relaylens.conditions.Coordinates` of ``selection``. Without
    ``grad``, a head whose every target position equals its source position (all of ``original``, and heads a
    scoped condition leaves alone) is not relocated: its kept keys are the gathered cache rows, so ``original``
    costs what a plain sparse cache costs.

    ``grad=True`` keeps autograd on: the graph reaches back to ``prefill`` keys/values that require grad, and
    otherwise the relocated keys and kept values become leaves that require grad (``RelocatedCache.inputs``).
    """
    if not grad:
        layers = relocate_selection(prefill, selection, condition, factors, window_mode)
        data = [(keys[None], values[None]) for keys, values in layers.data]  # [1, kv_head, slot, head_dim]
        return RelocatedCache(DynamicCache(ddp_cache_data=data), layers.state, layers.coordinates, layers.widths)
    with torch.set_grad_enabled(grad):
        return _build_cache(prefill, selection, condition, factors, window_mode, grad)


def _gather_layer(prefill, selection, coords, layer: int):
    """One layer's kept states, cut to the layer's widest head: validity, source and target positions
    ``[kv_head, slot]``, kept keys and values ``[kv_head, slot, head_dim]`` (padding reads slot 0)."""
    valid = selection.valid[layer]  # [kv_head, slot]
    width = int(valid.sum(-1).max())
    valid = valid[:, :width]
    source = selection.positions[layer, :, :width].clamp_min(0)  # [kv_head, slot]
    target = torch.where(valid, coords.key_positions[layer, :, :width], source)
    keys = prefill.keys[layer]  # [kv_head, L, head_dim]
    index = source[..., None].expand(-1, -1, keys.shape[-1]).to(keys.device)
    kept_keys = keys.gather(1, index)  # [kv_head, slot, head_dim]
    if selection.values is not None:
        kept_values = selection.values[layer, :, :width].to(prefill.values[layer])
    else:
        kept_values = prefill.values[layer].gather(1, index)
    return valid, source, target, kept_keys, kept_values


def _build_cache(prefill, selection, condition, factors, window_mode: str, grad: bool) -> RelocatedCache:
    _check_selection(prefill, selection)
    coords = coordinates_of(condition, selection)
    state = AttentionState(window_mode=window_mode, head_inputs={} if grad else None)
    data, widths, inputs = [], [], []
    for layer in range(prefill.num_layers):
        valid, source, target, kept_keys, kept_values = _gather_layer(prefill, selection, coords, layer)
        try:
            moved = relocate_keys(kept_keys, source, target, factors, layer=layer if factors.per_layer else None)
        except NonFiniteError as err:
            raise NonFiniteError(f"layer {layer}: {err}") from None
        except PositionError as err:
            raise PositionError(f"condition {coords.condition}, layer {layer}: {err}") from None
        pad = (~valid)[..., None].to(moved.device)
        moved, kept_values = moved.masked_fill(pad, 0.0), kept_values.masked_fill(pad, 0.0)
        _check_finite(moved, layer, "relocated keys")
        _check_finite(kept_values, layer, "kept values")
        if grad:
            moved, kept_values = (t if t.requires_grad else t.detach().requires_grad_() for t in (moved, kept_values))
            inputs.append((moved, kept_values))
        data.append((moved[None], kept_values[None]))  # [1, kv_head, slot, head_dim]
        state.valid[layer] = valid
        state.key_positions[layer] = torch.where(valid, target, torch.full_like(target, -(10**9)))
        state.source_positions[layer] = torch.where(valid, source, torch.full_like(source, -(10**9)))
        widths.append(valid.shape[-1])
    return RelocatedCache(cache_from_tensors(data), state, coords, widths, inputs if grad else None)


@dataclass
class RelocatedLayers:
    """Per layer ``(keys, values)`` ``[kv_head, slot, head_dim]`` at the condition's coordinates, before caching."""

    data: list[tuple[torch.Tensor, torch.Tensor]]
    state: AttentionState
    coordinates: Coordinates
    widths: list[int]


def coordinates_of(condition: str | Condition | Coordinates, selection: Selection) -> Coordinates:
    """The condition's :class:`Coordinates` on ``selection`` (ready-made coordinates are checked and passed through)."""
    if isinstance(condition, Coordinates):
        if tuple(condition.key_positions.shape) != tuple(selection.positions.shape):
            raise ShapeError(
                f"coordinates {condition.condition!r} have key positions {tuple(condition.key_positions.shape)} but the "
                f"selection is {tuple(selection.positions.shape)}; build them from the same selection"
            )
        return condition
    return get_condition(condition).coordinates(selection)


@torch.no_grad()
def relocate_selection(
    prefill: PrefillResult,
    selection: Selection,
    condition: str | Condition | Coordinates,
    factors: RotaryFactors,
    window_mode: str = "condition",
) -> RelocatedLayers:
    """The work of :func:`build_cache` without the cache object (batched rows stack these)."""
    _check_selection(prefill, selection)
    coords = coordinates_of(condition, selection)
    state = AttentionState(window_mode=window_mode)
    data, widths = [], []
    for layer in range(prefill.num_layers):
        valid, source, target, kept_keys, kept_values = _gather_layer(prefill, selection, coords, layer)
        moving = (target != source).any(-1)  # [kv_head]: heads with at least one key to move
        pad = (~valid)[..., None].to(kept_keys.device)
        if bool(moving.any()):
            moved = kept_keys.clone() if not bool(moving.all()) else None
            heads = moving.nonzero()[:, 0] if moved is not None else slice(None)
            try:
                relocated = relocate_keys(kept_keys[heads], source[heads], target[heads], factors,
                                          layer=layer if factors.per_layer else None)  # checks its output is finite
            except NonFiniteError as err:
                raise NonFiniteError(f"layer {layer}: {err}") from None
            except PositionError as err:
                raise PositionError(f"condition {coords.condition}, layer {layer}: {err}") from None
            if moved is None:
                moved = relocated
            else:
                moved[heads] = relocated
                _check_finite(moved[~moving], layer, "kept keys")
        else:  # identity: every key stays where it was cached (a plain sparse cache)
            moved = kept_keys
            _check_finite(moved, layer, "kept keys")
        moved, kept_values = moved.masked_fill(pad, 0.0), kept_values.masked_fill(pad, 0.0)
        _check_finite(kept_values, layer, "kept values")
        data.append((moved, kept_values))  # [kv_head, slot, head_dim]
        state.valid[layer] = valid
        state.key_positions[layer] = torch.where(valid, target, torch.full_like(target, -(10**9)))
        state.source_positions[layer] = torch.where(valid, source, torch.full_like(source, -(10**9)))
        widths.append(valid.shape[-1])
    return RelocatedLayers(data, state, coords, widths)


def _check_finite(tensor: torch.Tensor, layer: int, what: str) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise NonFiniteError(f"layer {layer}: {what} contain NaN or inf; relaylens refuses to build a cache from them. "
                             "Fix: check the prefill cache (a float16 forward pass that overflowed, or replacement values "
                             "of a merging selector); run the model in float32 or bfloat16")


def _forward(model, ids: torch.Tensor, positions: torch.Tensor, relocated: RelocatedCache, source_positions: torch.Tensor,
             grad: bool = False):
    state = relocated.state
    state.new_positions = torch.cat((state.new_positions, positions))
    base = state.new_source_positions if state.new_source_positions is not None else torch.zeros(0, dtype=torch.long)
    state.new_source_positions = torch.cat((base, source_positions))
    device = model.device
    with torch.set_grad_enabled(grad), attention_context(model, state):
        out = model(
            input_ids=ids[None].to(device),
            position_ids=positions[None].to(device),
            cache=relocated.cache,
            use_cache=True,
        )
    logits = out.logits[0]  # [T, vocab]
    return logits if grad and logits.dtype == torch.float64 else logits.float()


def _fork(relocated: RelocatedCache) -> RelocatedCache:
    """A copy sharing the tensors (and their graph): cache updates concatenate, so neither side sees the other's."""
    layers = [(layer.keys, layer.values) for layer in relocated.cache.layers]
    state = dataclasses.replace(relocated.state, observers=[], valid=dict(relocated.state.valid),
                                key_positions=dict(relocated.state.key_positions),
                                source_positions=dict(relocated.state.source_positions))
    return dataclasses.replace(relocated, cache=cache_from_tensors(layers), state=state)


def run_condition(
    model,
    prefill: PrefillResult,
    selection: Selection,
    condition: str | Condition | Coordinates,
    question_ids: torch.Tensor,
    max_new_tokens: int = 32,
    factors: RotaryFactors | None = None,
    eos_token_ids: set[int] | None = None,
    tokenizer=None,
    stop_at_newline: bool = False,
    window_mode: str = "condition",
    observers: list | None = None,
    keep_question_logits: bool = False,
    teacher_token: int | None = None,
    teacher_observers: list | None = None,
    grad: bool = False,
) -> GenerationResult:
    """Question pass at the condition's coordinates, then greedy decoding with consecutive positions.

    Args:
        question_ids: ``[Q]`` question tokens (everything after the history, including the generation prompt).
        max_new_tokens: decoding limit (0: question pass only).
        eos_token_ids: stop tokens (default: the model's ``generation_config`` / ``config`` EOS ids).
        tokenizer: decodes the answer text; needed for ``stop_at_newline`` (short-answer prompt modes).
        observers: attention observers active during the question pass only (probes).
        teacher_token: a token (e.g. the first reference-answer token) fed at the next continuation position on a
            copy of the cache, with ``teacher_observers`` active; decoding itself is unaffected.
        grad: run the question pass (and the teacher-forced token) with autograd on the retained keys and values:
            ``result.question_logits`` / ``result.teacher_logits`` carry the graph back to
            ``result.inputs`` (per layer ``(keys, values)``) and to per-query-head views of them
            (``result.head_inputs``, see :class:`~relaylens.attention.AttentionState`). Decoding still runs without
            autograd. Default: no autograd.

    Without ``grad`` this is :func:`relaylens.rows.run_rows` with one row; batch a record's conditions with
    ``run_rows``.
    """
    if not grad:  # one row of relaylens.rows.run_rows (the batched path, batch of one)
        from relaylens.rows import Row, run_rows

        row = Row(selection, condition, tuple(observers or ()), tuple(teacher_observers or ()))
        return run_rows(model, prefill, [row], question_ids, max_new_tokens=max_new_tokens, factors=factors,
                        eos_token_ids=eos_token_ids, tokenizer=tokenizer, stop_at_newline=stop_at_newline,
                        window_mode=window_mode, keep_question_logits=keep_question_logits, teacher_token=teacher_token)[0]
    factors = factors or RotaryFactors.from_model(model)
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0:
        raise ShapeError("the question has no tokens; render the prompt with a question block")
    relocated = build_cache(prefill, selection, condition, factors, window_mode, grad=grad)
    coords = relocated.coordinates
    positions = coords.question_positions(question_ids.numel())
    label = str(coords.condition)
    fix = ("Fix: use a smaller shift, a shorter history or fewer --max-new-tokens, or a model with a longer context"
           if "shift" in label else "Fix: use shorter records or fewer --max-new-tokens, or a model with a longer context "
           "(this condition has no shift to reduce)")
    factors.check_positions(positions[-1:] + max(max_new_tokens, 0), f"condition {label}: question/generation positions",
                            fix=fix)
    source = torch.arange(question_ids.numel()) + prefill.history_length
    relocated.state.observers = list(observers or [])
    logits = _forward(model, question_ids, positions, relocated, source, grad)  # [Q, vocab]
    relocated.state.observers = []
    teacher_logits = None
    if teacher_token is not None:
        forked = _fork(relocated) if grad else copy.deepcopy(relocated)
        forked.state.observers = list(teacher_observers or [])
        teacher_logits = _forward(model, torch.tensor([int(teacher_token)]), positions[-1:] + 1, forked, source[-1:] + 1, grad)[-1]
        del forked
    result = GenerationResult(coords.condition, coords.question_start, positions, logits[-1].detach().clone(),
                              question_logits=logits if keep_question_logits or grad else None,
                              teacher_logits=teacher_logits, inputs=relocated.inputs,
                              head_inputs=relocated.state.head_inputs)
    relocated.state.head_inputs = None  # decoding records no per-head views
    eos = eos_token_ids if eos_token_ids is not None else default_eos_ids(model, tokenizer)
    next_position = int(positions[-1]) + 1
    next_source = int(source[-1]) + 1
    current = logits[-1].detach()
    for step in range(max_new_tokens):
        token = int(current.argmax())
        result.token_ids.append(token)
        if token in eos:
            result.stop_reason = "eos"
            break
        if stop_at_newline and tokenizer is not None and "\n" in tokenizer.decode(result.token_ids, skip_special_tokens=True).lstrip("\n"):
            result.stop_reason = "newline"
            break
        if step == max_new_tokens - 1:
            break
        result.positions.append(next_position)
        current = _forward(model, torch.tensor([token]), torch.tensor([next_position]), relocated, torch.tensor([next_source]))[-1]
        next_position += 1
        next_source += 1
    if tokenizer is not None:
        ids = [t for t in result.token_ids if t not in eos]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        result.text = text.strip().split("\n")[0].strip() if stop_at_newline else text.strip()
    return result


def default_eos_ids(model, tokenizer=None) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple, set)) else [value])
    return {int(i) for i in ids}


def check_history_fits(model, history_length: int, allow_long: bool = False) -> None:
    """Refuse histories longer than the model's context unless explicitly allowed."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and history_length > limit and not allow_long:
        raise PositionError(
            f"history of {history_length} tokens exceeds the model's context ({limit}); trim the record or pass "
            "allow_long=True to accept positions past the trained range"
        )
