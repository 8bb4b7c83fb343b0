"""Tiny random-weight models and a tiny tokenizer for tests and smoke notebooks. Nothing here downloads anything.

Rope variants cover what real models use: split-half default RoPE (Llama; Qwen2.5's geometry: theta 1e6, q/k/v
biases, 2 kv heads, untied output layer), YaRN with an attention-scaling amplitude (Llama, Qwen2), ``llama3`` scaling,
partial rotary (Phi), interleaved rotary (Cohere), interleaved *and* partial (GLM), and per-layer-type rotary bases with
sliding-window layers (Gemma-3).

Example:
    >>> model = tiny_model("llama")
    >>> model.config.num_hidden_layers
    2
"""

from __future__ import annotations

import torch

from relaylens.errors import RelaylensError
from relaylens.model.hf import attention_modules, query_key_projections, rms_norm_gain, rms_norms

ROPE_VARIANTS = ("llama", "llama_yarn", "llama3", "qwen2", "qwen2_yarn", "phi_partial", "cohere_interleaved",
                 "glm_partial_interleaved", "gemma3")
#: Models with layers that apply no rotary (NoPE): SmolLM3 (``no_rope_layers``), Cohere-2 and EXAONE-4 (global layers).
NOPE_VARIANTS = ("smollm3_nope", "cohere2_nope", "exaone4_nope")

_COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)


def tiny_config(variant: str = "llama", **overrides):
    """A tiny config for one rope variant (see :data:`ROPE_VARIANTS`)."""
    from transformers import (  # noqa: PLC0415 - import cost: transformers loads on first use
        CohereConfig,
        Gemma3TextConfig,
        GlmConfig,
        LlamaConfig,
        PhiConfig,
        Qwen2Config,
    )

    kw = dict(_COMMON)
    if variant == "llama":
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        cfg = LlamaConfig(**kw)
    elif variant == "llama_yarn":
        kw["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e5,
                                 "original_max_position_embeddings": 32768}
        cfg = LlamaConfig(**kw)
    elif variant == "llama3":
        kw["rope_parameters"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        }
        cfg = LlamaConfig(**kw)
    elif variant == "qwen2":  # Qwen2.5's geometry: default RoPE at theta 1e6, q/k/v biases, 2 kv heads, untied output
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
        cfg = Qwen2Config(**kw)
    elif variant == "qwen2_yarn":
        kw["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                 "original_max_position_embeddings": 32768}
        cfg = Qwen2Config(**kw)
    elif variant == "phi_partial":
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        cfg = PhiConfig(**kw)
    elif variant == "cohere_interleaved":
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        cfg = CohereConfig(**kw)
    elif variant == "glm_partial_interleaved":
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        kw["head_dim"] = 16
        cfg = GlmConfig(**kw)
    elif variant == "gemma3":
        kw.update(num_hidden_layers=3, num_key_value_heads=1, head_dim=16, sliding_window=8, query_pre_attn_scalar=16)
        kw["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"]
        kw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        }
        cfg = Gemma3TextConfig(**kw)
    elif variant in NOPE_VARIANTS:
        from transformers import Cohere2Config, Exaone4Config, SmolLM3Config  # noqa: PLC0415 - import cost: transformers loads on first use

        kw.update(num_hidden_layers=4, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        if variant == "smollm3_nope":
            cfg = SmolLM3Config(**kw, no_rope_layer_interval=2)  # no_rope_layers = [1, 0, 1, 0]: layers 1, 3 NoPE
        else:  # sliding layers rotate, global layers do not
            kw.update(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8)
            cfg = (Cohere2Config if variant == "cohere2_nope" else Exaone4Config)(**kw)
    else:
        raise RelaylensError(f"unknown tiny model variant {variant!r}. Fix: choose one of "
                             f"{ROPE_VARIANTS + NOPE_VARIANTS}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_model(variant: str = "llama", seed: int = 0, attn_implementation: str = "sdpa", dtype=torch.float32,
               **overrides):
    """A randomly initialised causal LM for ``variant``, in eval mode, float32 by default."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - import cost: transformers loads on first use

    cfg = tiny_config(variant, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation, dtype=dtype)
    return model.eval()


def peaked_model(variant: str = "llama", sharpen: float = 6.0, **kwargs):
    """:func:`tiny_model` with every layer's query and key projections scaled by ``sharpen``: random init gives
    near-uniform attention, a sharpened model has clear top keys (what attention-based selectors are tested on).

    >>> peaked_model(num_hidden_layers=3).config.num_hidden_layers
    3
    """
    model = tiny_model(variant, **kwargs)
    with torch.no_grad():
        for attn in attention_modules(model):
            for projection in query_key_projections(attn):
                projection.weight.mul_(sharpen)
    return model


_TOKENIZER_CORPUS = [
    "### Session 1:\nSession Date: 2023/05/20 (Sat) 02:21\nSession Content:\n",
    "I will give you several history chats between you and a user. Please answer the question based on the relevant "
    "chat history.",
    "Current Date: 2023/05/30 (Tue) 23:40\nQuestion: What is the name of my dog?\nAnswer:",
    "user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name for a Vizsla!",
    "The quick brown fox jumps over the lazy dog 0123456789 , . ! ? : ; ' \" ( ) [ ] { } - _ / \\",
]


def tiny_tokenizer():
    """A small byte-level BPE tokenizer with a chat template, trained in-process (vocab < 384, fits tiny models)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415 - import cost: tokenizers loads on first use
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - import cost: transformers loads on first use

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=380, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TOKENIZER_CORPUS * 4, trainer=trainer)
    chat_template = (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )


class exact_float64_norms:
    """``with exact_float64_norms(model):`` RMSNorms of a float64 model compute in float64 (transformers' RMSNorms
    round through float32, which breaks finite differences in ``torch.autograd.gradcheck``). Restores on exit.

    Example:
        >>> model = tiny_model("llama", dtype=torch.float64)
        >>> with exact_float64_norms(model):
        ...     out = model.model.norm(torch.randn(1, 64, dtype=torch.float64))
        >>> out.dtype, "forward" in vars(model.model.norm)
        (torch.float64, False)
    """

    def __init__(self, model):
        self.norms = rms_norms(model)

    def __enter__(self):
        for module in self.norms:
            gain, eps = rms_norm_gain(module)
            # 0 (Llama: weight) or 1 (Gemma: 1 + weight)
            offset = (gain - module.weight.detach().float()).mean().round()

            def forward(x, module=module, eps=eps, offset=float(offset)):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + module.weight.to(x.dtype))

            module.forward = forward
        return self

    def __exit__(self, *exc):
        for module in self.norms:
            vars(module).pop("forward", None)
