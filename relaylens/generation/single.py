"""Relocated cache, synchronised question pass and greedy generation under one coordinate condition.

Axes: ``layer``, ``kv_head``, ``slot``, ``head_dim``; ``Q`` question tokens (:mod:`relaylens.geometry`).

Flow for one (record, selection, condition): :func:`relaylens.generation.cache.build_cache` gathers the kept keys/values
of the prefill, relocates keys to the condition's positions and pads every layer to its own widest head (validity mask
alongside); :func:`run_condition` runs the question at ``question_start .. question_start + Q - 1`` and decodes
greedily, the first generated token fed at ``question_start + Q`` and one position more per token.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.model.prefill import PrefillResult
    >>> from relaylens.geometry.selection import Selection
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

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from relaylens.conditions.catalogue import Condition, Coordinates
from relaylens.errors import ShapeError
from relaylens.generation.attention import attention_context
from relaylens.generation.cache import RelocatedCache, build_cache
from relaylens.generation.positions import new_token_phases, position_ids
from relaylens.generation.rows import GenerationResult, Row, run_rows
from relaylens.generation.settings import DecodeSettings
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.hf import attention_constants, cache_data, cache_from_tensors, cache_tensors
from relaylens.model.prefill import PrefillResult


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


def _forward(model, ids: torch.Tensor, positions: torch.Tensor, relocated: RelocatedCache,
             source_positions: torch.Tensor,
             grad: bool = False, factors: RotaryFactors | None = None, keep_logits: int | torch.Tensor = 0):
    """Feed ``ids`` ``[T]`` at ``positions`` ``[T]`` (long, or float64 possibly carrying autograd) over the relocated
    cache; logits ``[T or keep_logits, vocab]`` (``keep_logits``: a count of last tokens, or their indices)."""
    state = relocated.state
    state.new_positions = torch.cat((state.new_positions, positions.detach()))
    base = state.new_source_positions if state.new_source_positions is not None else torch.zeros(0, dtype=torch.long)
    state.new_source_positions = torch.cat((base, source_positions))
    device = model.device
    if positions.is_floating_point() and factors is None:
        factors = RotaryFactors.from_model(model)
    with torch.set_grad_enabled(grad), attention_context(model, state), new_token_phases(model, factors,
                                                                                         positions[None]):
        out = model(
            input_ids=ids[None].to(device),
            position_ids=position_ids(positions)[None].to(device),
            cache=relocated.cache,
            use_cache=True,
            logits_to_keep=keep_logits,
        )
    logits = out.logits[0]  # [T, vocab]
    return logits if grad and logits.dtype == torch.float64 else logits.float()


def _fork(relocated: RelocatedCache) -> RelocatedCache:
    """A copy sharing the tensors (and their graph): cache updates concatenate, so neither side sees the other's."""
    layers = cache_data(relocated.cache)
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
    settings: DecodeSettings | None = None,
    *,
    observers: list | None = None,
    keep_question_logits: bool = False,
    teacher_token: int | None = None,
    teacher_observers: list | None = None,
    grad: bool = False,
    **options,
) -> GenerationResult:
    """Question pass at the condition's coordinates, then greedy decoding with consecutive positions.

    Args:
        question_ids: ``[Q]`` question tokens (everything after the history, including the generation prompt).
        settings: limits, stops, windows and the decoding path
            (:class:`~relaylens.generation.settings.DecodeSettings`: ``max_new_tokens`` (0: question pass only),
            ``eos_token_ids``, ``tokenizer``, ``stop_at_newline``, ``window_mode``, ``factors``, ``decoding``);
            ``options``: the same fields as loose keywords.
        observers: attention observers active during the question pass only (probes).
        teacher_token: a token (e.g. the first reference-answer token) fed at the next continuation position on a
            copy of the cache, with ``teacher_observers`` active; decoding itself is unaffected.
        grad: run the question pass (and the teacher-forced token) with autograd on the retained keys and values:
            ``result.question_logits`` / ``result.teacher_logits`` carry the graph back to
            ``result.inputs`` (per layer ``(keys, values)``) and to per-query-head views of them
            (``result.head_inputs``, see :class:`~relaylens.generation.attention.AttentionState`). Decoding still runs
            without autograd, as one row of :func:`relaylens.generation.rows.run_rows` (a second question pass, no
            graph). Default: no autograd.

    Without ``grad`` this is :func:`relaylens.generation.rows.run_rows` with one row; batch a record's conditions with
    ``run_rows``.
    """
    settings = DecodeSettings.build(settings, **options)
    if not grad:  # one row of relaylens.generation.rows.run_rows (the batched path, batch of one)
        row = Row(selection, condition, tuple(observers or ()), tuple(teacher_observers or ()))
        return run_rows(model, prefill, [row], question_ids, settings, keep_question_logits=keep_question_logits,
                        teacher_token=teacher_token)[0]
    max_new_tokens, window_mode = settings.max_new_tokens, settings.window_mode
    factors = settings.factors or RotaryFactors.from_model(model)
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0:
        raise ShapeError("the question has no tokens; render the prompt with a question block")
    relocated = build_cache(prefill, selection, condition, factors, window_mode, grad=grad)
    coords = relocated.coordinates
    positions = coords.question_positions(question_ids.numel())
    label = str(coords.condition)
    fix = ("Fix: use a smaller shift, a shorter history or fewer --max-new-tokens, or a model with a longer context"
           if "shift" in label else "Fix: use shorter records or fewer --max-new-tokens, or a model with a longer "
                                    "context "
           "(this condition has no shift to reduce)")
    factors.check_any_positions(positions[-1:].detach() + max(max_new_tokens, 0),
                                f"condition {label}: question/generation positions", fix=fix)
    source = torch.arange(question_ids.numel()) + prefill.history_length
    relocated.state.observers = list(observers or [])
    logits = _forward(model, question_ids, positions, relocated, source, grad, factors)  # [Q, vocab]
    relocated.state.observers = []
    teacher_logits = None
    if teacher_token is not None:
        forked = _fork(relocated)
        forked.state.observers = list(teacher_observers or [])
        teacher_logits = _forward(model, torch.tensor([int(teacher_token)]), positions[-1:] + 1, forked,
                                  source[-1:] + 1, grad,
                                  factors)[-1]
        del forked
    result = GenerationResult(coords.condition, coords.question_start, positions, logits[-1].detach().clone(),
                              question_logits=logits if keep_question_logits or grad else None,
                              teacher_logits=teacher_logits, inputs=relocated.inputs,
                              head_inputs=relocated.state.head_inputs)
    if max_new_tokens > 0:  # decoding runs without autograd, in the one greedy loop of the batched path
        decoded = run_rows(model, prefill, [Row(selection, coords)], question_ids, settings, factors=factors)[0]
        result.token_ids, result.positions = decoded.token_ids, decoded.positions
        result.stop_reason, result.text = decoded.stop_reason, decoded.text
    return result


@contextlib.contextmanager
def frozen_weights(model) -> Iterator[None]:
    """Inside, no model parameter requires grad (a backward pass w.r.t. positions or caches computes no weight
    gradients); each parameter's flag is restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def answer_log_probs(
    model,
    prefill: PrefillResult,
    selection: Selection,
    condition: str | Condition | Coordinates,
    question_ids: torch.Tensor,
    answer_ids: torch.Tensor,
    factors: RotaryFactors | None = None,
    window_mode: str = "condition",
) -> torch.Tensor:
    """``[A]`` log-probabilities of the answer tokens, teacher-forced right after the question under a condition.

    One forward pass feeds the question and every answer token but the last (at ``question_start + j``); the logits
    of the final question token score ``answer_ids[0]``, those of ``answer_ids[j]`` score ``answer_ids[j + 1]``. When
    the condition's coordinates carry autograd (real-valued positions of :mod:`relaylens.conditions.family` built from
    parameters that require grad) the result does too: ``log_probs.sum().backward()`` reaches the parameters (wrap
    it in :func:`frozen_weights` to skip weight gradients). Float32 (float64 for a float64 model).
    """
    factors = factors or RotaryFactors.from_model(model)
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    answer_ids = torch.as_tensor(answer_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0 or answer_ids.numel() == 0:
        raise ShapeError("answer_log_probs needs question tokens and at least one answer token")
    relocated = build_cache(prefill, selection, condition, factors, window_mode)
    coords = relocated.coordinates
    ids = torch.cat((question_ids, answer_ids[:-1]))  # [Q + A - 1]
    positions = coords.question_positions(ids.numel())
    factors.check_any_positions(positions[-1:].detach(), f"condition {coords.condition}: question/answer positions",
                                fix="Fix: use shorter records or answers, or a model with a longer context")
    source = torch.arange(ids.numel()) + prefill.history_length
    tracked = coords.key_positions.requires_grad or positions.requires_grad
    # the scored rows by index: transformers gathers them into a contiguous tensor, so the unembedding is one matrix
    # product (a count would slice a strided view, and matmul would copy the whole [vocab, hidden] weight for it)
    rows = torch.arange(ids.numel() - answer_ids.numel(), ids.numel(), device=model.device)
    logits = _forward(model, ids, positions, relocated, source, grad=tracked, factors=factors,
                      keep_logits=rows)  # [A, vocab]
    logits = logits[-answer_ids.numel():]
    log_probs = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    return log_probs.gather(-1, answer_ids[:, None].to(log_probs.device))[:, 0]
