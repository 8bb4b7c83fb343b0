"""``random:NAME`` model specs: a named architecture's published config with **random weights**, no download.

They let speed and exactness be measured on machines that cannot fetch weights (a GPU box without network): the
relocation, the decoding step, ``relaylens model check`` and the benchmarks run on the real shapes (layers, heads,
head_dim, rotary type and scaling, vocabulary). Their answers mean nothing, so every analysis that reports accuracy
refuses them before anything loads (:func:`refuse_random`); ``relaylens bench`` and ``relaylens model check`` take them.

Spec grammar: ``random:NAME`` or ``random:NAME?key=value&key=value`` where NAME is one of :data:`RANDOM_SPECS` and each
``key`` a config field to override (integers, floats, true/false), e.g. ``random:llama-3.1-8b?num_hidden_layers=2`` for
a fast test. The tokenizer is :func:`byte_tokenizer` (ids below 260: valid for every vocabulary).

Example:
    >>> config = random_config("random:llama-3.1-8b?num_hidden_layers=2")
    >>> config.num_hidden_layers, config.num_key_value_heads, config.rope_parameters["rope_type"]
    (2, 8, 'llama3')
    >>> is_random_spec("random:qwen2-7b"), is_random_spec("smollm2-135m-instruct")
    (True, False)
"""

from __future__ import annotations

import json
import os
from importlib import resources

from relaylens.errors import ModelError

PREFIX = "random:"
RANDOM_SPECS = {
    "llama-3.1-8b": "llama-3.1-8b.json",
    "qwen2-7b": "qwen2-7b.json",
    "qwen2.5-7b": "qwen2.5-7b.json",
    "qwen2.5-0.5b": "qwen2.5-0.5b.json",
}
"""Bundled configs (``relaylens/model/configs/``): the published ``config.json`` values of each architecture."""

_SEED = 0  # weights are drawn from transformers' own initialiser under this seed: the same model on every machine


def is_random_spec(spec) -> bool:
    """Whether ``spec`` names random weights (``random:...``)."""
    return isinstance(spec, str | os.PathLike) and os.fspath(spec).startswith(PREFIX)


def parse_random_spec(spec: str) -> tuple[str, dict]:
    """``(name, overrides)`` of a ``random:NAME?key=value&...`` spec; a one-line :class:`ModelError` otherwise.

    >>> parse_random_spec("random:qwen2.5-0.5b?num_hidden_layers=2&rms_norm_eps=1e-5")
    ('qwen2.5-0.5b', {'num_hidden_layers': 2, 'rms_norm_eps': 1e-05})
    """
    text = os.fspath(spec)[len(PREFIX):]
    name, _, query = text.partition("?")
    if name not in RANDOM_SPECS:
        raise ModelError(f"unknown random-weights architecture {name!r} in {spec!r}; known: "
                         f"{', '.join(PREFIX + n for n in RANDOM_SPECS)}. Fix: pick one of them")
    overrides = {}
    for item in filter(None, query.split("&")):
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ModelError(f"config override {item!r} in {spec!r} is not key=value. Fix: write e.g. "
                             f"{PREFIX}{name}?num_hidden_layers=2")
        overrides[key] = _value(raw, item, spec)
    return name, overrides


def _value(raw: str, item: str, spec: str):
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    raise ModelError(f"config override {item!r} in {spec!r} needs a number or true/false. Fix: e.g. "
                     "num_hidden_layers=2")


def random_config(spec: str):
    """The transformers config of ``spec``: the bundled JSON, then the overrides (each must name an existing field)."""
    from transformers import AutoConfig  # noqa: PLC0415 - import cost: transformers loads on first use

    name, overrides = parse_random_spec(spec)
    doc = json.loads(resources.files("relaylens.model").joinpath("configs", RANDOM_SPECS[name]).read_text("utf-8"))
    doc = {k: v for k, v in doc.items() if not k.startswith("_")}
    config = AutoConfig.for_model(doc.pop("model_type"), **doc)
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ModelError(f"{spec!r}: the {name} config has no field {key!r}. Fix: override one of its fields "
                             "(num_hidden_layers, hidden_size, num_key_value_heads, max_position_embeddings, ...)")
        setattr(config, key, value)
    return config


def load_random(spec: str, dtype, device: str | None, attn_implementation: str, config=None):
    """``(model, tokenizer)`` for a ``random:`` spec: weights drawn on ``device`` directly (no CPU copy of an 8B
    model), in ``dtype``, eval mode; the tokenizer is :func:`byte_tokenizer`."""
    import torch  # noqa: PLC0415 - import cost
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - import cost: transformers loads on first use

    config = config if config is not None else random_config(spec)
    torch.manual_seed(_SEED)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.config.name_or_path = os.fspath(spec)
    return model.eval(), byte_tokenizer()


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens, then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) with a
    ChatML template: every id is below 260, so it fits every vocabulary; random weights need no better one.

    >>> tok = byte_tokenizer()
    >>> ids = tok("Hi!").input_ids
    >>> len(ids), max(ids) < 260, tok.decode(ids)
    (3, True, 'Hi!')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 - import cost
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - import cost: transformers loads on first use

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    chat_template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                   pad_token="<|endoftext|>", chat_template=chat_template)


def refuse_random(spec, what: str) -> None:
    """Raise :class:`ModelError` for a ``random:`` spec in ``what`` (an analysis that reports accuracy): random
    weights answer nothing, so its accuracy would be noise presented as a result.

    >>> refuse_random("random:llama-3.1-8b", "relaylens run main_table")
    Traceback (most recent call last):
    ...
    relaylens.errors.ModelError: relaylens run main_table reports accuracy, but 'random:llama-3.1-8b' has random weights (no trained model behind it): its scores would be noise. Fix: pass trained weights (a local Hugging Face directory, a hub id or an embedded name); random: specs serve relaylens bench and relaylens model check
    """  # noqa: E501 - doctest: an exception message is matched on one line
    if is_random_spec(spec):
        raise ModelError(f"{what} reports accuracy, but {os.fspath(spec)!r} has random weights (no trained model "
                         "behind it): its scores would be noise. Fix: pass trained weights (a local Hugging Face "
                         "directory, a hub id or an embedded name); random: specs serve relaylens bench and relaylens "
                         "model check")
