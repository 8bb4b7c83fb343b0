"""Relocated cache: the kept states of one selection, keys moved to one coordinate condition, each layer padded.

Axes: ``layer``, ``kv_head``, ``slot``, ``head_dim`` (:mod:`relaylens.geometry`).

:func:`build_cache` gathers the kept keys/values of the prefill, relocates keys to the condition's positions
(:func:`relaylens.geometry.rotary.relocate_keys`) and pads every layer to its own widest head, the validity mask
alongside (:class:`~relaylens.generation.attention.AttentionState`). :func:`relocate_selection` does the same work
without the cache object, for :mod:`relaylens.generation.rows` to stack rows. The question pass and decoding over such a
cache live in :mod:`relaylens.generation.rows` (batched) and :mod:`relaylens.generation.single` (one condition,
optionally with autograd).

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.generation.single import prefill_from_cache
    >>> from relaylens.geometry.rotary import RotaryFactors
    >>> from relaylens.geometry.selection import Selection
    >>> model = tiny_model("llama")
    >>> history = torch.arange(3, 23)
    >>> pre = prefill_from_cache(history, model(history[None], use_cache=True).cache, model)
    >>> sel = Selection.from_lists([[[2, 5, 19], [0, 9]]] * 2, pre.history_length)
    >>> relocated = build_cache(pre, sel, "relay", RotaryFactors.from_model(model))
    >>> relocated.state.key_positions[0].tolist(), relocated.widths
    ([[0, 1, 2], [1, 2, -1000000000]], [3, 3])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from relaylens.conditions.catalogue import Condition, Coordinates, check_coordinates
from relaylens.conditions.scoped import get_condition
from relaylens.errors import NonFiniteError, PositionError, ShapeError
from relaylens.generation.attention import AttentionState
from relaylens.geometry.real import is_real
from relaylens.geometry.rotary import RotaryFactors, layer_groups, relocate_keys, relocate_keys_unchecked
from relaylens.geometry.selection import Selection
from relaylens.model.hf import cache_from_tensors
from relaylens.model.prefill import PrefillResult


@dataclass
class RelocatedCache:
    """A cache ready for the question pass, and the attention state that goes with it."""

    cache: object  # a transformers DynamicCache (built by relaylens.model.hf.cache_from_tensors)
    state: AttentionState
    coordinates: Coordinates
    widths: list[int]  # per layer: slots kept in the cache (the layer's widest head)
    inputs: list[tuple[torch.Tensor,
                       torch.Tensor]] | None = None  # grad=True: per layer (keys, values) [kv_head, slot, D]


def keep_selected(prefill: PrefillResult, selection: Selection) -> PrefillResult:
    """A compacted copy of ``prefill`` holding only ``selection``'s kept keys and values (``[kv_head, slot,
    head_dim]`` per layer, padding slots read slot 0), for keeping many records in memory (``learned_geometry``).

    It serves this selection only (:attr:`PrefillResult.kept`): caches built from it equal those built from the
    whole prefill. Window queries and column sums are dropped (selection is done)."""
    _check_selection(prefill, selection)
    keys, values = [], []
    for layer in range(prefill.num_layers):
        index = selection.positions[layer].clamp_min(0)[..., None].expand(-1, -1, prefill.keys[layer].shape[-1])
        index = index.to(prefill.keys[layer].device)
        keys.append(prefill.keys[layer].gather(1, index))  # [kv_head, slot, head_dim]
        values.append(prefill.values[layer].gather(1, index))
    return dataclasses.replace(prefill, keys=keys, values=values, window_queries=None, column_sums=None, kept=selection)


def _check_selection(prefill: PrefillResult, selection: Selection) -> None:
    kept = prefill.kept
    if kept is not None and kept is not selection and not (
            kept.positions.shape == selection.positions.shape and torch.equal(kept.positions, selection.positions)
            and torch.equal(kept.valid, selection.valid)):
        raise ShapeError("this prefill was compacted to the kept states of another selection (keep_selected); build "
                         "caches for that selection only, or compact the whole prefill for this one")
    if selection.num_layers != prefill.num_layers or selection.num_kv_heads != prefill.num_kv_heads:
        raise ShapeError(
            f"selection is [{selection.num_layers} layers, {selection.num_kv_heads} kv heads] but the cache has "
            f"[{prefill.num_layers}, {prefill.num_kv_heads}]; select on the same model's prefill"
        )
    if kept is None and selection.history_length != prefill.history_length:
        raise ShapeError(
            f"selection indexes a history of {selection.history_length} tokens, the prefill has "
            f"{prefill.history_length}"
        )
    if selection.values is not None and selection.values.shape[-1] != prefill.values[0].shape[-1]:
        raise ShapeError(f"replacement values have head_dim {selection.values.shape[-1]}, the cache "
                         f"{prefill.values[0].shape[-1]}")


def build_cache(
    prefill: PrefillResult,
    selection: Selection,
    condition: str | Condition | Coordinates,
    factors: RotaryFactors,
    window_mode: str = "condition",
    grad: bool = False,
) -> RelocatedCache:
    """Gather kept states, relocate keys to the condition's positions, and pad each layer to its widest head.

    ``condition`` may also be ready-made :class:`~relaylens.conditions.catalogue.Coordinates` of ``selection``. Without
    ``grad``, a head whose every target position equals its source position (all of ``original``, and heads a
    scoped condition leaves alone) is not relocated: its kept keys are the gathered cache rows, so ``original``
    costs what a plain sparse cache costs.

    ``grad=True`` keeps autograd on: the graph reaches back to ``prefill`` keys/values that require grad, and
    otherwise the relocated keys and kept values become leaves that require grad (``RelocatedCache.inputs``).

    Real-valued coordinates (float64 ``key_positions``, e.g. :mod:`relaylens.conditions.family`) relocate through
    :func:`relaylens.geometry.real.relocate_real`; when they require grad, the relocated keys carry the graph back to
    them (every head is relocated; keys and values become no leaves unless ``grad``).
    """
    with torch.set_grad_enabled(grad or _tracked(condition)):
        layers = _relocate_layers(prefill, selection, condition, factors, window_mode, grad)
    data = [(keys[None], values[None]) for keys, values in layers.data]  # [1, kv_head, slot, head_dim]
    return RelocatedCache(cache_from_tensors(data), layers.state, layers.coordinates, layers.widths,
                          layers.data if grad else None)


def _gather_layer(prefill, selection, coords, layer: int):
    """One layer's kept states, cut to the layer's widest head: validity, source and target positions
    ``[kv_head, slot]``, kept keys and values ``[kv_head, slot, head_dim]`` (padding reads slot 0)."""
    valid = selection.valid[layer]  # [kv_head, slot]
    width = int(valid.sum(-1).max())
    valid = valid[:, :width]
    source = selection.positions[layer, :, :width].clamp_min(0)  # [kv_head, slot]
    target = torch.where(valid, coords.key_positions[layer, :, :width], source)  # float64 for real-valued coordinates
    keys = prefill.keys[layer]  # [kv_head, L, head_dim] (a compacted prefill: [kv_head, slot, head_dim])
    if prefill.kept is not None:
        kept_keys, kept_values = keys[:, :width], prefill.values[layer][:, :width]
    else:
        index = source[..., None].expand(-1, -1, keys.shape[-1]).to(keys.device)
        kept_keys = keys.gather(1, index)  # [kv_head, slot, head_dim]
        kept_values = prefill.values[layer].gather(1, index)
    if selection.values is not None:
        kept_values = selection.values[layer, :, :width].to(prefill.values[layer])
    return valid, source, target, kept_keys, kept_values


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
                f"coordinates {condition.condition!r} have key positions {tuple(condition.key_positions.shape)} but "
                f"the selection is {tuple(selection.positions.shape)}; build them from the same selection"
            )
        check_coordinates(condition.condition, condition.key_positions, selection.valid, condition.question_start,
                          at_question=condition.at_question)  # a move= scope may put a key at the question start
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
    return _relocate_layers(prefill, selection, condition, factors, window_mode, grad=False)


def _relocate_layers(prefill, selection, condition, factors, window_mode: str, grad: bool) -> RelocatedLayers:
    """Relocate every layer: the batched, synchronisation-free path (:func:`_relocate_batched`) for integer
    coordinates without autograd, the per-layer loop (:func:`_relocate_each_layer`) otherwise, and whenever the
    batched path finds something to refuse (the loop then raises the error that names the layer)."""
    _check_selection(prefill, selection)
    coords = coordinates_of(condition, selection)
    if not (grad or coords.key_positions.requires_grad or is_real(coords.key_positions)):
        try:
            batched = _relocate_batched(prefill, selection, coords, factors, window_mode)
        except (NonFiniteError, PositionError):
            batched = None  # the loop below raises it again, naming the layer and the condition
        if batched is not None:
            return batched
    return _relocate_each_layer(prefill, selection, coords, factors, window_mode, grad)


def _relocate_batched(prefill, selection, coords, factors, window_mode: str) -> RelocatedLayers | None:
    """Every layer at once, with at most one host read of device data per call (issue 51).

    Positions, validity and the layer widths are read once from the selection (CPU tensors: one host read for all
    layers and heads), copied to the cache's device once, the kept keys and values of every layer gathered into one
    ``[layer, kv_head, slot, head_dim]`` buffer per rotary group and relocated in one pass, and finiteness checked on
    the device with one synchronisation at the end. Returns None when that check fails or a position is outside the
    rotary range (the caller's per-layer loop then raises the precise error)."""
    num_layers, num_heads = prefill.num_layers, prefill.num_kv_heads
    valid_all = selection.valid  # [layer, kv_head, slot] bool, CPU
    source_all = selection.positions.clamp_min(0)  # [layer, kv_head, slot]
    target_all = torch.where(valid_all, coords.key_positions, source_all).to(torch.int64)
    moving_all = (target_all != source_all).any(-1).any(-1)  # [layer]
    extremes = torch.stack([source_all.min(), source_all.max(), target_all.min(), target_all.max()]) \
        if source_all.numel() else torch.zeros(4, dtype=torch.int64)
    summary = torch.cat([valid_all.sum(-1).amax(-1), moving_all.long(), extremes]).tolist()  # the one host read
    widths = summary[:num_layers]
    moving = [bool(m) for m in summary[num_layers:2 * num_layers]]
    low, high = min(summary[-4], summary[-2]), max(summary[-3], summary[-1])
    if low < 0 or high >= factors.position_limit:
        return None
    width = max(widths, default=0)
    device = prefill.keys[0].device
    source = source_all[:, :, :width].to(device, non_blocking=True)  # [layer, kv_head, W] on the cache's device
    target = target_all[:, :, :width].to(device, non_blocking=True)
    pad = (~valid_all[:, :, :width]).to(device, non_blocking=True)[..., None]  # [layer, kv_head, W, 1]
    head_dim, value_dim = prefill.keys[0].shape[-1], prefill.values[0].shape[-1]
    keys = torch.empty(num_layers, num_heads, width, head_dim, dtype=prefill.keys[0].dtype, device=device)
    values = torch.empty(num_layers, num_heads, width, value_dim, dtype=prefill.values[0].dtype, device=device)
    for layer in range(num_layers):  # gathers only: device work, no host reads
        if prefill.kept is not None:
            keys[layer] = prefill.keys[layer][:, :width]
            values[layer] = prefill.values[layer][:, :width]
        else:
            index = source[layer][..., None]  # [kv_head, W, 1]
            torch.gather(prefill.keys[layer], 1, index.expand(-1, -1, head_dim), out=keys[layer])
            torch.gather(prefill.values[layer], 1, index.expand(-1, -1, value_dim), out=values[layer])
    if selection.values is not None:
        values = selection.values[:, :, :width].to(device=device, dtype=values.dtype)
    for layer_arg, members in layer_groups(factors, num_layers):
        members = [layer for layer in members if moving[layer]]
        if not members:
            continue  # identity: every key stays where it was cached (a plain sparse cache)
        if len(members) == num_layers:
            keys = relocate_keys_unchecked(keys, source, target, factors, high + 1, layer_arg)
        else:
            rows = torch.tensor(members, device=device)
            moved = relocate_keys_unchecked(keys[rows], source[rows], target[rows], factors, high + 1, layer_arg)
            keys.index_copy_(0, rows, moved)
    values = values.masked_fill(pad, 0.0)
    finite = torch.isfinite(keys).all() & torch.isfinite(values).all()  # padding keys read slot 0, as the loop's do
    if not bool(finite):  # the one synchronisation
        return None
    keys = keys.masked_fill(pad, 0.0)
    state = AttentionState(window_mode=window_mode, head_inputs=None)
    far = torch.full((), -(10**9), dtype=torch.int64)
    key_positions = torch.where(valid_all, target_all, far)  # [layer, kv_head, slot], CPU: windows only
    source_positions = torch.where(valid_all, source_all, far)
    data = []
    for layer, kept in enumerate(widths):
        layer_keys, layer_values = keys[layer, :, :kept], values[layer, :, :kept]  # [kv_head, slot, head_dim]
        if kept < width:
            layer_keys, layer_values = layer_keys.contiguous(), layer_values.contiguous()
        data.append((layer_keys, layer_values))
        state.valid[layer] = valid_all[layer, :, :kept].contiguous()
        state.key_positions[layer] = key_positions[layer, :, :kept].contiguous()
        state.source_positions[layer] = source_positions[layer, :, :kept].contiguous()
    return RelocatedLayers(data, state, coords, list(widths))


def _relocate_each_layer(prefill, selection, coords, factors, window_mode: str, grad: bool) -> RelocatedLayers:
    """The per-layer relocation loop. Without ``grad`` only heads with a key to move are relocated (the others
    keep the gathered rows); with ``grad`` every head is, and keys and values that do not carry a graph become
    leaves that require grad."""
    tracked = coords.key_positions.requires_grad  # gradients w.r.t. positions: relocate every head
    state = AttentionState(window_mode=window_mode, head_inputs={} if grad else None)
    data, widths = [], []
    for layer in range(prefill.num_layers):
        valid, source, target, kept_keys, kept_values = _gather_layer(prefill, selection, coords, layer)
        everything = grad or tracked
        moving = torch.ones(valid.shape[0], dtype=torch.bool) if everything else (target != source).any(-1)  # [kv_head]
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
        if grad:
            moved, kept_values = (t if t.requires_grad else t.detach().requires_grad_() for t in (moved, kept_values))
        data.append((moved, kept_values))  # [kv_head, slot, head_dim]
        state.valid[layer] = valid
        target = target.detach()  # positions in the attention state serve windows only
        state.key_positions[layer] = torch.where(valid, target, torch.full_like(target, -(10**9)))
        state.source_positions[layer] = torch.where(valid, source, torch.full_like(source, -(10**9)))
        widths.append(valid.shape[-1])
    return RelocatedLayers(data, state, coords, widths)


def _tracked(condition) -> bool:
    """Whether ready-made coordinates carry autograd in their key positions."""
    return isinstance(condition, Coordinates) and condition.key_positions.requires_grad


def _check_finite(tensor: torch.Tensor, layer: int, what: str) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise NonFiniteError(f"layer {layer}: {what} contain NaN or inf; relaylens refuses to build a cache from them. "
                             "Fix: check the prefill cache (a float16 forward pass that overflowed, or replacement "
                             "values of a merging selector); run the model in float32 or bfloat16")
