"""TransformerLens backend for the evidence-reading probes: the same readouts, read from ``blocks.{l}.attn`` hooks.

Backend (a), :func:`relaylens.probes.readouts.probe_condition`, records the final question token inside the
``relaylens`` attention function. This backend runs the same question pass through a TransformerLens 4.3
``TransformerBridge`` and reads the hook names interpretability users know:

* ``blocks.{l}.attn.hook_attn_scores`` ``[batch, q_head, query, key]`` (pre-softmax): per-(layer, kv_head)
  validity of the relocated history is applied here (``-inf`` on padded slots, kv heads repeated to query heads);
* ``blocks.{l}.attn.hook_pattern`` ``[batch, q_head, query, key]`` (post-softmax): the final query token's row;
* ``blocks.{l}.attn.hook_rot_q`` ``[batch, query, q_head, head_dim]`` (post-rotary): the final token's query.

The history values are read from the relocated cache the pass attended over (``hook_v`` only sees the new tokens).
:func:`question_pass_with_cache` runs the same pass through ``run_with_cache`` and also returns TransformerLens's
``ActivationCache`` (:mod:`relaylens.integrations.tl_export` builds its exports on it).
Both backends feed one :class:`~relaylens.probes.readouts.FinalTokenRecorder` into the one
:func:`~relaylens.probes.readouts.readouts` definition, so the numbers agree by construction of the inputs, not by
copying.

Two things are needed to make the bridge run a relocated cache, both scoped to a ``with`` block:

* :func:`cache_kwarg_shim`: TransformerLens 4.3 looks for ``past_key_values`` / ``layer_past`` in
  ``AttentionBridge._update_kv_cache``, but transformers 5.24's decoder layers pass ``cache=``; the cache is silently
  ignored (wrong logits, cache not extended). The shim maps ``cache`` to ``past_key_values`` while active, and
  switches itself off when a behavioural probe finds that the installed method already reads ``cache``.
* :func:`ragged_attention_config`: the wrapped model's attention kernel is switched to ``"relaylens"``
  (registered without a mask function), so transformers builds no layer-0-sized mask and layers of different widths
  work; the bridge then builds its own causal mask per layer.

Axes: ``layer``, ``q_head``, ``kv_head``, ``query``, ``key``, ``head_dim`` (:mod:`relaylens.geometry`).

Example:
    >>> import torch
    >>> from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    >>> before = AttentionBridge.__dict__["_update_kv_cache"]
    >>> with cache_kwarg_shim() as active:
    ...     patched = AttentionBridge.__dict__["_update_kv_cache"] is not before
    >>> active == patched, AttentionBridge.__dict__["_update_kv_cache"] is before
    (True, True)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import pandas as pd
import torch

from relaylens.conditions.catalogue import Condition
from relaylens.errors import RelaylensError
from relaylens.generation.attention import ATTENTION_NAME, AttentionState, window_allow
from relaylens.generation.cache import RelocatedCache, build_cache
from relaylens.generation.rows import GenerationResult
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.hf import (
    attention_kernel,
    attention_window,
    cache_lengths,
    cached_values,
    decoder_layers,
    layer_attention,
)
from relaylens.model.prefill import PrefillResult
from relaylens.probes.readouts import FinalTokenRecorder, ProbedCondition, gold_slots, readouts

HOOK_SCORES = "blocks.{layer}.attn.hook_attn_scores"
HOOK_PATTERN = "blocks.{layer}.attn.hook_pattern"
HOOK_ROT_Q = "blocks.{layer}.attn.hook_rot_q"


# ----------------------------------------------------------------------------------------------------------------
# the cache= compatibility shim


def _attention_bridge_class():
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge  # noqa: PLC0415 - import cost: transformer_lens loads on first use

    return AttentionBridge


def update_reads_cache_kwarg(update=None) -> bool:
    """Behavioural probe: does ``update`` (default: the installed ``AttentionBridge._update_kv_cache``) use ``cache=``?

    Calls the unbound method on a stand-in ``self`` with a fake cache passed only as ``cache=`` and reports whether
    the fake's ``update`` was called. Needs no model.
    """
    update = update or _attention_bridge_class()._update_kv_cache
    calls = []

    class _FakeCache:
        def update(self, k, v, layer_idx, *args, **kwargs):
            calls.append(layer_idx)
            return k, v

    k = v = torch.zeros(1, 1, 1, 1)
    update(SimpleNamespace(_layer_idx=0, name="relaylens-probe"), k, v, cache=_FakeCache())
    return bool(calls)


def shim_needed() -> bool:
    """True when the installed TransformerLens ignores transformers' ``cache=`` keyword (TransformerLens 4.3)."""
    bridge_class = _attention_bridge_class()
    if "_update_kv_cache" not in bridge_class.__dict__:
        return False  # a refactored TransformerLens: nothing to patch (the cache-length check still guards passes)
    try:
        return not update_reads_cache_kwarg(bridge_class._update_kv_cache)
    except Exception as exc:  # a changed signature: the shim would not fit either
        warnings.warn(f"cannot probe AttentionBridge._update_kv_cache ({exc!r}); the cache= shim stays off and every "
                      "bridge pass is checked for an extended cache instead", RuntimeWarning, stacklevel=2)
        return False


@contextlib.contextmanager
def cache_kwarg_shim(enable: bool | None = None) -> Iterator[bool]:
    """Map ``cache=`` to ``past_key_values=`` in ``AttentionBridge._update_kv_cache`` inside this block only.

    Args:
        enable: ``None`` (default) patches only when :func:`shim_needed`; ``False`` never patches (to show the bug);
            ``True`` patches whenever the method exists.

    Yields whether the patch is active. The original method is restored in ``finally``, also after errors; nested
    blocks are no-ops (the outer patch already reads ``cache``). The patch is on the class, so while the block runs
    it also applies to other bridges in other threads (harmless: it only adds the keyword they were missing).
    """
    bridge_class = _attention_bridge_class()
    active = shim_needed() if enable is None else bool(enable and "_update_kv_cache" in bridge_class.__dict__)
    if not active:
        yield False
        return
    original = bridge_class.__dict__["_update_kv_cache"]

    @functools.wraps(original)
    def _update_kv_cache(self, k, v, **kwargs):
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
            kwargs["past_key_values"] = kwargs["cache"]
        return original(self, k, v, **kwargs)

    _update_kv_cache.relaylens_shim = True
    bridge_class._update_kv_cache = _update_kv_cache
    try:
        yield True
    finally:
        bridge_class._update_kv_cache = original


# ----------------------------------------------------------------------------------------------------------------
# wrapping a model


def _placeholder_tokenizer():
    """A minimal fast tokenizer (three special tokens, word level): TransformerLens needs a tokenizer object even
    when it is driven with token ids only."""
    from tokenizers import Tokenizer, models  # noqa: PLC0415 - import cost: tokenizers loads on first use
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - import cost: it loads tokenizers

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>")),
                                   eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>")


def _bridge_tokenizer(tokenizer):
    """A copy the bridge may normalise; TransformerLens would otherwise re-load it from ``name_or_path``."""
    if tokenizer is None:
        tokenizer = _placeholder_tokenizer()  # the probes drive the bridge with token ids only
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.init_kwargs.setdefault("name_or_path", getattr(tokenizer, "name_or_path", "") or "relaylens")
    tokenizer.init_kwargs["add_bos_token"] = True  # keep TransformerLens from re-loading it (offline machines)
    return tokenizer


def bridge_model(model, tokenizer=None, copy_model: bool = True):
    """Wrap a Hugging Face causal LM in a TransformerLens ``TransformerBridge`` (float32 compute as loaded).

    ``TransformerBridge.boot_transformers(hf_model=...)`` changes the model **in place** (forces eager attention and
    swaps in bridge components), so by default a deep copy is wrapped and ``model`` stays usable for backend (a);
    ``copy_model=False`` saves the memory of a second copy when the HF model is not needed any more.
    ``tokenizer`` only matters for the bridge's string helpers (``to_tokens``, text ``generate``); the probes pass
    token ids, and without one a tiny placeholder tokenizer is attached.
    """
    from transformer_lens.model_bridge import TransformerBridge  # noqa: PLC0415 - import cost: transformer_lens loads on first use

    factors = RotaryFactors.from_model(model)  # before wrapping: the bridge's modules hide the rotary layout
    hf_model = copy.deepcopy(model) if copy_model else model
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    overrides = None if getattr(model.config, "architectures", None) else {"architectures": [type(model).__name__]}
    bridge = TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=_bridge_tokenizer(tokenizer),
                                                 device=hf_model.device, dtype=hf_model.dtype,
                                                 hf_config_overrides=overrides)
    bridge.relaylens_factors = factors
    return bridge.eval()


def _is_bridge(obj) -> bool:
    return hasattr(obj, "original_model") and hasattr(obj, "hooks")


@contextlib.contextmanager
def ragged_attention_config(bridge) -> Iterator[None]:
    """Switch the wrapped model's attention kernel to ``"relaylens"`` (no mask function) inside this block only
    (:func:`relaylens.model.hf.attention_kernel`; restored on exit).

    transformers then passes ``attention_mask=None`` and the bridge builds its own causal mask per layer, so layers
    of different cache widths work. The ``relaylens`` function itself is never called by the bridge (it reimplements
    attention); if an architecture's bridge did call it, it would raise outside ``attention_context``.
    """
    with attention_kernel(bridge.original_model, ATTENTION_NAME):
        yield


# ----------------------------------------------------------------------------------------------------------------
# the probed pass


class _BridgeRecorder:
    """Hooks on one bridge pass: mask invalid history slots, keep the final token's row and query per layer."""

    def __init__(self, relocated: RelocatedCache, groups: int, windows: dict[int, int]):
        self.relocated, self.groups, self.windows = relocated, groups, windows
        self.record = FinalTokenRecorder()

    def fwd_hooks(self, num_layers: int) -> list:
        hooks = []
        for layer in range(num_layers):
            hooks.append((HOOK_SCORES.format(layer=layer), functools.partial(self.mask_scores, layer)))
            hooks.append((HOOK_PATTERN.format(layer=layer), functools.partial(self.keep_row, layer)))
            hooks.append((HOOK_ROT_Q.format(layer=layer), functools.partial(self.keep_query, layer)))
        return hooks

    def mask_scores(self, layer, scores, hook):  # scores [B, q_head, query, key]
        state = self.relocated.state
        valid = state.valid.get(layer)
        history = 0 if valid is None else valid.shape[-1]
        if scores.shape[-1] < history + scores.shape[-2]:
            raise RelaylensError(
                f"layer {layer}: the bridge attended over {scores.shape[-1]} keys for {scores.shape[-2]} new tokens "
                f"but the relocated cache holds {history} history slots: it ignored transformers' cache= keyword; run "
                "the pass inside relaylens.probes.transformer_lens.cache_kwarg_shim()"
            )
        allow = torch.ones(scores.shape[1:], dtype=torch.bool, device=scores.device)  # [q_head, query, key]
        if valid is not None:
            allow[..., :history] = valid.to(scores.device).repeat_interleave(self.groups, 0)[:, None, :]
        if layer in self.windows:
            window = window_allow(state, layer, history, scores.shape[-1], scores.shape[-2], self.windows[layer],
                                  scores.device)
            allow &= window.repeat_interleave(self.groups, 0) if window.shape[0] > 1 else window
        return scores.masked_fill(~allow[None], float("-inf"))

    def keep_row(self, layer, pattern, hook):  # pattern [B, q_head, query, key]
        valid = self.relocated.state.valid.get(layer)
        width = 0 if valid is None else valid.shape[-1]
        values = cached_values(self.relocated.cache, layer)  # [B, kv_head, slot, D]
        self.record.widths[layer] = width
        self.record.rows[layer] = pattern[0, :, -1].detach().float().clone()
        self.record.values[layer] = values[0, :, :width].detach().float().clone()  # [kv_head, slot, D]
        return pattern

    def keep_query(self, layer, query, hook):  # query [B, query, q_head, head_dim]
        self.record.queries[layer] = query[0, -1].detach().float().clone()
        return query


def _sliding_windows(bridge) -> dict[int, int]:
    """Sliding-window size per layer of the wrapped model (layers without a window are absent)."""
    windows = {}
    for index, layer in enumerate(decoder_layers(bridge.original_model)):
        attn = layer_attention(layer)
        hf_attn = getattr(attn, "original_component", attn)  # bridge component -> HF module
        window = attention_window(hf_attn)
        if window:
            windows[index] = int(window)
    return windows


def question_pass_tl(bridge, relocated: RelocatedCache, ids: torch.Tensor, positions: torch.Tensor,
                     source_positions: torch.Tensor, groups: int, shim: bool | None = None,
                     check_cache: bool = True) -> tuple[torch.Tensor, FinalTokenRecorder]:
    """One bridge forward over ``relocated`` (extended in place) with the probe hooks; ``[T, vocab]`` logits.

    ``shim``: see :func:`cache_kwarg_shim`. ``check_cache`` raises when the pass did not extend every layer of the
    cache by the new tokens, i.e. when the bridge ignored the cache (TransformerLens 4.3 without the shim).
    """
    logits, record, _ = _bridge_pass(bridge, relocated, ids, positions, source_positions, groups, shim, check_cache)
    return logits, record


def question_pass_with_cache(bridge, relocated: RelocatedCache, ids: torch.Tensor, positions: torch.Tensor,
                             source_positions: torch.Tensor, groups: int, names_filter=None,
                             shim: bool | None = None, check_cache: bool = True):
    """:func:`question_pass_tl` through TransformerLens's ``run_with_cache``: ``([T, vocab] logits, ActivationCache,
    FinalTokenRecorder)``.

    The cache holds every hook of the pass (or those ``names_filter`` selects, TransformerLens's argument) for the
    ``T`` new tokens; attention hooks (``hook_attn_scores``, ``hook_pattern``) have a key axis of the layer's history
    slots of ``relocated`` (``relocated.widths[layer]``, padded slots masked: ``-inf`` scores, zero pattern) followed
    by the new tokens. Positions: ``positions`` (the condition's), not ``0..T-1``.
    """
    logits, record, activations = _bridge_pass(bridge, relocated, ids, positions, source_positions, groups, shim,
                                               check_cache, with_cache=True, names_filter=names_filter)
    return logits, activations, record


def _bridge_pass(bridge, relocated, ids, positions, source_positions, groups, shim, check_cache, with_cache=False,
                 names_filter=None):
    state: AttentionState = relocated.state
    state.new_positions = torch.cat((state.new_positions, positions))
    base = state.new_source_positions if state.new_source_positions is not None else torch.zeros(0, dtype=torch.long)
    state.new_source_positions = torch.cat((base, source_positions))
    before = cache_lengths(relocated.cache)
    recorder = _BridgeRecorder(relocated, groups, _sliding_windows(bridge))
    device = next(bridge.original_model.parameters()).device
    kwargs = dict(return_type="logits", position_ids=positions[None].to(device), cache=relocated.cache, use_cache=True)
    activations = None
    with torch.no_grad(), cache_kwarg_shim(shim), ragged_attention_config(bridge), \
            bridge.hooks(fwd_hooks=recorder.fwd_hooks(len(before))):
        if with_cache:
            logits, activations = bridge.run_with_cache(ids[None].to(device), names_filter=names_filter, **kwargs)
        else:
            logits = bridge(ids[None].to(device), **kwargs)
    if check_cache:
        after = cache_lengths(relocated.cache)
        stale = [l for l, (b, a) in enumerate(zip(before, after)) if a != b + ids.numel()]
        if stale:
            raise RelaylensError(
                f"the TransformerLens bridge did not extend the cache in layers {stale[:8]} (widths {before[:3]}... -> "
                f"{after[:3]}...): it ignored transformers' cache= keyword, so the pass read no history; run it "
                "inside relaylens.probes.transformer_lens.cache_kwarg_shim()"
            )
    return logits[0].float(), recorder.record, activations


def probe_condition_tl(bridge_or_model, prefill: PrefillResult, selection: Selection, condition: str | Condition,
                       question_ids: torch.Tensor, evidence_mask: torch.Tensor, factors: RotaryFactors | None = None,
                       teacher_token: int | None = None, tokenizer=None, window_mode: str = "condition",
                       shim: bool | None = None) -> ProbedCondition:
    """Backend (b) of :func:`relaylens.probes.readouts.probe_condition`: the question pass (and optional teacher-forced
    token) through a TransformerLens bridge, readouts from its hooks. No greedy decoding (``generation.token_ids`` is
    empty).

    Args:
        bridge_or_model: a ``TransformerBridge`` (boot it once with :func:`bridge_model`), or a Hugging Face model,
            which is then wrapped on a deep copy for this call only (costly; prefer booting once).
        factors: rotary factors of the model (default: those :func:`bridge_model` read before wrapping).
        shim: see :func:`cache_kwarg_shim` (default: automatic).

    Returns a :class:`~relaylens.probes.readouts.ProbedCondition` whose ``readouts`` match backend (a)'s columns
    (``layer, head, metric, value, probe_point``) and whose ``question_recorder`` feeds phase replay.

    Precision: ``hook_pattern`` holds the softmax cast to the model dtype, backend (a) keeps float32 rows; the two
    agree to float32 rounding for float32 models, to the dtype's rounding for bf16/fp16 ones.
    """
    bridge = bridge_or_model if _is_bridge(bridge_or_model) else bridge_model(bridge_or_model, tokenizer)
    factors = factors or getattr(bridge, "relaylens_factors", None)
    if factors is None:
        raise RelaylensError("pass factors=RotaryFactors.from_model(hf_model) for a bridge not booted by "
                             "bridge_model()")
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0:
        raise RelaylensError("the question has no tokens; render the prompt with a question block")
    gold = gold_slots(selection, evidence_mask)
    groups = prefill.num_key_value_groups
    relocated = build_cache(prefill, selection, condition, factors, window_mode)
    coords = relocated.coordinates
    positions = coords.question_positions(question_ids.numel())
    factors.check_positions(positions[-1:] + 1, f"condition {coords.condition}: question positions")
    source = torch.arange(question_ids.numel()) + prefill.history_length
    logits, question_recorder = question_pass_tl(bridge, relocated, question_ids, positions, source, groups, shim)
    frames = [readouts(question_recorder, selection, gold, groups).assign(probe_point="question_final")]
    if teacher_token is not None:
        forked = copy.deepcopy(relocated)  # the token continues the question on a copy, as in backend (a)
        _, teacher_recorder = question_pass_tl(bridge, forked, torch.tensor([int(teacher_token)]),
                                               positions[-1:] + 1, source[-1:] + 1, groups, shim)
        frames.append(readouts(teacher_recorder, selection, gold, groups).assign(probe_point="first_answer_token"))
    generation = GenerationResult(coords.condition, coords.question_start, positions, logits[-1].clone())
    return ProbedCondition(generation.condition, generation, pd.concat(frames, ignore_index=True), question_recorder)
