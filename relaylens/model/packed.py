"""Prepacked bfloat16 linear layers for CPU decoding steps: the weights reordered once for oneDNN's small-batch
product, used only inside a ``with`` block.

Why: a decoding step reads every weight once with 1-12 rows. On the AMD EPYC without AMX this project measured,
``F.linear`` in bfloat16 streams weights at 21-25 GB/s at those rows, a oneDNN-prepacked weight at 34-40 GB/s
(``docs/performance.md``). :func:`pack_linears` reorders every bfloat16 ``nn.Linear`` of a CPU model once and keeps
the packs beside the model (a second copy of its linear weights, for as long as the model lives, reused by every
decode and rebuilt when a weight changes; reordering Qwen2.5-0.5B takes 0.7-2.5 s on this CPU, more than a short
answer's decoding saves); :func:`packed_linears` makes those modules use the packed copies inside a ``with`` block
and restores their own forward on exit, so no patched forward outlives the block.
Models that are not bfloat16 on a CPU, or a torch without oneDNN's prepacked linear, get no packs (``[]``), and the
block then changes nothing.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama", dtype=torch.bfloat16)
    >>> packs = pack_linears(model)
    >>> ids = torch.tensor([[5, 6, 7]])
    >>> with torch.no_grad():
    ...     plain = model(ids).logits
    ...     with packed_linears(packs):
    ...         packed = model(ids).logits
    >>> bool(torch.allclose(plain, packed, atol=0.05)), len(packs) == 7 * model.config.num_hidden_layers + 1
    (True, True)
    >>> pack_linears(model) is packs  # reused until a weight changes
    True
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["PACKED_DECODING", "LinearPack", "pack_linears", "packed_linears", "packing_available", "packing_applies"]

PACKED_DECODING = True  # decoding steps use packed weights where available; False: plain F.linear everywhere

# model -> (identity of what was packed: rows, (data_ptr, version) per weight; the packs); weak: dies with the model
_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class LinearPack:
    """One ``nn.Linear`` and its weight reordered for oneDNN (``[out, in]``, an opaque oneDNN layout)."""

    module: torch.nn.Linear
    weight: torch.Tensor


def packing_available() -> bool:
    """Whether this torch has oneDNN's prepacked linear (``torch.ops.mkldnn``) on the CPU."""
    ops = getattr(torch.ops, "mkldnn", None)
    return bool(torch.backends.mkldnn.is_available() and ops is not None and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise"))


def packing_applies(model) -> tuple[bool, str]:
    """``(applies, why)``: whether :func:`pack_linears` would pack ``model``'s linear layers, and why (manifests).

    >>> from relaylens.testing import tiny_model
    >>> packing_applies(tiny_model("llama"))
    (False, 'the linear layers are float32 on cpu; packing is for bfloat16 on a CPU')
    """
    if not PACKED_DECODING:
        return False, "turned off (relaylens.model.packed.PACKED_DECODING = False)"
    if not packing_available():
        return False, "this torch has no oneDNN prepacked linear"
    if _packable(model):
        return True, "bfloat16 linear layers on a CPU with oneDNN"
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    kinds = sorted({f"{str(w.dtype).removeprefix('torch.')} on {w.device.type}" for w in weights}) or ["absent"]
    return False, f"the linear layers are {', '.join(kinds)}; packing is for bfloat16 on a CPU"


def _packable(model) -> list[torch.nn.Linear]:
    """The linear layers :func:`pack_linears` packs: bfloat16 weights on the CPU."""
    return [module for module in model.modules() if isinstance(module, torch.nn.Linear)
            and module.weight.dtype == torch.bfloat16 and module.weight.device.type == "cpu"]


def pack_linears(model, rows: int = 8) -> list[LinearPack]:
    """The packs of every bfloat16 ``nn.Linear`` of ``model`` on the CPU (``rows``: the batch the layout is tuned
    for; 1-12 rows stream alike from an 8-row layout); ``[]`` when packing does not apply (another dtype or device,
    :data:`PACKED_DECODING` off, no oneDNN). Built once per model and reused while its weights stay the same
    tensors, unmodified."""
    if not PACKED_DECODING or not packing_available():
        return []
    linears = _packable(model)
    identity = (rows, tuple((m.weight.data_ptr(), m.weight._version) for m in linears))
    cached = _PACKS.get(model)
    if cached is not None and cached[0] == identity:
        return cached[1]
    with torch.no_grad():
        packs = [LinearPack(m, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)) for m in linears]
    _PACKS[model] = (identity, packs)
    return packs


@contextlib.contextmanager
def packed_linears(packs: list[LinearPack]) -> Iterator[None]:
    """Inside the block, each packed module computes with its packed weight (no autograd: decoding only); on exit
    every module gets back exactly the forward it had (its class's, or an instance one such as accelerate's hook)."""
    saved = []
    try:
        for pack in packs:
            saved.append((pack.module, pack.module.__dict__.get("forward")))
            pack.module.forward = _packed_forward(pack)
        yield
    finally:
        for module, forward in saved:
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _packed_forward(pack: LinearPack):
    weight, bias = pack.weight, pack.module.bias

    def forward(hidden: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if hidden.dtype != torch.bfloat16 or torch.is_grad_enabled():
            raise RuntimeError("packed linear layers run bfloat16 decoding without gradients only; got "
                               f"{hidden.dtype} with gradients {'on' if torch.is_grad_enabled() else 'off'}. "
                               "Fix: leave relaylens.model.packed.packed_linears before other work")
        return torch.ops.mkldnn._linear_pointwise(hidden, weight, bias, "none", [], "")

    return forward
