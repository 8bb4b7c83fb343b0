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

**When a weight changes.** Every :func:`pack_linears` call (once per decode) checks each packed layer's weight and
bias: the same tensor (``data_ptr``), not written through the parameter (``_version``), and the same content. An edit
through ``param.data`` (``param.data.copy_(...)``, ``param.data[rows] = 0``) moves neither ``data_ptr`` nor
``_version``, so the content is fingerprinted too: a sample of each weight, compared bit for bit, that holds every
row and every column at least once (``max(out, in)`` entries on a wrapped diagonal) plus every
:data:`SAMPLE_STRIDE`-th entry, and each bias whole. On Qwen2.5-0.5B's shapes (169 layers, 494M weights, float32
decoding copies) the sample is 0.14% of the weights (709k entries) and the check took 56-130 ms per decode against
1.1-1.6 s for one decoding step on a shared, loaded 2-core CPU: 5-8% of one step, paid once per decode, not per
step. An edit that changes a whole row or column (a head ablated, a projection replaced, a merged adapter) is seen
unless it leaves every sampled entry of it bit for bit as it was; an edit of a few single entries can fall outside
the sample: after one, call :func:`forget_packs` (the next decode repacks).

**Per-phase dtypes** (``--dtype auto``, :mod:`relaylens.model.dtype_auto`): where this machine prefills faster in one
dtype and decodes faster in another, the model loads in the prefill's dtype and :func:`set_decoding_dtype` names the
decoding one; :func:`pack_linears` then builds each CPU linear layer's weight in that dtype once (bfloat16 weights
copied to float32 for ``F.linear``, or float32 weights cast to bfloat16 and prepacked), and inside the block each
layer casts its input to that dtype and its output back: the cache, the attention and everything between the linear
layers stay in the model's dtype, so nothing is converted per step but the activations.

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
    >>> expected = 7 * model.config.num_hidden_layers + 1 if packing_available() else 0  # oneDNN's CPU path
    >>> bool(torch.allclose(plain, packed, atol=0.05)), len(packs) == expected
    (True, True)
    >>> pack_linears(model) is packs or not packing_available()  # reused until a weight changes
    True
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from relaylens.errors import RelaylensError

__all__ = ["PACKED_DECODING", "LinearPack", "pack_linears", "packed_linears", "packing_available", "packing_applies",
           "decoding_linears", "set_decoding_dtype", "decoding_dtype", "forget_packs", "SAMPLE_STRIDE"]

PACKED_DECODING = True  # decoding steps use packed weights where available; False: plain F.linear everywhere

# model -> (identity of what was packed: rows, dtype, (data_ptr, version) per weight and bias; the packs; the
# content fingerprint of each packed weight and bias); weak: dies with the model
_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# model -> the dtype its decoding steps' linear layers compute in, set where it differs from the weights' (per phase)
_DECODING_DTYPE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DECODING_DTYPES = (torch.float32, torch.bfloat16)
SAMPLE_STRIDE = 4099  # every SAMPLE_STRIDE-th entry of a weight joins its fingerprint (prime: it walks the columns)


@dataclass(frozen=True)
class LinearPack:
    """One ``nn.Linear`` and the weight its decoding steps compute with: reordered for oneDNN (``onednn``: bfloat16,
    ``[out, in]`` in an opaque layout) or a plain copy in the decoding dtype (``F.linear``); ``bias`` in that dtype."""

    module: torch.nn.Linear
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    onednn: bool = True


def set_decoding_dtype(model, dtype: torch.dtype | None) -> None:
    """Decode ``model``'s CPU linear layers in ``dtype`` (``torch.float32`` or ``torch.bfloat16``) whatever their
    weights' dtype; None: in the weights' own dtype (the default). Lasts as long as the model.

    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama", dtype=torch.bfloat16)
    >>> set_decoding_dtype(model, torch.float32)
    >>> decoding_dtype(model), decoding_linears(model)[0]
    (torch.float32, 'float32 copies of the bfloat16 linear layers (F.linear)')
    """
    if dtype is None:
        _DECODING_DTYPE.pop(model, None)
        return
    if dtype not in _DECODING_DTYPES:
        raise RelaylensError(f"decoding dtype {dtype} is not supported; expected torch.float32 or torch.bfloat16 "
                             "(or None: the weights' own dtype). Fix: pass one of those")
    _DECODING_DTYPE[model] = dtype


def decoding_dtype(model) -> torch.dtype | None:
    """The dtype :func:`set_decoding_dtype` named for ``model``'s decoding linear layers (None: their own)."""
    return _DECODING_DTYPE.get(model)


@functools.cache
def packing_available() -> bool:
    """Whether this torch has oneDNN's prepacked linear (``torch.ops.mkldnn``) on the CPU, and this CPU runs its
    bfloat16 path (oneDNN needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT: one tiny weight is packed and used once to
    find out)."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and ops is not None and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        weight = ops._reorder_linear_weight(torch.ones(8, 8, dtype=torch.bfloat16), 8)
        out = ops._linear_pointwise(torch.ones(2, 8, dtype=torch.bfloat16), weight, None, "none", [], "")
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
        return False
    return bool((out == 8).all())


def packing_applies(model) -> tuple[bool, str]:
    """``(applies, why)``: whether :func:`pack_linears` would give ``model``'s linear layers decoding weights of
    their own, and why (manifests).

    >>> from relaylens.testing import tiny_model
    >>> packing_applies(tiny_model("llama"))
    (False, 'the linear layers are float32 on cpu; packing is for bfloat16 on a CPU')
    """
    if not PACKED_DECODING:
        return False, "turned off (relaylens.model.packed.PACKED_DECODING = False)"
    linears, target = _packable(model), decoding_dtype(model)
    if target is not None and any(m.weight.dtype != target for m in linears):
        return True, (f"decoding in {_name(target)} (per-phase --dtype auto: relaylens.model.packed."
                      "set_decoding_dtype), weights in the model's dtype for the prefill")
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not any(w.dtype == torch.bfloat16 and w.device.type == "cpu" for w in weights):
        kinds = sorted({f"{_name(w.dtype)} on {w.device.type}" for w in weights}) or ["absent"]
        return False, f"the linear layers are {', '.join(kinds)}; packing is for bfloat16 on a CPU"
    if not packing_available():
        return False, ("this torch or CPU runs no oneDNN bfloat16 prepacked linear (oneDNN needs AVX-512 BW/VL/DQ or "
                       "AVX-NE-CONVERT)")
    return True, "bfloat16 linear layers on a CPU with oneDNN"


def decoding_linears(model) -> tuple[str, str]:
    """``(what, why)``: what a decoding step's linear layers compute with (the run manifest's ``config.decoding``).

    >>> from relaylens.testing import tiny_model
    >>> decoding_linears(tiny_model("llama"))[0]
    'F.linear'
    """
    applies, why = packing_applies(model)
    target, weights = decoding_dtype(model), _weight_dtype(model)
    if not applies:
        return "F.linear", why
    if target is None or target == weights:
        return "prepacked bfloat16 (oneDNN)", why
    how = "prepacked, oneDNN" if target == torch.bfloat16 and packing_available() else "F.linear"
    return f"{_name(target)} copies of the {_name(weights)} linear layers ({how})", why


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _weight_dtype(model) -> torch.dtype | None:
    return next((m.weight.dtype for m in _packable(model)), None)


def _packable(model) -> list[torch.nn.Linear]:
    """The CPU linear layers :func:`pack_linears` builds weights for: bfloat16 ones where oneDNN can prepack them
    (and no other decoding dtype is named), and with a decoding dtype (:func:`set_decoding_dtype`) every
    floating-point one whose weights are in another dtype."""
    target, onednn = decoding_dtype(model), packing_available()
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.device.type == "cpu"
            and (target is not None and m.weight.is_floating_point() and m.weight.dtype != target
                 or m.weight.dtype == torch.bfloat16 and target in (None, torch.bfloat16) and onednn)]


def pack_linears(model, rows: int = 8) -> list[LinearPack]:
    """The decoding weights of every linear layer of ``model`` that gets its own (``rows``: the batch a oneDNN
    layout is tuned for; 1-12 rows stream alike from an 8-row layout): bfloat16 CPU weights prepacked, or with a
    decoding dtype (:func:`set_decoding_dtype`) each weight in that dtype; ``[]`` when nothing applies (another dtype
    or device, :data:`PACKED_DECODING` off, no oneDNN). Built once per model and reused while its weights stay the
    same tensors, unmodified."""
    linears = _packable(model) if PACKED_DECODING else []  # non-empty exactly where packing_applies says it applies
    if not linears:
        return []
    target = decoding_dtype(model) or torch.bfloat16
    onednn = target == torch.bfloat16 and packing_available()
    identity = (rows, target, onednn, tuple((m.weight.data_ptr(), m.weight._version) for m in linears),
                tuple(None if m.bias is None else (m.bias.data_ptr(), m.bias._version) for m in linears))
    cached = _PACKS.get(model)
    if cached is not None and cached[0] == identity and _same_content(linears, cached[2]):
        return cached[1]
    with torch.no_grad():
        prints = [_fingerprint(m) for m in linears]  # before packing: what the packs are built from
        packs = [_pack(m, target, onednn, rows) for m in linears]
    _PACKS[model] = (identity, packs, prints)
    return packs


def forget_packs(model) -> None:
    """Drop ``model``'s packs: the next :func:`pack_linears` builds them from the live weights (after an edit the
    content fingerprint may miss, see the module docstring).

    >>> from relaylens.testing import tiny_model
    >>> forget_packs(tiny_model("llama"))  # a model without packs: nothing to drop
    """
    _PACKS.pop(model, None)


def _sample_index(weight: torch.Tensor) -> torch.Tensor:
    """Row-major offsets of a weight ``[out, in]``'s fingerprint: a wrapped diagonal (every row and every column at
    least once) and every :data:`SAMPLE_STRIDE`-th entry.

    >>> offsets = _sample_index(torch.zeros(3, 5))
    >>> sorted(set((offsets // 5).tolist())), sorted(set((offsets % 5).tolist()))
    ([0, 1, 2], [0, 1, 2, 3, 4])
    """
    out, width = weight.shape
    k = torch.arange(max(out, width))
    return torch.cat(((k % out) * width + k % width, torch.arange(0, out * width, SAMPLE_STRIDE)))


def _sampled(weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The entries of ``weight`` at row-major ``offsets`` (``index_select`` on the flat view: a gather, no copy of
    the weight; a non-contiguous weight is indexed by row and column)."""
    if weight.is_contiguous():
        return weight.reshape(-1).index_select(0, offsets)
    return weight[offsets // weight.shape[1], offsets % weight.shape[1]]


def _fingerprint(module: torch.nn.Linear) -> tuple:
    """``(offsets, the weight's sampled entries, the bias)``, copies taken now (compared bit for bit later)."""
    weight = module.weight.detach()
    offsets = _sample_index(weight)
    bias = None if module.bias is None else module.bias.detach().clone()
    return offsets, _sampled(weight, offsets), bias


def _same_content(linears: list[torch.nn.Linear], prints: list[tuple]) -> bool:
    """Whether every weight still holds its fingerprinted entries, and every bias its values, bit for bit (so a NaN
    that stayed a NaN counts as unchanged)."""
    for module, (offsets, sample, bias) in zip(linears, prints, strict=True):
        if not _bits_equal(_sampled(module.weight.detach(), offsets), sample):
            return False
        if bias is not None and not _bits_equal(module.bias.detach(), bias):
            return False
    return True


_SAME_SIZE_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = _SAME_SIZE_INTEGERS[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _pack(module: torch.nn.Linear, target: torch.dtype, onednn: bool, rows: int) -> LinearPack:
    weight = module.weight.detach().to(target)  # [out, in]
    bias = None if module.bias is None else module.bias.detach().to(target)  # [out]
    if onednn:
        return LinearPack(module, torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias, True)
    return LinearPack(module, weight.contiguous(), bias, False)


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
    weight, bias, onednn, own = pack.weight, pack.bias, pack.onednn, pack.module.weight.dtype
    compute = torch.bfloat16 if onednn else weight.dtype

    def forward(hidden: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if hidden.dtype != own or torch.is_grad_enabled():
            raise RuntimeError(f"packed linear layers run {_name(own)} decoding without gradients only; got "
                               f"{hidden.dtype} with gradients {'on' if torch.is_grad_enabled() else 'off'}. "
                               "Fix: leave relaylens.model.packed.packed_linears before other work")
        x = hidden.to(compute)  # the decoding dtype; a no-op where it is the model's
        if onednn:
            out = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        else:
            out = torch.nn.functional.linear(x, weight, bias)
        return out.to(own)

    return forward
