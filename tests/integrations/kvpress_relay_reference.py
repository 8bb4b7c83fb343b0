"""RelayPress inside kvpress's own pipeline, against the bare press. Runs in the pinned kvpress environment (``make
kvpress-env``: kvpress 0.5.5 with transformers 5.2) and never imports relaylens: the press module is loaded from its
file, as a kvpress user who copies it would.

    python kvpress_relay_reference.py PRESS_MODULE CASES_JSON OUT_PT

``CASES_JSON``: ``{"context": str, "question": str, "max_new_tokens": int, "cases": [{"id", "model" (a directory
saved with save_pretrained), "press", "kwargs", "inner", "inner_kwargs", "attn" (the attention kernel),
"compression_ratio"}]}``.

For each case: the uncompressed prefill of the pipeline's ``context_ids`` (keys and values per layer); the bare
press's kept positions (the pipeline's compression step; a head-wise press's evicted keys read off
``masked_key_indices``); then ``RelayPress(press)`` through ``pipeline("kv-press-text-generation")`` with a cache
passed in, recording the cache as the question pass finds it (keys and values per layer ``[kv_head, M, head_dim]``),
the ``position_ids`` of every model call, the last-position logits of every call and the answer. ``OUT_PT``
(``torch.save``): ``{"kvpress", "transformers", "cases": {id: {...}}, "refusals": {name: message}}``.
"""

import importlib.util
import json
import sys

import torch


def _load_press_module(path: str):
    spec = importlib.util.spec_from_file_location("kvpress_relay", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpress_relay"] = module
    spec.loader.exec_module(module)
    return module


def _press(kvpress, case):
    kwargs = dict(case.get("kwargs", {}))
    if case.get("inner"):
        inner = getattr(kvpress, case["inner"])(**case.get("inner_kwargs", {}))
        kwargs["press"] = inner
    press = getattr(kvpress, case["press"])(**kwargs)
    press.compression_ratio = case["compression_ratio"]
    return press


def _bare_kept(model, press, context_ids, full_keys):
    """Kept positions per layer and kv head of the bare press (sorted), from the compression step of the pipeline."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=context_ids, past_key_values=cache)
    kept = []
    for index, (layer, ref) in enumerate(zip(cache.layers, full_keys)):
        masked = getattr(model.model.layers[index].self_attn, "masked_key_indices", None)
        heads = []
        for h in range(ref.shape[0]):
            if layer.keys.shape[2] == ref.shape[1] and masked is not None:  # head-wise: the cache keeps everything
                keep = torch.ones(ref.shape[1], dtype=torch.bool)
                keep[masked[2][masked[1] == h]] = False
                heads.append(keep.nonzero()[:, 0].tolist())
                continue
            match = (layer.keys[0, h][:, None, :] == ref[h][None, :, :]).all(-1)  # [n_kept, L]
            if not bool((match.sum(-1) == 1).all()):
                raise SystemExit(f"a kept key of head {h} matches {match.sum(-1).tolist()} keys")
            heads.append(sorted(match.int().argmax(-1).tolist()))
        kept.append(heads)
    for layer in model.model.layers:  # leave no head-wise mask behind for the next run
        layer.self_attn.masked_key_indices = None
    return kept


def _relay_run(model, tokenizer, module, press, spec):
    """RelayPress through kvpress's pipeline; what the question pass saw."""
    from transformers import DynamicCache, pipeline

    relay = module.RelayPress(press)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    calls, snapshot = [], {}

    def before(_model, args, kwargs):
        cache = kwargs["past_key_values"]
        if not snapshot:
            snapshot["keys"] = [layer.keys[0].clone() for layer in cache.layers]  # [kv_head, M, head_dim]
            snapshot["values"] = [layer.values[0].clone() for layer in cache.layers]
            snapshot["masked"] = [None if getattr(l.self_attn, "masked_key_indices", None) is None
                                  else [t.tolist() for t in l.self_attn.masked_key_indices] for l in model.model.layers]
        calls.append({"position_ids": kwargs["position_ids"][0].tolist(), "input_ids": kwargs["input_ids"][0].tolist()})

    def after(_model, args, kwargs, output):
        calls[-1]["logits"] = output.logits[0, -1].float().clone()

    handles = [model.register_forward_pre_hook(before, with_kwargs=True),
               model.register_forward_hook(after, with_kwargs=True)]
    try:
        answer = pipe(spec["context"], question=spec["question"], press=relay, cache=DynamicCache(),
                      max_new_tokens=spec["max_new_tokens"])["answer"]
    finally:
        for handle in handles:
            handle.remove()
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
    return {"kept": [[k.tolist() for k in layer] for layer in relay.kept], "max_count": relay.max_count,
            "calls": calls, "answer": answer, **snapshot}


def _refusal(call) -> str:
    try:
        call()
    except ValueError as err:  # RelayPressError derives from ValueError
        return f"{type(err).__name__}: {err}"
    return "accepted"


def main(module_path: str, cases_path: str, out_path: str) -> None:
    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    module = _load_press_module(module_path)
    spec = json.load(open(cases_path))
    models, prefills, out = {}, {}, {"cases": {}, "refusals": {}}
    for case in spec["cases"]:
        key = f"{case['model']}:{case.get('attn', 'sdpa')}"
        if key not in models:
            tokenizer = AutoTokenizer.from_pretrained(case["model"])
            model = AutoModelForCausalLM.from_pretrained(case["model"], attn_implementation=case.get("attn", "sdpa"),
                                                         dtype=torch.float32).eval()
            pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
            max_length = min(tokenizer.model_max_length, int(1e10))
            ids = pipe.preprocess(spec["context"], [spec["question"]], "", max_length)
            cache = transformers.DynamicCache()
            with torch.no_grad():
                model.model(input_ids=ids["context_ids"], past_key_values=cache)
            models[key] = (model, tokenizer)
            prefills[key] = {"context_ids": ids["context_ids"][0], "question_ids": ids["questions_ids"][0][0],
                             "keys": [l.keys[0].clone() for l in cache.layers],
                             "values": [l.values[0].clone() for l in cache.layers]}
        model, tokenizer = models[key]
        prefill = prefills[key]
        bare = _bare_kept(model, _press(kvpress, case), prefill["context_ids"][None], prefill["keys"])
        relay = _relay_run(model, tokenizer, module, _press(kvpress, case), spec)
        out["cases"][case["id"]] = {"model": case["model"], "prefill": key, "bare_kept": bare, **relay}
    out["prefills"] = prefills

    model, tokenizer = next(iter(models.values()))
    ids = next(iter(prefills.values()))["context_ids"][None]
    snap = kvpress.SnapKVPress(compression_ratio=0.5, window_size=4)

    def batch_of_two():
        with torch.no_grad(), module.RelayPress(snap)(model):
            model.model(input_ids=ids.repeat(2, 1), past_key_values=transformers.DynamicCache())

    out["refusals"]["batch"] = _refusal(batch_of_two)
    out["refusals"]["chunkkv"] = _refusal(lambda: module.RelayPress(kvpress.ChunkKVPress(snap)))
    out["refusals"]["rerotation"] = _refusal(lambda: module.RelayPress(kvpress.KeyRerotationPress(snap)))
    out["kvpress"] = _version("kvpress")
    out["transformers"] = transformers.__version__
    torch.save(out, out_path)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main(*sys.argv[1:4])
