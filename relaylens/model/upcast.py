"""bfloat16 matrix products computed by float32 kernels, inside a ``with`` block, for CPUs without bfloat16 hardware.

Why: a CPU without AMX-BF16 or AVX512-BF16 (an AVX2-only AMD EPYC this project ran on) has no fast bfloat16 matrix
product; torch falls back to slow kernels. Measured on that CPU with Qwen2.5-Coder-0.5B: one 2,048-token prefill
chunk took 103 s in bfloat16 and 23 s with its products upcast (float32: 16 s) (``docs/performance.md``).

What changes, and what does not. Inside :func:`float32_products`, every matrix product (``F.linear``,
``matmul``/``@``, ``mm``, ``bmm``, ``baddbmm``, ``F.scaled_dot_product_attention``) that receives a bfloat16 tensor
receives instead the same values in float32 (exact: every bfloat16 value is a float32 value) and returns its
result rounded back to bfloat16. A product of two bfloat16 numbers is exact in float32 (8 + 8 significant bits) and
bfloat16 kernels with hardware support (AVX512-BF16, AMX, tensor cores) accumulate in float32 too, so the two paths
differ only in the order of the float32 additions — the same kind of difference as between two CPUs' bfloat16
kernels, or between two batch sizes. Everything else (weights, cache, residual stream, norms, rotary
products, element-wise ops) stays in bfloat16 exactly as before. Weights are upcast once per block, not per call
(a float32 copy of every bfloat16 parameter the block touches lives as long as the block: 4 bytes per parameter);
a parameter that autograd tracks is upcast per call instead, so its gradient still reaches it.

:func:`upcast_applies` says where runs use it: a bfloat16 model on a CPU that :func:`relaylens.model.placement.
bfloat16_native` finds without native support, unless :data:`UPCAST_PRODUCTS` is False. A run's manifest records it
(``config.placement.products``) and so does every unit's machine stamp; ``relaylens judge`` uses it for a local judge.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama", dtype=torch.bfloat16)
    >>> ids = torch.tensor([[5, 6, 7, 8]])
    >>> with torch.no_grad():
    ...     plain = model(ids).logits
    ...     with float32_products() as counts:
    ...         upcast = model(ids).logits
    >>> upcast.dtype, bool(torch.allclose(plain, upcast, atol=0.05)), counts["linear"] > 0
    (torch.bfloat16, True, True)
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["UPCAST_PRODUCTS", "float32_products", "upcast_applies", "model_upcast", "PRODUCTS"]

UPCAST_PRODUCTS = True  # False: bfloat16 products run in bfloat16 kernels everywhere (the slow path on such CPUs)

PRODUCTS = {  # the matrix products the block computes in float32, by the name its counts use
    F.linear: "linear",
    torch.matmul: "matmul",
    torch.Tensor.matmul: "matmul",
    torch.Tensor.__matmul__: "matmul",
    torch.mm: "mm",
    torch.bmm: "bmm",
    torch.baddbmm: "baddbmm",
    F.scaled_dot_product_attention: "sdpa",
}


def upcast_applies(dtype: torch.dtype | str, device: str | None) -> tuple[bool, str]:
    """``(applies, why)``: whether runs of a ``dtype`` model on ``device`` compute its products in float32.

    >>> upcast_applies(torch.float32, "cpu")
    (False, 'the model is float32; upcasting is for bfloat16 on a CPU without bfloat16 hardware')
    """
    from relaylens.model.placement import bfloat16_native  # noqa: PLC0415 - placement imports this module's users

    name = str(dtype).removeprefix("torch.")
    if name != "bfloat16" or not str(device or "").startswith("cpu"):
        where = f" on {device}" if device and not str(device).startswith("cpu") else ""
        return False, f"the model is {name}{where}; upcasting is for bfloat16 on a CPU without bfloat16 hardware"
    native, why = bfloat16_native("cpu")
    if native:
        return False, f"{why}: bfloat16 products run natively"
    if not UPCAST_PRODUCTS:
        return False, "turned off (relaylens.model.upcast.UPCAST_PRODUCTS = False)"
    return True, f"{why}: bfloat16 products computed by float32 kernels, results rounded to bfloat16"


def model_upcast(model) -> tuple[bool, str]:
    """:func:`upcast_applies` for a loaded model (its first parameter's dtype and device).

    >>> from relaylens.testing import tiny_model
    >>> model_upcast(tiny_model("llama"))[0]
    False
    """
    weight = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if weight is None:
        return False, "the model has no parameters to read a dtype from"
    return upcast_applies(weight.dtype, weight.device.type)


class _Float32Products(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(parameter) -> (parameter, float32 copy)
        self.counts: Counter = Counter()

    def _up(self, value):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bfloat16:
            return value
        if isinstance(value, torch.nn.Parameter) and not (value.requires_grad and torch.is_grad_enabled()):
            held = self.weights.get(id(value))
            if held is None or held[0] is not value:
                held = self.weights[id(value)] = (value, value.detach().float())
            return held[1]
        return value.float()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = PRODUCTS.get(func)
        if name is None or not any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
                                   for a in (*args, *kwargs.values())):
            return func(*args, **kwargs)
        if "out" in kwargs:  # an out= tensor fixes the result's dtype: leave the call as it is
            return func(*args, **kwargs)
        self.counts[name] += 1
        result = func(*(self._up(a) for a in args), **{k: self._up(v) for k, v in kwargs.items()})
        return result.to(torch.bfloat16)


@contextlib.contextmanager
def float32_products(enabled: bool = True) -> Iterator[Counter]:
    """Compute every bfloat16 matrix product inside the block with float32 kernels (see the module docstring);
    yields a counter of the products upcast, by kind. ``enabled=False`` changes nothing (yields an empty counter).
    Nests; nothing outlives the block."""
    if not enabled:
        yield Counter()
        return
    mode = _Float32Products()
    try:
        with mode:
            yield mode.counts
    finally:
        mode.weights.clear()
