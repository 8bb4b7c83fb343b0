"""The inputs a kvpress press receives, reproduced on relaylens's transformers: one pass over the history.

kvpress (NVIDIA/kvpress) compresses inside a forward hook on every ``self_attn``, during the pipeline's single
prefill of the context: the hook reads the layer's input ``hidden_states`` from its keyword arguments, the layer's
post-rotary keys and values from the cache (the whole context, right after the layer wrote them), the attention
weights ``output[1]`` (only the eager kernel returns them), and hands the press the hook's keyword arguments.
:func:`press_layer_pass` runs the same single forward of the history at positions ``0..L-1`` and calls a function
with exactly those arguments after every attention layer. The keyword arguments carry what kvpress's hooks read and
newer transformers no longer pass: ``past_key_values`` (now ``cache``) and ``cache_position`` (``0..L-1`` of the
prefill). During the pass every attention module has ``rotary_emb`` (kvpress sets it before a press runs) and its
config a ``head_dim`` (Qwen2's config has none; CriticalKVPress reads it).

Axes: ``layer``, ``kv_head``, ``q_head``, ``pos`` (:mod:`relaylens.geometry`); ``B`` batch (always 1 here).

Example:
    >>> from relaylens.testing import tiny_model
    >>> def norms(layer, module, hidden_states, keys, values, attentions, kwargs):
    ...     return tuple(hidden_states.shape), tuple(keys.shape), attentions, kwargs["cache_position"][-1].item()
    >>> press_layer_pass(tiny_model("llama"), torch.arange(3, 43), norms)[0]
    ((1, 40, 64), (1, 2, 40, 16), None, 39)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relaylens.errors import ShapeError
from relaylens.model.hf import (
    attached_rotary,
    attention_kernel,
    attention_modules,
    cached_keys,
    cached_values,
    exposed_head_dim,
    hook_cache,
    new_cache,
)

#: ``fn(layer, module, hidden_states, keys, values, attentions, kwargs) -> result``: hidden states ``[1, L, hidden]``
#: (the attention module's input), keys and values ``[1, kv_head, L, head_dim]`` as cached, attentions
#: ``[1, q_head, L, L]`` or None, kwargs the hook's keyword arguments (plus ``past_key_values``, ``cache_position``).
LayerFunction = Callable[..., object]


def press_layer_pass(model, history_ids: torch.Tensor, fn: LayerFunction,
                     attn_implementation: str | None = "sdpa") -> list:
    """One forward of the whole history (no chunking, as kvpress's pipeline prefills the context), calling ``fn``
    after every attention layer with the arguments a kvpress forward hook passes a press.

    Args:
        model: a Hugging Face causal LM (``model.model.layers[i].self_attn``).
        history_ids: ``[L]`` or ``[1, L]`` token ids.
        fn: see :data:`LayerFunction`; its results are returned per layer.
        attn_implementation: kernel of the pass (restored afterwards); ``"eager"`` makes ``attentions`` the
            layer's ``[1, q_head, L, L]`` weights (kvpress needs eager for presses that read them), any other kernel
            passes None, as kvpress's hook does.

    Memory: the cache of the whole history (as a prefill); with ``"eager"`` one layer's ``L x L`` weights at a time.
    """
    ids = torch.as_tensor(history_ids).long().reshape(1, -1)  # [1, L]
    if ids.shape[1] == 0:
        raise ShapeError("history_ids is empty; a press needs at least one history token")
    modules = attention_modules(model)
    device = next(model.parameters()).device
    length = int(ids.shape[1])
    results: list = [None] * len(modules)

    def make_hook(index: int):
        def hook(module, args, kwargs, output):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [1, L, hidden]
            cache = hook_cache(kwargs)
            keys, values = cached_keys(cache, index), cached_values(cache, index)  # [1, kv_head, L, head_dim]
            if keys.shape[-2] != length:
                raise ShapeError(f"layer {index}: the cache holds {keys.shape[-2]} positions during a {length}-token "
                                 "pass; expected the whole history (a model whose cache layer drops history?)")
            attentions = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            press_kwargs = {**kwargs, "past_key_values": cache,
                            "cache_position": torch.arange(length, device=hidden.device)}
            results[index] = fn(index, module, hidden, keys, values, attentions, press_kwargs)

        return hook

    handles = [m.register_forward_hook(make_hook(i), with_kwargs=True) for i, m in enumerate(modules)]
    try:
        with attention_kernel(model, attn_implementation), attached_rotary(model), exposed_head_dim(model), \
                torch.inference_mode():
            model(input_ids=ids.to(device), position_ids=torch.arange(length, device=device)[None], cache=new_cache(),
                  use_cache=True, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    return results
