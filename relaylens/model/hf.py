"""Hugging Face internals in one room: every place relaylens reaches inside a ``transformers`` model or cache.

* layer access: :func:`decoder_layers` (``model.model.layers[i]`` with ``self_attn``), :func:`attention_module`,
  :func:`attention_constants` (scaling, query heads per kv head), :func:`attention_layer_index`,
  :func:`attention_window` (what an attention module knows of itself), :func:`query_key_projections`;
* norms: :func:`final_norm` (the norm before the unembedding), :func:`rms_norm_gain`, :func:`rms_norms`;
* rotary lookup and layout: :data:`POSITION_LIMIT`, :func:`find_rotary_embedding`, :func:`call_rotary`,
  :func:`rotary_function` (the modeling module's own ``apply_rotary_pos_emb``), :func:`detect_layout` (split-half vs
  interleaved ``rotate_half``), :func:`nope_layers` (layers that apply no rotary), :func:`rotary_frequencies` (the
  inverse-frequency buffer), :func:`rotary_types` (the argument the rotary takes per layer, and its rope type),
  :func:`rotary_override` (a ``with`` block in which the rotary module's ``(cos, sin)`` are replaced: real-valued
  positions of new tokens);
* query/key rebuild recipes: :data:`QUERY_RECIPES`, :func:`rebuild_query_key` (post-rotary q/k of one attention
  module from its inputs, exactly as its forward computes them);
* what differs by model family (the query/key recipes, the layers that apply no rotary) is one
  :class:`~relaylens.model.adapters.ModelFamily` record each, looked up by attention class or ``model_type``
  (:mod:`relaylens.model.adapters`);
* the attention kernel: :func:`register_attention_function` (a new kernel name), :func:`attention_kernel` (a
  ``with`` block switching to it, restored on exit);
* cache conversion: :func:`cache_tensors` (``DynamicCache`` -> per-layer keys/values), :func:`new_cache`,
  :func:`cache_from_tensors`, :func:`cached_keys`, :func:`cached_values`, :func:`cache_lengths`;
* cache surgery: :func:`cache_data` (every layer's batched keys and values), :func:`crop_cache` (forget the last
  tokens), :func:`select_cache_rows` (keep some batch rows);
* pre-rotary capture: :func:`pre_rotary_keys` (keys after ``k_proj`` / ``k_norm``, before rotary);
* what kvpress presses expect: :func:`hook_cache` (the cache an attention hook received), :func:`attached_rotary`
  (``self_attn.rotary_emb`` for the duration of a block), :func:`preserved_attention_functions` (undo global
  attention-function patches made inside a block, e.g. by ``import kvpress``).

Axes: ``layer``, ``q_head``, ``kv_head``, ``n``, ``head_dim``; ``B`` batch (:mod:`relaylens.geometry`).

Example:
    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama")
    >>> len(decoder_layers(model)), detect_layout(model), attention_constants(model)
    (2, 'split_half', (0.25, 2))
    >>> out = model(torch.arange(3, 13)[None], use_cache=True)
    >>> keys, values = cache_tensors(out.cache)
    >>> tuple(keys[0].shape)                                          # [kv_head, L, head_dim]
    (2, 10, 16)
    >>> crop_cache(out.cache, 4); cache_lengths(out.cache)             # the last 4 positions forgotten
    [6, 6]
    >>> [attention_layer_index(a) for a in attention_modules(model)], attention_window(attention_module(model))
    ([0, 1], None)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from relaylens.errors import RelaylensError, RopeError
from relaylens.model.adapters import family_for, query_recipes, rotary_function

__all__ = ["POSITION_LIMIT", "decoder_layers", "attention_module", "attention_constants", "find_rotary_embedding",
           "call_rotary",
           "rotary_function", "detect_layout", "nope_layers", "rotary_frequencies", "rotary_override", "QUERY_RECIPES",
           "rebuild_query_key", "attention_kernel", "layer_attention", "attention_modules", "rope_summary",
           "output_projection",
           "cache_tensors", "new_cache", "cache_from_tensors", "cached_keys", "cached_values", "cache_lengths",
           "pre_rotary_keys",
           "hook_cache", "attached_rotary", "exposed_head_dim", "preserved_attention_functions",
           "attention_layer_index", "attention_window", "query_key_projections", "final_norm", "rms_norm_gain",
           "rms_norms", "rotary_types", "register_attention_function", "attention_kernel_name", "cache_data",
           "crop_cache", "select_cache_rows"]


def _text_config(config):
    """The text part of a model's config (``get_text_config()`` of a multimodal config), or the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


# ------------------------------------------------------------------------------------------------- layer access

def decoder_layers(model) -> list:
    """The decoder layers of a causal LM (``model.model.layers``), each with a ``self_attn`` module."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise RopeError(f"{type(model).__name__} has no model.model.layers[i].self_attn; relaylens supports "
                        "decoder-only Hugging Face causal LMs laid out like Llama.")
    return list(layers)


def layer_attention(layer: nn.Module) -> nn.Module:
    """The attention module of one decoder layer (``layer.self_attn``)."""
    return layer.self_attn


def attention_modules(model) -> list[nn.Module]:
    """Every decoder layer's attention module, in layer order."""
    return [layer_attention(layer) for layer in decoder_layers(model)]


def output_projection(model, layer: int) -> torch.Tensor:
    """``W_O`` of one layer's attention, float32 ``[hidden, q_head * head_dim]`` (detached)."""
    return layer_attention(decoder_layers(model)[layer]).o_proj.weight.detach().float()


def attention_module(model: nn.Module) -> nn.Module:
    """The first decoder layer's ``self_attn`` (``model.model.layers[0]``, or ``model.layers[0]`` of a bare body)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None or len(layers) == 0 or not hasattr(layers[0], "self_attn"):
        raise RopeError(f"{type(model).__name__}: expected model.model.layers[i].self_attn decoder layers")
    return layers[0].self_attn


def attention_layer_index(attn: nn.Module, default: int | None = None) -> int:
    """The index of the decoder layer an attention module belongs to (its ``layer_idx``; ``default`` if it has none)."""
    index = getattr(attn, "layer_idx", default)
    if index is None:
        raise RopeError(f"{type(attn).__name__} has no layer_idx; relaylens supports Hugging Face attention modules "
                        "that know their decoder layer")
    return index


def attention_window(attn: nn.Module, kwargs: dict | None = None) -> int | None:
    """The sliding window of an attention module (None: full attention). ``kwargs``: those an attention function was
    called with, whose ``sliding_window`` takes precedence over the module's own. A module that says it is not sliding
    (EXAONE-4's global layers carry the model's ``sliding_window`` with ``is_sliding=False``) has none."""
    if not getattr(attn, "is_sliding", True):
        return (kwargs or {}).get("sliding_window")
    return (kwargs or {}).get("sliding_window") or getattr(attn, "sliding_window", None)


def query_key_projections(attn: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(q_proj, k_proj)``: the linear maps from the hidden state to one attention module's queries and keys."""
    return attn.q_proj, attn.k_proj


def attention_constants(model) -> tuple[float, int]:
    """``(scaling, num_key_value_groups)`` of the model's attention (``q @ k^T`` scale; query heads per kv head)."""
    attn = model.model.layers[0].self_attn
    return float(attn.scaling), int(attn.num_key_value_groups)


def rope_summary(model) -> dict:
    """Rotary settings of the loaded model (after any override), for the run manifest: ``rope_parameters`` and
    ``max_position_embeddings`` of its (text) config."""
    config = _text_config(model.config)
    return {"rope_parameters": getattr(config, "rope_parameters", None),
            "max_position_embeddings": getattr(config, "max_position_embeddings", None)}


# ------------------------------------------------------------------------------------------------------- norms

def final_norm(model) -> nn.Module:
    """The final norm before the unembedding (``model.model.norm``)."""
    norm = getattr(getattr(model, "model", model), "norm", None)
    if norm is None:
        raise RelaylensError(f"{type(model).__name__} has no model.norm; direct logit attribution needs the final norm")
    return norm


def rms_norm_gain(module: nn.Module) -> tuple[torch.Tensor, float]:
    """``(gain [hidden] float32, eps)`` of an RMSNorm computing ``gain * x / sqrt(mean(x^2) + eps)``.

    The gain is read off the module itself (its output on a vector of ones is ``gain / sqrt(1 + eps)``), so
    Llama-style ``weight`` and Gemma-style ``1 + weight`` norms both work. Other norms are refused.
    """
    eps = getattr(module, "variance_epsilon", None)
    eps = getattr(module, "eps", None) if eps is None else eps
    weight = getattr(module, "weight", None)
    if eps is None or weight is None or getattr(module, "bias", None) is not None:
        raise RelaylensError(f"final norm {type(module).__name__} is not an RMSNorm (gain * x / rms(x)); direct logit "
                             "attribution with a frozen norm scale supports RMSNorm models only")
    ones = torch.ones(1, weight.shape[-1], dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        gain = module(ones).float()[0] * (1.0 + float(eps)) ** 0.5
    return gain.detach(), float(eps)


def rms_norms(model: nn.Module) -> list[nn.Module]:
    """Every RMSNorm module of the model (its ``*RMSNorm`` classes), in module order."""
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


# ----------------------------------------------------------------------------------------------- rotary lookup

POSITION_LIMIT = 2**24
"""Positions a Hugging Face rotary embedding can tell apart: it computes phases from float32 positions
(``inv_freq.float() @ position_ids.float()``), and float32 holds every integer only below ``2**24`` (``2**24 + 1``
rounds to ``2**24``). Every position relaylens feeds or relocates to stays below it
(:func:`relaylens.geometry.positions.check_positions`), and ``--max-position`` may not exceed it."""


def find_rotary_embedding(model: nn.Module) -> nn.Module:
    """The model's rotary embedding module (``model.model.rotary_emb`` or the first ``*RotaryEmbedding``)."""
    inner = getattr(model, "model", model)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is not None:
        return rotary
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            return module
    raise RopeError(
        f"{type(model).__name__} has no rotary embedding module (expected model.model.rotary_emb or a "
        "*RotaryEmbedding submodule); relaylens relocates keys of RoPE models only"
    )


def call_rotary(rotary: nn.Module, position_ids: torch.Tensor, layer_type: str | None):
    """``(cos, sin)`` float32 ``[B, n, rotary_dim]`` of the rotary module at ``position_ids`` ``[B, n]``."""
    dummy = torch.zeros(1, dtype=torch.float32, device=position_ids.device)
    with torch.no_grad():
        if layer_type is None:
            cos, sin = rotary(dummy, position_ids)
        else:
            cos, sin = rotary(dummy, position_ids, layer_type)
    return cos.float(), sin.float()


def rotary_types(model: nn.Module) -> tuple[tuple[str | None, ...], dict]:
    """``(layer_types, rope_types)`` of the model's rotary embedding: per decoder layer the argument its rotary call
    takes (``None`` for every layer of a single-rotary model; Gemma-3: the layer type), and the rope type per such
    argument (``{None: "yarn"}``), read off the rotary module itself (its ``rope_type``)."""
    text_config = _text_config(getattr(model, "config", None))
    rotary = find_rotary_embedding(model)
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        layer_types = tuple(text_config.layer_types)
        kind = rotary.rope_type
        return layer_types, kind if isinstance(kind, dict) else {t: kind for t in set(layer_types)}
    return (None,) * int(text_config.num_hidden_layers), {None: getattr(rotary, "rope_type", "default")}


def rotary_frequencies(rotary: nn.Module, layer_type: str | None) -> torch.Tensor:
    """The inverse frequencies ``[rotary_dim // 2]`` (float32, as stored) the rotary module multiplies positions by.

    Read from the module's own buffer: ``inv_freq`` (one rotary), ``{layer_type}_inv_freq`` (Gemma-3's per-type
    rotary). For YaRN, ``llama3`` and linear scaling the buffer holds the scaled frequencies the model uses.
    """
    name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
    buffer = getattr(rotary, name, None)
    if buffer is None and layer_type is not None:
        buffer = getattr(rotary, "inv_freq", None)
    if not isinstance(buffer, torch.Tensor):
        raise RopeError(f"{type(rotary).__name__} has no {name} buffer; relaylens reads the model's own inverse "
                        "frequencies for real-valued positions. Fix: use integer positions with this model")
    return buffer.detach().float()


@contextlib.contextmanager
def rotary_override(model: nn.Module,
                    phases: Callable[[str | None], tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """``with rotary_override(model, phases):`` every call of the model's rotary embedding returns
    ``phases(layer_type)`` (``(cos, sin)`` ``[B, n, rotary_dim]`` in any float dtype, possibly carrying autograd)
    instead of its own output, cast to the dtype and device the module returns. The hook is removed on exit, also on
    errors."""
    rotary = find_rotary_embedding(model)
    busy = []  # ``phases`` may call the rotary itself (to build its tables): those calls keep the module's output

    def hook(module, args, kwargs, output):
        if busy:
            return None
        layer_type = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
        busy.append(True)
        try:
            cos, sin = phases(layer_type)
        finally:
            busy.clear()
        like = output[0]
        return cos.to(device=like.device, dtype=like.dtype), sin.to(device=like.device, dtype=like.dtype)

    handle = rotary.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def nope_layers(model: nn.Module) -> frozenset[int]:
    """Indices of decoder layers whose attention applies no rotary to its keys and queries (NoPE layers).

    Read from the attention modules the way the Hugging Face implementations decide it: a ``use_rope`` attribute
    (SmolLM3 ``no_rope_layers``, Llama-4), then the rule of the model's family
    (:meth:`~relaylens.model.adapters.ModelFamily.applies_no_rotary`): Cohere-2's global layers (no
    ``sliding_window``), EXAONE-4's global layers (a model with sliding windows rotates only its sliding layers).
    ``relaylens model check`` verifies the result against the model's own forward pass at shifted positions.

    >>> from relaylens.testing import tiny_model
    >>> sorted(nope_layers(tiny_model("smollm3_nope"))), sorted(nope_layers(tiny_model("llama")))
    ([1, 3], [])
    """
    text_config = _text_config(getattr(model, "config", None))
    family = family_for(getattr(text_config, "model_type", ""))
    flags = getattr(text_config, "no_rope_layers", None)
    inner = getattr(model, "model", model)
    out = set()
    for index, layer in enumerate(getattr(inner, "layers", ())):
        attn = getattr(layer, "self_attn", None)
        use_rope = getattr(attn, "use_rope", None)
        if use_rope is None and flags is not None and index < len(flags):
            use_rope = flags[index]
        if (use_rope is not None and not use_rope) or family.applies_no_rotary(attn):
            out.add(index)
    return frozenset(out)


def detect_layout(model: nn.Module) -> str:
    """``"split_half"`` or ``"interleaved"``, read off the modeling module's own ``rotate_half``.

    The function is probed numerically: rotating the first basis vector lands on feature ``rotary_dim/2`` for
    split-half layouts (Llama) and on feature 1 for interleaved layouts (GPT-J / Cohere / GLM).
    """
    module = sys.modules[type(attention_module(model)).__module__]
    rotate_half = getattr(module, "rotate_half", None)
    if rotate_half is None:
        raise RopeError(
            f"{module.__name__} defines no rotate_half(); relaylens cannot tell its rotary layout. "
            "Supported: split-half (Llama-style) and interleaved (GPT-J/Cohere/GLM-style) rotate_half()"
        )
    probe = torch.zeros(1, 8)
    probe[0, 0] = 1.0
    landed = int(rotate_half(probe).abs().argmax())
    if landed == 4:
        return "split_half"
    if landed == 1:
        return "interleaved"
    raise RopeError(f"{module.__name__}.rotate_half maps feature 0 to feature {landed}; expected 4 (split-half) or 1 "
                    "(interleaved)")


# ---------------------------------------------------------------------------------------- query / key rebuild

#: Attention classes whose forward computes queries as the recipe does: the recipes of the model families
#: (:func:`relaylens.model.adapters.query_recipes`; a new family is a record in
#: :data:`relaylens.model.adapters.FAMILIES`), one entry per attention class. An entry added here is used too; the
#: rebuilt keys are checked against the cache, so a wrong recipe fails loudly. SmolLM3 (``use_rope``), Cohere-2
#: (rotary on sliding layers only) and EXAONE-4 (QK-norm; rotary on sliding layers when the model has any) leave the
#: queries of their NoPE layers unrotated, as their forwards do (:func:`nope_layers`).
QUERY_RECIPES: dict[str, Callable] = query_recipes()


def rebuild_query_key(
    module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-rotary queries and keys of a Hugging Face self-attention module, as its forward computes them.

    Uses :data:`QUERY_RECIPES` (``q_proj`` -> optional query norm -> the modeling module's own
    ``apply_rotary_pos_emb``; partial rotary for Phi), the same code that rebuilds the prefill's window queries.
    ``hidden_states: [batch, n, hidden]`` -> ``q: [batch, q_head, n, d]``, ``k: [batch, kv_head, n, d]``.
    """
    name = type(module).__name__
    if name not in QUERY_RECIPES:
        raise RopeError(
            f"cannot rebuild queries for attention class {name}; supported: {', '.join(sorted(QUERY_RECIPES))}. "
            "Fix: add a recipe to relaylens.model.hf.QUERY_RECIPES"
        )
    if position_embeddings is None:
        raise RopeError(f"{name} received no position_embeddings (cos, sin); cannot rebuild rotary queries")
    cos, sin = position_embeddings
    return QUERY_RECIPES[name](module, hidden_states, cos, sin)


# -------------------------------------------------------------------------------------------- attention kernel

def register_attention_function(name: str, function: Callable) -> None:
    """Make ``function`` selectable as attention kernel ``name`` (``transformers.AttentionInterface``): it is called
    as ``function(module, query, key, value, attention_mask, dropout, scaling, **kwargs)`` and returns
    ``(output [B, query, q_head, D], weights or None)``. Select it with :func:`attention_kernel`."""
    from transformers import AttentionInterface  # noqa: PLC0415 - import cost: transformers loads on first use

    AttentionInterface.register(name, function)


def attention_kernel_name(model) -> str:
    """The attention kernel the model runs now (``"sdpa"``, ``"eager"``, ``"relaylens"`` inside a relaylens pass)."""
    return model.config._attn_implementation


@contextlib.contextmanager
def attention_kernel(model, name: str | None) -> Iterator[None]:
    """Temporarily switch the model's attention kernel (restored on exit, also on errors); None keeps it."""
    before = attention_kernel_name(model)
    if name is None or name == before:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


# ------------------------------------------------------------------------------------------- cache conversion

def cache_tensors(cache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer keys and values ``[kv_head, L, head_dim]`` (batch row 0) of a filled ``transformers`` cache."""
    return [layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers]


def cached_keys(cache, layer: int) -> torch.Tensor:
    """Keys of one cache layer, ``[B, kv_head, n, head_dim]``."""
    return cache.layers[layer].keys


def cached_values(cache, layer: int) -> torch.Tensor:
    """Values of one cache layer, ``[B, kv_head, n, head_dim]``."""
    return cache.layers[layer].values


def cache_lengths(cache) -> list[int]:
    """Positions held per cache layer."""
    return [int(layer.keys.shape[-2]) for layer in cache.layers]


def cache_data(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(keys, values)``, each ``[B, kv_head, n, head_dim]`` (the cache's own tensors, graph included):
    ``cache_from_tensors(cache_data(cache))`` is a copy whose updates the original does not see."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def crop_cache(cache, tokens: int) -> None:
    """Forget the last ``tokens`` positions of every layer of the cache (in place)."""
    for layer in cache.layers:
        layer.crop(-tokens)


def select_cache_rows(cache, index: torch.Tensor) -> None:
    """Keep only the batch rows ``index`` ``[B']`` (long) of every layer of the cache, in that order (in place)."""
    for layer in cache.layers:
        layer.batch_select_indices(index.to(layer.keys.device))


def new_cache():
    """An empty plain ``DynamicCache`` (a model-config cache would keep only the window in sliding layers)."""
    from transformers import DynamicCache  # noqa: PLC0415 - import cost: transformers loads on first use

    return DynamicCache()


def cache_from_tensors(data: list[tuple[torch.Tensor, torch.Tensor]]):
    """A ``DynamicCache`` holding per layer ``(keys, values)``, each ``[B, kv_head, slot, head_dim]``."""
    from transformers import DynamicCache  # noqa: PLC0415 - import cost: transformers loads on first use

    return DynamicCache(ddp_cache_data=data)


def slot_cache(data: list[tuple[torch.Tensor, torch.Tensor]], bases: list[torch.Tensor], step: torch.Tensor):
    """A compileable cache over preallocated per-layer ``(keys, values)`` ``[B, kv_head, slot, head_dim]``: the
    token of each forward goes to slot ``bases[layer] + step`` in place (``bases``, ``step``: 0-d long tensors, so no
    value is baked into a compiled graph; the caller advances ``step``). Static decoding
    (:mod:`relaylens.generation.static`) is its one user."""
    from transformers import Cache  # noqa: PLC0415 - import cost: transformers loads on first use

    return Cache(layers=[_slot_layer_class()(keys, values, base, step) for (keys, values), base in zip(data, bases)])


@functools.cache
def _slot_layer_class():
    from transformers.cache_utils import CacheLayerMixin  # noqa: PLC0415 - import cost: transformers loads on first use

    class SlotLayer(CacheLayerMixin):
        """One layer of :func:`slot_cache`."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys, values, base, step):
            super().__init__()
            self.keys, self.values, self.base, self.step = keys, values, base, step
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states) -> None:  # the buffers exist from the start
            return None

        def update(self, key_states, value_states, *args, **kwargs):
            slot = (self.base + self.step).reshape(1)
            self.keys.index_copy_(2, slot, key_states)
            self.values.index_copy_(2, slot, value_states)
            return self.keys, self.values

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.keys.shape[-2], 0

        def get_seq_length(self):
            return self.base + self.step

        def get_max_length(self) -> int:
            return self.keys.shape[-2]

    return SlotLayer


# ----------------------------------------------------------------------------------------- pre-rotary capture

def pre_rotary_keys(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per layer ``[1, kv_head, T, head_dim]``: keys after ``k_proj`` (and ``k_norm``), before rotary, for ``ids``."""
    from transformers import DynamicCache  # noqa: PLC0415 - import cost: transformers loads on first use

    captured, handles = {}, []
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        source = getattr(attn, "k_norm", None) or attn.k_proj

        def hook(module, args, output, index=index, head_dim=attn.head_dim):
            if output.dim() == 4:  # k_norm output [B, kv_head, T, D]
                captured[index] = output.detach()
            else:  # k_proj output [B, T, kv_head * D]
                captured[index] = output.detach().reshape(1, output.shape[1], -1, head_dim).transpose(1, 2)

        handles.append(source.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(ids[None].to(next(model.parameters()).device), use_cache=True, cache=DynamicCache())
    finally:
        for handle in handles:
            handle.remove()
    return captured


# ------------------------------------------------------------------------------------- what kvpress presses expect

def hook_cache(kwargs: dict):
    """The cache a forward hook of the model or of an attention module received (``cache``; ``past_key_values``
    before transformers renamed it), or None."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


@contextlib.contextmanager
def attached_rotary(model) -> Iterator[None]:
    """Give every attention module a ``rotary_emb`` attribute (the model's rotary embedding) inside the block, as
    kvpress's ``BasePress.__call__`` does before a press scores; removed on exit where relaylens added it."""
    rotary = find_rotary_embedding(model)
    added = []
    try:
        for attn in attention_modules(model):
            if getattr(attn, "rotary_emb", None) is None:
                attn.rotary_emb = rotary
                added.append(attn)
        yield
    finally:
        for attn in added:
            del attn.rotary_emb


@contextlib.contextmanager
def exposed_head_dim(model) -> Iterator[None]:
    """Give each attention module's config a ``head_dim`` inside the block where it has none (Qwen2's config derives
    it in the module): kvpress presses such as CriticalKVPress read ``module.config.head_dim``, which Llama and Gemma
    configs carry. Removed on exit where relaylens added it."""
    added = []
    try:
        for attn in attention_modules(model):
            config = getattr(attn, "config", None)
            head_dim = getattr(attn, "head_dim", None)
            if config is not None and head_dim is not None and getattr(config, "head_dim", None) is None:
                config.head_dim = int(head_dim)
                added.append(config)
        yield
    finally:
        for config in added:
            del config.head_dim


@contextlib.contextmanager
def preserved_attention_functions() -> Iterator[None]:
    """Restore transformers' attention-function table on exit: whatever code inside the block wrapped or replaced
    in ``ALL_ATTENTION_FUNCTIONS`` (``import kvpress`` wraps every entry for AdaKV's decode-time key masking) is
    undone, so relaylens's own passes run the kernels transformers ships."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: PLC0415 - import cost: transformers loads on first use

    local = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    shared = type(ALL_ATTENTION_FUNCTIONS)._global_mapping
    before = dict(shared)
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
        ALL_ATTENTION_FUNCTIONS._local_mapping.update(local)
        shared.update(before)  # entries registered inside the block (new names) stay
