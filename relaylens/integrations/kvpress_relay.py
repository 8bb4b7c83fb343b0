"""RoPERelay as a kvpress press: ``RelayPress(press)`` keeps exactly the states ``press`` keeps, then moves the kept
keys to RoPERelay's compact, right-aligned rotary coordinates, so the question runs right after them.

Self-contained on purpose: this file imports only torch and kvpress (and the transformers kvpress pins, through
kvpress), never another relaylens module, so it runs in kvpress's own environment. Use it from an installed
relaylens (``pip install --no-deps relaylens`` next to kvpress) or copy this one file.

Geometry (relaylens's ``relay`` condition, the paper's RoPERelay). A kv head ``h`` of layer ``l`` that keeps ``m``
states with source positions ``p_0 < ... < p_{m-1}`` moves them to ``p'_i = M - m + i``, where ``M`` is the largest
kept count over every (layer, kv head) of the sequence: every head's history ends at ``M - 1``. Keys become
``K'_i = R(p'_i) R(p_i)^-1 K_i`` with the model's own cos/sin (for scaled rotary, e.g. YaRN, the amplitude ``a`` is
undone by dividing by ``c^2 + s^2 = a^2``), in float32, cast back, in the model's own rotary layout (split-half:
Llama, Qwen, Phi; interleaved: Cohere, GLM; read off its ``rotate_half``, :func:`rotary_layout`); partial rotary
leaves the other features alone; values are never touched.

Cache layout. After the prefill every layer holds ``M`` slots and slot ``j`` carries rotary position ``j``: head
``(l, h)`` puts its kept states in source order into slots ``M - m .. M - 1``; slots ``0 .. M - m - 1`` are padding
(zero key and value) that no query attends to: with sdpa or eager attention a per-head attention mask gives them
exactly zero weight (:func:`set_padding`); with other kernels (flash attention) kvpress's own head-wise fake keys
hide them (``module.masked_key_indices``, AdaKVPress's mechanism; the weight underflows, not exactly zero). Which
slots are padding is recorded on the cache itself (``cache.relay_padding``), so a deep copy of a compressed cache
and several compressed caches of one model each answer with their own mask. A uniform budget (every head keeps
``M``) needs no padding. Because every layer is ``M`` long, kvpress's pipeline, which starts the question at the
cache length for a ``KeyRerotationPress`` (this press is one), runs the question at ``M .. M + Q - 1`` and decodes
from ``M + Q``; ``model.generate`` on such a cache does the same. Uneven per-layer budgets (PyramidKV), which
kvpress 0.5.5's pipeline cannot answer after, run too: every layer is ``M`` long.

Supported presses: any ``ScorerPress`` that selects with ``ScorerPress.compress`` (SnapKV, Knorm, ExpectedAttention,
StreamingLLM, TOVA, KeyDiff, LagKV, CUR, Cap, NonCausalAttn, ObservedAttention, Random, LeverageScore, Compactor,
QFilter, KVzap, CriticalKV, ...), ``PyramidKVPress`` (one budget per layer) and the head-wise ``AdaKVPress`` /
``CriticalAdaKVPress`` (one budget per kv head). Anything else is refused when the press is built.

Axes: ``layer``, ``kv_head``, ``slot``, ``head_dim`` (as in :mod:`relaylens.geometry`); ``M`` the largest kept count.

Example (the compact positions of two heads keeping 3 and 1 states, ``M = 3``):
    >>> compact_positions(torch.tensor([[3, 1]]), 3).tolist()
    [[[0, 1, 2], [-1, -1, 2]]]
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from kvpress import AdaKVPress, KeyRerotationPress, PyramidKVPress, ScorerPress
from kvpress.presses.criticalkv_press import CriticalAdaKVPress
from kvpress.utils import compute_n_kept

__all__ = ["RelayPress", "RelayPressError", "compact_positions", "relocate"]

HEADWISE = (AdaKVPress, CriticalAdaKVPress)  # presses that keep the full cache and mask the evicted keys per head


class RelayPressError(ValueError):
    """A press, model or input RelayPress cannot relocate exactly; the message says what arrived and the fix."""


def compact_positions(counts: torch.Tensor, width: int) -> torch.Tensor:
    """RoPERelay's target positions in the right-aligned cache layout: ``[..., kv_head, width]`` long.

    ``counts`` ``[..., kv_head]`` are the kept counts ``m``; slot ``j`` of a head holds position ``j`` when
    ``j >= width - m`` (a kept state, ``p'_i = width - m + i``) and ``-1`` in the padding before it.

    >>> compact_positions(torch.tensor([2, 4]), 4).tolist()
    [[-1, -1, 2, 3], [0, 1, 2, 3]]
    """
    slots = torch.arange(width, device=counts.device)
    return torch.where(slots >= width - counts[..., None], slots, torch.full_like(slots, -1))


LAYOUTS = ("split_half", "interleaved")  # how a model pairs the rotated features into planes (its rotate_half)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _planes(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinates ``(x_1, x_2)`` of every rotary plane of ``x`` ``[..., rotary_dim]``: ``[..., plane]`` each."""
    if layout == "split_half":
        half = x.shape[-1] // 2
        return x[..., :half], x[..., half:]
    return x[..., 0::2], x[..., 1::2]


def _join(x1: torch.Tensor, x2: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of :func:`_planes`: ``[..., rotary_dim]``."""
    if layout == "split_half":
        return torch.cat((x1, x2), dim=-1)
    return torch.stack((x1, x2), dim=-1).flatten(-2)


def _plane_phases(table: torch.Tensor) -> torch.Tensor:
    """Per-plane values ``[..., plane]`` of a ``cos`` or ``sin`` table ``[..., rotary_dim]`` as the model's rotary
    embedding returns it: ``cat(f, f)`` (Llama, GLM) or ``f`` repeated pairwise (Cohere)."""
    half = table.shape[-1] // 2
    if torch.equal(table[..., :half], table[..., half:]):
        return table[..., :half]
    return table[..., 0::2]


def relocate(keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor, rotary,
             layout: str = "split_half") -> torch.Tensor:
    """``K' = R(target) R(source)^-1 K`` for post-rotary keys ``[..., n, head_dim]``.

    ``source`` and ``target`` are ``[..., n]`` integer positions; ``rotary(x, position_ids)`` is the model's rotary
    embedding (``model.model.rotary_emb``), returning ``cos, sin`` ``[1, N, rotary_dim]`` (amplitude included; as
    ``cat(f, f)`` or pairwise-repeated ``f``). ``layout`` is how the model's ``rotate_half`` pairs features into
    planes: ``"split_half"`` (feature ``i`` with ``i + rotary_dim / 2``: Llama, Qwen, Phi) or ``"interleaved"``
    (``2i`` with ``2i + 1``: Cohere, GLM); :func:`rotary_layout` reads it off the model. Arithmetic in float32
    (float64 for float64 keys), result in the keys' dtype; features past ``rotary_dim`` are copied unchanged.

    >>> class Rotary:  # RoPE with theta 10000 on head_dim 4 and amplitude 1.5 (YaRN-like)
    ...     def __call__(self, x, position_ids):
    ...         inv = 1.0 / 10000 ** (torch.arange(0, 4, 2, dtype=torch.float32) / 4)
    ...         freqs = position_ids[..., None].float() * inv
    ...         emb = torch.cat((freqs, freqs), -1)
    ...         return 1.5 * emb.cos(), 1.5 * emb.sin()
    >>> content = torch.randn(3, 4)
    >>> cos, sin = Rotary()(None, torch.tensor([[5, 9, 11]]))
    >>> cached = content * cos[0] + _rotate_half(content) * sin[0]  # what the model caches at 5, 9, 11
    >>> moved = relocate(cached, torch.tensor([5, 9, 11]), torch.tensor([0, 1, 2]), Rotary())
    >>> cos, sin = Rotary()(None, torch.tensor([[0, 1, 2]]))
    >>> torch.allclose(moved, content * cos[0] + _rotate_half(content) * sin[0], atol=1e-5)
    True
    """
    if layout not in LAYOUTS:
        raise RelayPressError(f"rotary layout {layout!r} is not one of {LAYOUTS}: pass rotary_layout(model)")
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    x = keys.to(work)
    shape = x.shape[:-1]
    positions = torch.stack((source.expand(shape), target.expand(shape))).reshape(1, -1).to(x.device)  # [1, 2N]
    cos, sin = rotary(x.float(), positions)  # [1, 2N, rotary_dim]
    rotary_dim = cos.shape[-1]
    c = _plane_phases(cos.to(work)).reshape(2, *shape, rotary_dim // 2)  # [2 (source, target), ..., n, plane]
    s = _plane_phases(sin.to(work)).reshape(2, *shape, rotary_dim // 2)
    x1, x2 = _planes(x[..., :rotary_dim], layout)
    norm = c[0] * c[0] + s[0] * s[0]  # a^2: R(p)^-1 = (c - i s) / a^2
    u1, u2 = (x1 * c[0] + x2 * s[0]) / norm, (x2 * c[0] - x1 * s[0]) / norm  # the content, R(p)^-1 K
    moved = _join(u1 * c[1] - u2 * s[1], u1 * s[1] + u2 * c[1], layout)  # R(p') ...
    return torch.cat((moved, x[..., rotary_dim:]), dim=-1).to(keys.dtype)


def rotary_layout(model) -> str:
    """``"split_half"`` or ``"interleaved"``: how ``model``'s attention pairs rotary features, read off its modeling
    module's own ``rotate_half`` (feature 0 lands on ``rotary_dim / 2`` or on 1); refuses anything else in one line.

    Example:
        >>> from transformers import CohereConfig, CohereForCausalLM
        >>> config = CohereConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        ...                       num_attention_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        >>> rotary_layout(CohereForCausalLM(config))
        'interleaved'
    """
    attention = model.model.layers[0].self_attn
    forward = type(attention).forward
    while hasattr(forward, "__wrapped__"):  # decorators (transformers' deprecation wrappers) keep the original
        forward = forward.__wrapped__
    rotate_half = getattr(forward, "__globals__", {}).get("rotate_half")  # from the modeling module's namespace
    name = type(model).__name__
    if rotate_half is None:
        raise RelayPressError(f"{name}: its modeling module defines no rotate_half, so RelayPress cannot tell its "
                              "rotary layout; use a split-half or interleaved RoPE model (Llama, Qwen2, Cohere, GLM)")
    probe = torch.zeros(1, 8)
    probe[0, 0] = 1.0
    landed = int(rotate_half(probe).abs().argmax())
    if landed not in (4, 1):
        raise RelayPressError(f"{name}: rotate_half maps feature 0 to feature {landed}, neither split-half (4) nor "
                              "interleaved (1); RelayPress relocates those two layouts only: use relaylens's runner")
    return "split_half" if landed == 4 else "interleaved"


@dataclass
class RelayPress(KeyRerotationPress):
    """Wrap a kvpress press: keep the states it keeps, re-rotate them to RoPERelay's right-aligned coordinates.

    Args:
        press: the press that selects: a ``ScorerPress``, ``PyramidKVPress``, ``AdaKVPress`` or
            ``CriticalAdaKVPress``. Its ``compression_ratio`` is this press's (``RelayPress(...).compression_ratio``
            reads and sets it, as kvpress's evaluation script does).

    After each prefill, ``kept`` holds the kept source positions per layer and kv head (ascending) and
    ``max_count`` is ``M``, the first question position.

    Example (construction only; the pipeline run is in the how-to ``docs/how-to/kvpress-relay.md``):
        >>> from kvpress import AdaKVPress, SnapKVPress
        >>> RelayPress(AdaKVPress(SnapKVPress(compression_ratio=0.9))).compression_ratio
        0.9
        >>> from kvpress import ChunkKVPress
        >>> RelayPress(ChunkKVPress(SnapKVPress()))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        relaylens.integrations.kvpress_relay.RelayPressError: RelayPress wraps a ScorerPress, ...
    """

    press: ScorerPress | AdaKVPress | CriticalAdaKVPress
    kept: list[list[torch.Tensor]] | None = field(default=None, init=False, repr=False)
    max_count: int | None = field(default=None, init=False, repr=False)
    _layers: dict = field(default_factory=dict, init=False, repr=False)
    _rotary: object = field(default=None, init=False, repr=False)
    _layout: str = field(default="split_half", init=False, repr=False)
    _last_layer: int = field(default=-1, init=False, repr=False)

    def __post_init__(self):
        check_press(self.press)

    # ------------------------------------------------------------------------------------------------ model

    def post_init_from_model(self, model):
        self._rotary, self._last_layer = check_model(model)
        self._layout = rotary_layout(model)
        self.press.post_init_from_model(model)

    @contextmanager
    def __call__(self, model):
        """kvpress's context manager (hooks on every attention layer), plus a check of each prefill's batch size."""
        check_model(model)  # before any model work
        decoder = model.model

        def one_sequence(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            embeds = kwargs.get("inputs_embeds")
            batch = (ids if ids is not None else embeds).shape[0]
            if batch != 1:
                raise RelayPressError(f"RelayPress compresses one sequence at a time (kvpress's pipeline does); got a "
                                      f"batch of {batch}: run the sequences one by one")

        handle = decoder.register_forward_pre_hook(one_sequence, with_kwargs=True)
        try:
            with super().__call__(model):
                yield
        finally:
            handle.remove()

    # ------------------------------------------------------------------------------------------------ selection

    def kept_slots(self, module, hidden_states, keys, values, attentions, kwargs) -> list[torch.Tensor]:
        """The source positions the wrapped press keeps in this layer: per kv head, ascending (batch 1)."""
        k_len = keys.shape[2]
        inner = self.press
        if inner.compression_ratio == 0:
            return [torch.arange(k_len, device=keys.device)] * keys.shape[1]
        if isinstance(inner, HEADWISE):  # its compress keeps the cache and records the evicted (batch, head, pos)
            inner.compress(module, hidden_states, keys, values, attentions, kwargs)
            keep = torch.ones(keys.shape[:3], dtype=torch.bool, device=keys.device)  # [1, kv_head, L]
            masked = getattr(module, "masked_key_indices", None)
            if masked is not None:
                keep[masked] = False
            return [keep[0, h].nonzero()[:, 0] for h in range(keys.shape[1])]
        scores = inner.score(module, hidden_states, keys, values, attentions, kwargs)  # [1, kv_head, L]
        if isinstance(inner, PyramidKVPress):
            n_kept = inner.get_layer_budget(module, k_len)
        else:
            n_kept = compute_n_kept(k_len, inner.compression_ratio)
        indices = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # [1, kv_head, n_kept], as the press keeps
        return list(indices[0])

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Keep the wrapped press's states, right-aligned per layer; relocation waits for the last layer (``M``)."""
        if module.layer_idx == 0:
            self._layers, self.kept, self.max_count = {}, None, None
        kept = self.kept_slots(module, hidden_states, keys, values, attentions, kwargs)
        counts = torch.tensor([int(k.numel()) for k in kept], device=keys.device)  # [kv_head]
        width = int(counts.max())
        source = torch.full((len(kept), width), -1, dtype=torch.long, device=keys.device)  # [kv_head, width]
        for h, positions in enumerate(kept):
            source[h, width - positions.numel():] = positions
        index = source.clamp_min(0)[None, :, :, None].expand(-1, -1, -1, keys.shape[-1])
        pad = (source < 0)[None, :, :, None]
        keys = keys.gather(2, index).masked_fill(pad, 0.0).contiguous()  # [1, kv_head, width, head_dim]
        values = values.gather(2, index).masked_fill(pad, 0.0).contiguous()
        set_padding(module, None, None)  # recorded on the cache for the final layout once M is known
        self._layers[module.layer_idx] = (module, source, [k.cpu() for k in kept])
        return keys, values

    def forward_hook(self, module, input, kwargs, output):
        cache = kwargs["past_key_values"]
        if hasattr(cache.layers[module.layer_idx], "_quantized_keys"):
            raise RelayPressError("RelayPress writes relocated keys into a DynamicCache; got a quantized cache: pass "
                                  "cache=DynamicCache() (or none) to the pipeline")
        output = super().forward_hook(module, input, kwargs, output)
        if module.layer_idx == self._last_layer and self._layers:
            self._relocate(cache)
        return output

    # ------------------------------------------------------------------------------------------------ relocation

    def _relocate(self, cache) -> None:
        """Pad every layer to ``M`` slots (slot = position), re-rotate kept keys there, mask the padding."""
        if len(self._layers) != self._last_layer + 1:
            raise RelayPressError(f"RelayPress saw {len(self._layers)} of {self._last_layer + 1} layers compressed; "
                                  "it needs every layer compressed in one prefill (no layers skipped)")
        total = max(source.shape[1] for _, source, _ in self._layers.values())  # M
        for layer, (module, source, _) in sorted(self._layers.items()):
            cached = cache.layers[layer]
            extra = total - source.shape[1]
            source = torch.nn.functional.pad(source, (extra, 0), value=-1)  # [kv_head, M]
            keys = torch.nn.functional.pad(cached.keys, (0, 0, extra, 0))  # [1, kv_head, M, head_dim]
            values = torch.nn.functional.pad(cached.values, (0, 0, extra, 0))
            valid = source >= 0
            target = torch.arange(total, device=source.device).expand_as(source)
            if bool(valid.all()) and torch.equal(source, target):  # nothing evicted: every key stays where it is
                moved = keys[0]
            else:
                moved = relocate(keys[0], source.clamp_min(0), target, self._rotary, self._layout)
            cached.keys = moved.masked_fill(~valid[..., None], 0.0)[None].contiguous()
            cached.values = values.contiguous()
            set_padding(module, cache, None if bool(valid.all()) else valid)
        self.kept = [kept for _, (_, _, kept) in sorted(self._layers.items())]
        self.max_count = total
        self._layers = {}


# ---------------------------------------------------------------------------------------------------- the padding

EXACT_KERNELS = ("sdpa", "eager")  # kernels that take a per-head attention mask


def set_padding(module, cache, valid: torch.Tensor | None) -> None:
    """Hide the padded slots of one attention layer of ``cache`` from every later query on that cache (``valid``
    ``[kv_head, M]``; None: nothing to hide). ``cache`` None: only clear what the press's selection left on the layer.

    The padding is recorded on the cache itself (``cache.relay_padding``, one entry per layer), never on the shared
    attention module: a copy of the cache (``copy.deepcopy``) carries its own, and several compressed caches of one
    model each keep theirs. A forward pre-hook on the layer (registered once, kept after the press's ``with`` block,
    since the question runs outside it) reads the padding of the cache each call runs on. With sdpa or eager
    attention it gives the layer a per-head attention mask: padded slots get exactly zero weight. Other kernels
    (flash attention) take no per-head mask: the hook then sets kvpress's head-wise fake keys (``masked_key_indices``,
    as AdaKVPress) for that cache, whose weight underflows but is not exactly zero, and clears them for a cache
    without padding. Calls on other caches are untouched.
    """
    module.masked_key_indices = None  # the wrapped press's record of its selection: superseded by the cache's padding
    if cache is None:
        return
    cache.__dict__.setdefault("relay_padding", {})[module.layer_idx] = valid
    if getattr(module, "relay_padding_hook", None) is None:
        module.relay_padding_hook = module.register_forward_pre_hook(mask_padding, with_kwargs=True)


def cache_padding(module, cache) -> torch.Tensor | None:
    """The padding ``valid`` ``[kv_head, M]`` that :func:`set_padding` recorded on ``cache`` for ``module``'s layer,
    or None (no padding, another cache, or a new prefill on a reused cache: fewer cached slots than ``M``)."""
    padding = getattr(cache, "relay_padding", None)
    valid = None if padding is None else padding.get(module.layer_idx)
    if valid is None or cache.layers[module.layer_idx].keys.shape[2] < valid.shape[1]:
        return None
    return valid


def _fake_key_padding(module, valid: torch.Tensor | None) -> None:
    """kvpress's head-wise fake keys for the padding of the cache this call runs on (kernels without a per-head
    mask); a cache without padding gets none of another cache's."""
    ours = getattr(module, "relay_masked_key_indices", None)
    if valid is None:
        if ours is not None and getattr(module, "masked_key_indices", None) is ours:
            module.masked_key_indices = None
        return
    heads, slots = (~valid).nonzero(as_tuple=True)
    module.masked_key_indices = module.relay_masked_key_indices = (torch.zeros_like(heads), heads, slots)


def mask_padding(module, args, kwargs):
    """Forward pre-hook: causal mask of the new tokens over the cache, padded slots excluded per head (the padding
    of the cache this call runs on)."""
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    valid = None if cache is None else cache_padding(module, cache)  # [kv_head, M]
    if module.config._attn_implementation not in EXACT_KERNELS:
        _fake_key_padding(module, valid)
        return None
    if valid is None:
        return None
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    queries = hidden.shape[1]
    past = cache.layers[module.layer_idx].keys.shape[2]  # before this call's update
    total = past + queries
    device = valid.device
    position = kwargs.get("cache_position")
    position = torch.arange(past, total, device=device) if position is None else position.to(device)
    allow = torch.arange(total, device=device)[None, :] <= position[:, None]  # [query, key] causal
    keep = torch.ones(valid.shape[0], total, dtype=torch.bool, device=device)  # [kv_head, key]
    keep[:, : valid.shape[1]] = valid
    groups = module.config.num_attention_heads // valid.shape[0]
    allow = allow[None] & keep.repeat_interleave(groups, 0)[:, None, :]  # [q_head, query, key]
    mask = kwargs.get("attention_mask")
    if mask is None or mask.dtype == torch.bool:
        mask = allow[None] if mask is None else mask[..., :total] & allow[None]
        if module.config._attn_implementation == "eager":
            lowest = torch.finfo(hidden.dtype).min
            mask = torch.zeros(mask.shape, dtype=hidden.dtype, device=device).masked_fill(~mask, lowest)
    else:  # additive float mask (eager)
        mask = mask[..., :total].masked_fill(~allow[None], torch.finfo(mask.dtype).min)
    kwargs["attention_mask"] = mask
    return args, kwargs


def check_press(press) -> None:
    """Refuse a press RelayPress cannot reproduce exactly (one line: what arrived, what is supported, the fix)."""
    name = type(press).__name__
    if isinstance(press, KeyRerotationPress):
        raise RelayPressError(f"RelayPress wraps the press that selects; got {name}, which already re-rotates keys: "
                              "pass its inner press (RelayPress(press.press))")
    if isinstance(press, HEADWISE):
        return
    if isinstance(press, ScorerPress):
        own = type(press).compress
        if own is ScorerPress.compress or own is PyramidKVPress.compress:
            return
        raise RelayPressError(f"RelayPress reproduces the selection of ScorerPress.compress and PyramidKVPress; "
                              f"{name} overrides compress, so its kept states cannot be reproduced: wrap a press "
                              "without its own compress")
    raise RelayPressError(f"RelayPress wraps a ScorerPress, PyramidKVPress, AdaKVPress or CriticalAdaKVPress; got "
                          f"{name}: wrap its inner scorer press instead (e.g. RelayPress(AdaKVPress(SnapKVPress())))")


def check_model(model) -> tuple[object, int]:
    """The model's rotary embedding and last layer index; refuses models RelayPress cannot relocate exactly."""
    name = type(model).__name__
    decoder = getattr(model, "model", None)
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None and not hasattr(decoder, "language_model"):
        raise RelayPressError(f"{name} has no rotary embedding (model.model.rotary_emb): RoPERelay moves rotary "
                              "positions only; use a RoPE model (Llama, Mistral, Phi-3, Qwen2, Qwen3)")
    if hasattr(decoder, "language_model"):
        raise RelayPressError(f"RelayPress needs a text-only causal LM whose every layer kvpress compresses (Llama, "
                              f"Mistral, Phi-3, Qwen2, Qwen3); got {name}: load the text model")
    config = model.config
    layer_types = set(getattr(config, "layer_types", None) or ())
    if len(layer_types) > 1:
        raise RelayPressError(f"{name} mixes layer types {sorted(layer_types)} (per-type rotary or sliding windows): "
                              "RelayPress supports one rotary table for every layer; use relaylens's own runner")
    no_rope = getattr(config, "no_rope_layers", None)
    if no_rope and not all(no_rope):
        raise RelayPressError(f"{name} has layers without rotary (no_rope_layers {list(no_rope)}): RelayPress "
                              "relocates every layer's keys; use relaylens's own runner, which leaves NoPE layers "
                              "alone")
    rotary_layout(model)  # split-half or interleaved, or a one-line refusal
    return rotary, len(decoder.layers) - 1
