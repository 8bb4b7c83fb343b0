"""Model families: what relaylens must know of each family of Hugging Face decoder models, one record per family.

:mod:`relaylens.model.hf` answers every question about a loaded model; where the answer depends on the family (how an
attention module's post-rotary queries are rebuilt, which of its layers apply no rotary), it looks up the
:class:`ModelFamily` here: by the attention module's class (:func:`query_recipes`, the table behind
:data:`relaylens.model.hf.QUERY_RECIPES`) or by the text config's ``model_type`` (:func:`family_for`). Everything else
(rotary layout, per-layer rotary types, sliding windows, caches) hf reads off the model itself, the same way for every
family. This module and hf are the one room that reaches inside ``transformers`` modules.

Families: the Llama-like default (Llama, Mistral, Qwen2, Qwen3, Gemma-2/3, GLM, Cohere: project, optional per-head
query/key norm, the modeling module's own ``apply_rotary_pos_emb``), Phi (rotary on the first ``rotary_ndims``
dimensions only), SmolLM3 (``use_rope`` per layer), Cohere-2 (rotary on sliding layers only) and EXAONE-4 (QK-norm;
rotary on sliding layers when the model has any). To support another family, add a record to :data:`FAMILIES`; the
rebuilt keys are checked against the cache, so a wrong recipe fails loudly.

Example:
    >>> family_for("cohere2").name, family_for("exaone4").name, family_for("llama").name, family_for("").name
    ('cohere2', 'exaone4', 'llama', 'llama')
    >>> [f.name for f in FAMILIES if "Qwen2Attention" in f.attention_classes]
    ['llama']
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from relaylens.errors import RopeError

__all__ = ["ModelFamily", "FAMILIES", "DEFAULT_FAMILY", "family_for", "query_recipes", "rotary_function"]


def rotary_function(attn) -> Callable:
    """The ``apply_rotary_pos_emb`` of the module that defines ``attn``'s class (the model's own rotary code)."""
    fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise RopeError(f"{type(attn).__module__} defines no apply_rotary_pos_emb; cannot rebuild queries of "
                        f"{type(attn).__name__}. Fix: pass capture_window_queries=False.")
    return fn


# ---------------------------------------------------------------------------------------- query / key recipes

def _split_heads(proj: torch.Tensor, head_dim: int) -> torch.Tensor:
    return proj.view(*proj.shape[:-1], -1, head_dim)  # [B, n, H, head_dim]


def _qk_standard(attn, hidden, cos, sin):
    """Llama / Mistral / Qwen2 / Qwen3 / Gemma-2/3 / GLM / Cohere: project, per-head norm (if any), rotate."""
    q = _split_heads(attn.q_proj(hidden), attn.head_dim)  # [B, n, q_head, head_dim]
    k = _split_heads(attn.k_proj(hidden), attn.head_dim)  # [B, n, kv_head, head_dim]
    if getattr(attn, "q_norm", None) is not None and getattr(attn, "use_qk_norm", True):
        q, k = attn.q_norm(q), attn.k_norm(k)  # norms over head_dim (Cohere: over [head, head_dim]) before transpose
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, n, head_dim]
    return rotary_function(attn)(q, k, cos, sin)


def _qk_phi(attn, hidden, cos, sin):
    """Phi: optional LayerNorm, rotary on the first ``rotary_ndims`` dims only (the rest pass through)."""
    q = _split_heads(attn.q_proj(hidden), attn.head_dim).transpose(1, 2)  # [B, q_head, n, head_dim]
    k = _split_heads(attn.k_proj(hidden), attn.head_dim).transpose(1, 2)  # [B, kv_head, n, head_dim]
    if attn.qk_layernorm:
        q, k = attn.q_layernorm(q), attn.k_layernorm(k)
    r = attn.rotary_ndims
    q_rot, k_rot = rotary_function(attn)(q[..., :r], k[..., :r], cos, sin)
    return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)


def _qk_unrotated_if(rotates: Callable[[nn.Module], bool], norms: bool = False) -> Callable:
    """A recipe for attention classes with layers that apply no rotary (NoPE): project, per-head norm when ``norms``,
    then rotate only where ``rotates(attn)`` holds, as the class's forward decides it."""

    def recipe(attn, hidden, cos, sin):
        q = _split_heads(attn.q_proj(hidden), attn.head_dim).transpose(1, 2)  # [B, q_head, n, head_dim]
        k = _split_heads(attn.k_proj(hidden), attn.head_dim).transpose(1, 2)  # [B, kv_head, n, head_dim]
        if norms:
            q, k = attn.q_norm(q), attn.k_norm(k)  # RMSNorm over head_dim
        return rotary_function(attn)(q, k, cos, sin) if rotates(attn) else (q, k)

    return recipe


# ----------------------------------------------------------------------------------------------------- families

@dataclass(frozen=True)
class ModelFamily:
    """One family of decoder models, as relaylens reads it.

    Attributes:
        name: a short label (``"cohere2"``).
        attention_classes: the attention module classes of the family whose queries and keys ``query_key`` rebuilds.
        query_key: ``(attn, hidden [B, n, hidden], cos, sin) -> (q [B, q_head, n, d], k [B, kv_head, n, d])``, the
            post-rotary queries and keys exactly as the class's forward computes them.
        model_types: the text config's ``model_type`` values of the family (``"exaone4*"``: any ``model_type``
            starting with ``exaone4``); a model whose ``model_type`` no family names is read as the default family.
        no_rotary: the family's own rule for an attention module that applies no rotary (its global layers), beside
            what every module may say itself (``use_rope``, the config's ``no_rope_layers``); None: no such rule.
    """

    name: str
    attention_classes: tuple[str, ...]
    query_key: Callable
    model_types: tuple[str, ...] = ()
    no_rotary: Callable[[nn.Module], bool] | None = None

    def matches(self, model_type: str) -> bool:
        """Whether a text config's ``model_type`` belongs to this family."""
        return any(model_type == t or (t.endswith("*") and model_type.startswith(t[:-1])) for t in self.model_types)

    def applies_no_rotary(self, attn: nn.Module | None) -> bool:
        """Whether the family's own rule says ``attn`` (an attention module, or None) applies no rotary."""
        return self.no_rotary is not None and bool(self.no_rotary(attn))


DEFAULT_FAMILY = ModelFamily(
    name="llama",
    attention_classes=("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention", "Gemma2Attention",
                       "Gemma3Attention", "GlmAttention", "CohereAttention"),
    query_key=_qk_standard,
    model_types=("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gemma3_text", "glm", "cohere"),
)
"""Llama-like models (and every model whose ``model_type`` no other family names): every layer rotates."""

#: Every family, the default first. SmolLM3 (``use_rope``), Cohere-2 (rotary on sliding layers only) and EXAONE-4
#: (QK-norm; rotary on sliding layers when the model has any) leave the queries of their NoPE layers unrotated, as
#: their forwards do (:func:`relaylens.model.hf.nope_layers`).
FAMILIES: tuple[ModelFamily, ...] = (
    DEFAULT_FAMILY,
    ModelFamily(name="phi", attention_classes=("PhiAttention",), query_key=_qk_phi, model_types=("phi",)),
    ModelFamily(name="smollm3", attention_classes=("SmolLM3Attention",),
                query_key=_qk_unrotated_if(lambda attn: bool(getattr(attn, "use_rope", True))),
                model_types=("smollm3",)),  # its layers say it themselves (use_rope / no_rope_layers)
    ModelFamily(name="cohere2", attention_classes=("Cohere2Attention",),
                query_key=_qk_unrotated_if(lambda attn: attn.sliding_window is not None),
                model_types=("cohere2",),
                no_rotary=lambda attn: getattr(attn, "sliding_window", None) is None),  # the global layers
    ModelFamily(name="exaone4", attention_classes=("Exaone4Attention",),
                query_key=_qk_unrotated_if(lambda attn: attn.sliding_window is None or bool(attn.is_sliding),
                                           norms=True),
                model_types=("exaone4*",),
                # the global layers of a model with sliding windows
                no_rotary=lambda attn: getattr(attn, "sliding_window", None) is not None
                and not getattr(attn, "is_sliding", True)),
)


def family_for(model_type: str) -> ModelFamily:
    """The family of a text config's ``model_type``; :data:`DEFAULT_FAMILY` when no family names it."""
    return next((f for f in FAMILIES if f.matches(model_type)), DEFAULT_FAMILY)


def query_recipes() -> dict[str, Callable]:
    """``{attention class name: query_key}`` of every family (a new dict: :data:`relaylens.model.hf.QUERY_RECIPES`
    is one, and callers may add entries to it)."""
    return {name: family.query_key for family in FAMILIES for name in family.attention_classes}
