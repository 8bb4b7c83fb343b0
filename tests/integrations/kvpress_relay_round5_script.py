"""Issue 52, items 5 and 6, run in the pinned kvpress environment (``make kvpress-env``: kvpress 0.5.5 with
transformers 5.2). Never imports relaylens: the press module is loaded from its file.

    python kvpress_relay_round5_script.py PRESS_MODULE SPEC_JSON OUT_PT

``SPEC_JSON``: ``{"padding": [{"id", "model" (a save_pretrained directory), "attn", "press"}], "layout": [{"id",
"model", "press"}]}`` with ``press`` one of ``adakv`` (AdaKV over SnapKV: one budget per kv head),
``adakv_knorm`` (over Knorm, which reads no queries: kvpress's SnapKV cannot score partial-rotary models),
``pyramidkv`` (one budget per layer), ``snapkv`` and ``knorm`` (uniform), all at compression ratio 0.8.

* padding: context A is compressed and its question's last-position logits taken at once (the reference); then A
  again and a second context B; the question then runs on a deep copy of A, on B's copy, on A itself and on a copy
  of a copy. Each figure is the largest logit difference to its own context's reference. ``no_mask`` is the same
  question on a copy of A whose padding record was removed (the mask matters: a large figure).
* layout: every kept key RelayPress wrote against the model's own key at the new position: the layer's key
  projection of the state's attention input, rotated by the model's own ``apply_rotary_pos_emb`` at the target
  slot. Also the largest key magnitude (the scale of an error).

``OUT_PT`` (``torch.save``): ``{"padding": {id: {figure: float}}, "layout": {id: {"error", "scale", "layout"}},
"transformers": str}``.
"""

import copy
import importlib.util
import json
import sys

import torch

RATIO = 0.8
QUESTION = 6


def _load_press_module(path: str):
    spec = importlib.util.spec_from_file_location("kvpress_relay", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpress_relay"] = module
    spec.loader.exec_module(module)
    return module


def _press(relay_module, name: str):
    import kvpress

    inner = {"adakv": lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(window_size=8)),
             "pyramidkv": lambda: kvpress.PyramidKVPress(window_size=4, beta=4),
             "adakv_knorm": lambda: kvpress.AdaKVPress(kvpress.KnormPress()),
             "knorm": kvpress.KnormPress,
             "snapkv": lambda: kvpress.SnapKVPress(window_size=8)}[name]()
    inner.compression_ratio = RATIO
    return relay_module.RelayPress(inner)


def _compress(model, press, ids):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    return cache, int(press.max_count)


def _ask(model, cache, start, question):
    """Last-position logits of the question at ``start ..`` over ``cache`` (extended in place)."""
    positions = (start + torch.arange(question.shape[1]))[None]
    with torch.no_grad():
        return model(input_ids=question, past_key_values=cache, position_ids=positions).logits[0, -1].float()


def padding_case(relay_module, case) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(case["model"], attn_implementation=case["attn"]).eval()
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    context_a = torch.randint(3, vocab, (1, 140), generator=gen)
    context_b = torch.randint(3, vocab, (1, 96), generator=gen)
    question = torch.randint(3, vocab, (1, QUESTION), generator=gen)
    press = _press(relay_module, case["press"])
    cache, m_a = _compress(model, press, context_a)
    ref_a = _ask(model, cache, m_a, question)  # asked right after its own compression
    cache, m_b = _compress(model, press, context_b)
    ref_b = _ask(model, cache, m_b, question)
    cache_a, _ = _compress(model, press, context_a)
    cache_b, _ = _compress(model, press, context_b)  # the last compression: the layers saw B last
    out = {"M_a": m_a, "M_b": m_b,
           "a_copy_after_b": float((_ask(model, copy.deepcopy(cache_a), m_a, question) - ref_a).abs().max()),
           "b_copy": float((_ask(model, copy.deepcopy(cache_b), m_b, question) - ref_b).abs().max()),
           "a_copy_of_copy": float((_ask(model, copy.deepcopy(copy.deepcopy(cache_a)), m_a, question)
                                    - ref_a).abs().max())}
    bare = copy.deepcopy(cache_a)
    vars(bare).pop("relay_padding", None)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    out["no_mask"] = float((_ask(model, bare, m_a, question) - ref_a).abs().max())
    out["a_itself"] = float((_ask(model, cache_a, m_a, question) - ref_a).abs().max())
    out["b_itself"] = float((_ask(model, cache_b, m_b, question) - ref_b).abs().max())
    out["padded"] = bool(any(len({int(k.numel()) for k in layer}) > 1 for layer in press.kept)
                         or len({int(layer[0].numel()) for layer in press.kept}) > 1)
    return out


def layout_case(relay_module, case) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(case["model"], attn_implementation="sdpa").eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (1, 120), generator=gen)
    inputs = {}

    def capture(module, args, kwargs):
        inputs[module.layer_idx] = kwargs.get("hidden_states", args[0] if args else None).detach()

    hooks = [layer.self_attn.register_forward_pre_hook(capture, with_kwargs=True) for layer in model.model.layers]
    press = _press(relay_module, case["press"])
    try:
        cache, big_m = _compress(model, press, ids)
    finally:
        for hook in hooks:
            hook.remove()
    error = scale = 0.0
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        apply_rotary = type(attn).forward.__globals__["apply_rotary_pos_emb"]
        hidden = inputs[index]  # [1, L, hidden]
        keys = attn.k_proj(hidden).view(1, hidden.shape[1], -1, attn.head_dim)  # [1, L, kv_head, head_dim]
        if getattr(attn, "use_qk_norm", False):
            keys = attn.k_norm(keys)
        keys = keys.transpose(1, 2)  # [1, kv_head, L, head_dim]
        for head, kept in enumerate(press.kept[index]):
            m = int(kept.numel())
            targets = big_m - m + torch.arange(m)
            cos, sin = model.model.rotary_emb(hidden, targets[None])
            own = keys[:, head:head + 1, kept]  # [1, 1, m, head_dim]
            if cos.shape[-1] < own.shape[-1] and type(model).__name__.startswith("Phi"):  # Phi's attention splits
                rot = own[..., : cos.shape[-1]]
                own = torch.cat((apply_rotary(rot, rot, cos, sin)[1], own[..., cos.shape[-1]:]), dim=-1)
            else:  # the function handles partial rotary itself (GLM) or rotates every feature
                _, own = apply_rotary(own, own, cos, sin)
            written = cache.layers[index].keys[0, head, big_m - m:]  # [m, head_dim]
            error = max(error, float((own[0, 0] - written).abs().max()))
            scale = max(scale, float(own.abs().max()))
    return {"error": error, "scale": scale, "layout": getattr(press, "_layout", None), "M": big_m}


def main(press_path: str, spec_path: str, out_path: str) -> None:
    import transformers

    relay_module = _load_press_module(press_path)
    spec = json.loads(open(spec_path).read())
    out = {"transformers": transformers.__version__, "padding": {}, "layout": {}}
    with torch.no_grad():
        for case in spec.get("padding", []):
            out["padding"][case["id"]] = padding_case(relay_module, case)
        for case in spec.get("layout", []):
            out["layout"][case["id"]] = layout_case(relay_module, case)
    torch.save(out, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
