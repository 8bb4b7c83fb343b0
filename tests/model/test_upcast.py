"""bfloat16 products by float32 kernels (relaylens.model.upcast): each product equals an independent float64
reference rounded to bfloat16 (to one bfloat16 step where the float32 sum lands on the other side of a rounding
boundary), other dtypes pass untouched, nothing outlives the block, and a run on a CPU without bfloat16 hardware
uses it, records it in its manifest and stamps it into every unit."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from relaylens.model import upcast
from relaylens.model.upcast import float32_products, upcast_applies

BF = torch.bfloat16


def _reference(kind: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product in float64 from the same bfloat16 values, rounded once to bfloat16."""
    a, b = a.double(), b.double()
    if kind == "linear":
        return (a @ b.T).to(BF)
    if kind == "sdpa":  # a, b: [head, n, d]; b serves as keys and values
        scores = (a @ b.transpose(-1, -2)) / a.shape[-1] ** 0.5
        return (scores.softmax(-1) @ b).to(BF)
    return (a @ b).to(BF)


CALLS = {
    "linear": (lambda a, b: F.linear(a, b), (48, 96), (80, 96)),
    "matmul": (lambda a, b: a @ b, (3, 48, 96), (96, 40)),
    "bmm": (lambda a, b: torch.bmm(a, b), (3, 48, 96), (3, 96, 40)),
    "sdpa": (lambda a, b: F.scaled_dot_product_attention(a, b, b), (2, 24, 64), (2, 24, 64)),
}


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_products_equal_a_float64_reference_rounded_to_bfloat16(kind):
    call, shape_a, shape_b = CALLS[kind]
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(shape_a, generator=gen).to(BF), torch.randn(shape_b, generator=gen).to(BF)
    with float32_products() as counts:
        got = call(a, b)
    want = _reference(kind, a, b)
    assert got.dtype == BF and got.shape == want.shape
    assert sum(counts.values()) == 1 and counts[kind] == 1, counts
    exact = (got == want).double().mean().item()
    step = want.double().abs().clamp_min(2.0 ** -126) * 2.0 ** -7  # one bfloat16 step (8 significant bits)
    assert exact > 0.97, exact
    assert bool(((got.double() - want.double()).abs() <= step * 1.0001).all())


def test_other_dtypes_pass_untouched_and_nothing_outlives_the_block():
    a, b = torch.randn(8, 16), torch.randn(4, 16)
    depth = torch._C._len_torch_function_stack()
    with float32_products() as counts:
        inside = F.linear(a, b)
        assert torch._C._len_torch_function_stack() == depth + 1
    assert torch._C._len_torch_function_stack() == depth and not counts
    assert torch.equal(inside, F.linear(a, b))
    with float32_products(enabled=False) as off:
        F.linear(a.to(BF), b.to(BF))
    assert not off and torch._C._len_torch_function_stack() == depth


def test_a_tiny_bfloat16_model_runs_its_products_in_float32():
    from relaylens.testing import tiny_model

    model = tiny_model("llama", dtype=BF, seed=0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        plain = model(ids).logits
        with float32_products() as counts:
            upcast_logits = model(ids).logits
        full = tiny_model("llama", dtype=torch.float32, seed=0)(ids).logits
    layers = model.config.num_hidden_layers
    assert counts["linear"] >= 7 * layers and counts["sdpa"] == layers, counts
    assert upcast_logits.dtype == BF
    # both are bfloat16 computations of the float32 model: neither is further from it than bfloat16 rounding allows
    scale = full.abs().max().item()
    assert (upcast_logits.float() - full).abs().max().item() < 0.05 * scale
    assert (plain.float() - full).abs().max().item() < 0.05 * scale


@pytest.mark.parametrize(("flags", "dtype", "device", "applies"), [
    ("fpu avx2", BF, "cpu", True),
    ("", BF, "cpu", True),  # flags unknown: no native bfloat16 assumed
    ("fpu avx512_bf16", BF, "cpu", False),
    ("fpu amx_bf16", BF, "cpu", False),
    ("fpu avx2", torch.float32, "cpu", False),
    ("fpu avx2", BF, "cuda:0", False),
])
def test_upcast_applies_to_bfloat16_on_a_cpu_without_bfloat16_hardware(monkeypatch, flags, dtype, device, applies):
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", flags)
    got, why = upcast_applies(dtype, device)
    assert got is applies and why
    if applies:
        monkeypatch.setattr(upcast, "UPCAST_PRODUCTS", False)
        assert upcast_applies(dtype, device) == (False, "turned off (relaylens.model.upcast.UPCAST_PRODUCTS = False)")


@pytest.mark.parametrize(("flags", "applies"), [("fpu avx2", True), ("fpu avx512_bf16", False)])
def test_a_run_uses_records_and_stamps_the_upcast(tmp_path, monkeypatch, flags, applies):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments import runner
    from relaylens.experiments.specs import load_analysis
    from relaylens.results.store import RunStore
    from relaylens.testing import tiny_model, tiny_tokenizer

    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", flags)
    seen = []

    def counting(enabled=True):
        seen.append(enabled)
        return float32_products(enabled)

    monkeypatch.setattr(runner, "float32_products", counting)
    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=4, history_tokens=600)))
    spec = load_analysis("main_table").spec.replace(selectors=("snapkv",), budgets=(0.4,), max_new_tokens=3)
    out = tmp_path / "run"
    runner.run_analysis(spec, runner.RunConfig(data=str(data), out=str(out)), progress=False,
                        model_and_tokenizer=(tiny_model("llama", dtype=BF, seed=0), tiny_tokenizer()))
    assert seen == [applies] * 2  # one block per record
    manifest = json.loads((out / "manifest.json").read_text())
    assert ("products" in manifest["config"]["placement"]) is applies
    store = RunStore.open(out)
    stamps = [store.unit_machine(path) for path in store.unit_paths()]
    assert len(stamps) == 2
    assert all(("products" in stamp) is applies for stamp in stamps), stamps


def test_gradients_reach_a_tracked_bfloat16_parameter_through_the_block():
    layer = torch.nn.Linear(16, 8).to(BF)
    x = torch.randn(4, 16).to(BF)
    with float32_products():
        layer(x).float().sum().backward()
    upcast_grad = layer.weight.grad.clone()
    layer.weight.grad = None
    layer(x).float().sum().backward()
    assert upcast_grad.dtype == BF and torch.allclose(upcast_grad.float(), layer.weight.grad.float(), atol=1e-2)
