"""kvpress's own pipeline on a saved model: which context states each press keeps. Runs in the pinned kvpress
environment (``make kvpress-env``: kvpress 0.5.5 with transformers 5.2), never imports relaylens.

    python kvpress_reference.py MODEL_DIR CASES_JSON OUT_JSON

``CASES_JSON``: ``{"context": str, "question": str, "cases": [{"id", "press", "kwargs", "inner", "inner_kwargs",
"compression_ratio", "attn", "seed", "pipeline"}]}``; ``pipeline: false`` runs only the pipeline's compression step
(``with press(model): model.model(input_ids=context_ids, past_key_values=cache)``), for presses whose per-layer
cache lengths differ: kvpress 0.5.5's pipeline then fails at the question (one attention mask for all layers).
For each case the script loads the model with the case's attention kernel,
builds the press, seeds torch (when ``seed`` is set), runs ``KVPressTextGenerationPipeline`` on the context and the
question with a cache it passes in, and reads the kept positions off the compressed cache: every kept key is a
copy of one context key of an uncompressed prefill of the same ``context_ids`` (matched exactly, and each match
must be unique). ``OUT_JSON``: ``{"context_ids": [...], "kvpress": version, "transformers": version,
"kept": {id: [[positions of layer l, kv head h] ...] ...}}``.
"""

import json
import sys

import torch


def main(model_dir: str, cases_path: str, out_path: str) -> None:
    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline

    spec = json.load(open(cases_path))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    models, full_keys, out = {}, {}, {"kept": {}}
    for case in spec["cases"]:
        attn = case.get("attn", "sdpa")
        if attn not in models:
            model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn, dtype=torch.float32)
            models[attn] = model.eval()
        model = models[attn]
        pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
        max_length = min(tokenizer.model_max_length, int(1e10))
        context_ids = pipe.preprocess(spec["context"], [spec["question"]], "", max_length)["context_ids"]  # [1, L]
        out["context_ids"] = context_ids[0].tolist()
        if attn not in full_keys:  # the uncompressed prefill, exactly as the pipeline runs it
            cache = DynamicCache()
            with torch.no_grad():
                model.model(input_ids=context_ids, past_key_values=cache)
            full_keys[attn] = [layer.keys[0] for layer in cache.layers]  # per layer [kv_head, L, d]
        press_cls = getattr(kvpress, case["press"])
        kwargs = dict(case.get("kwargs", {}))
        if case.get("inner"):
            kwargs["press"] = getattr(kvpress, case["inner"])(**case.get("inner_kwargs", {}))
        press = press_cls(**kwargs)
        press.compression_ratio = case["compression_ratio"]
        if case.get("seed") is not None:
            torch.manual_seed(case["seed"])
        cache = DynamicCache()
        if case.get("pipeline", True):
            pipe(spec["context"], question=spec["question"], press=press, cache=cache, max_new_tokens=1)
        else:  # the pipeline's compression step alone (its _forward's prefill statement), see the case's note
            with torch.no_grad(), press(model):
                model.model(input_ids=context_ids, past_key_values=cache)
        kept = []
        for layer, ref in zip(cache.layers, full_keys[attn]):
            heads = []
            for h in range(ref.shape[0]):
                match = (layer.keys[0, h][:, None, :] == ref[h][None, :, :]).all(-1)  # [n_kept, L]
                if not bool((match.sum(-1) == 1).all()):
                    raise SystemExit(f"{case['id']}: a kept key of head {h} matches {match.sum(-1).tolist()} keys")
                heads.append(sorted(match.int().argmax(-1).tolist()))
            kept.append(heads)
        out["kept"][case["id"]] = kept
    out["kvpress"] = getattr(kvpress, "__version__", None) or _version("kvpress")
    out["transformers"] = transformers.__version__
    json.dump(out, open(out_path, "w"))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main(*sys.argv[1:4])
