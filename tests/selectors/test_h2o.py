"""H2O's column-sum capture inside the real prefill: equals eager attention, block-wise, hooks always removed."""

from __future__ import annotations

import pytest
import torch

from relaylens.errors import ShapeError
from relaylens.model.attention_stats import capture_column_sums, causal_column_sums
from relaylens.selectors import H2O
from relaylens.testing import ROPE_VARIANTS, tiny_model

L = 40



def _ids(n: int = L) -> torch.Tensor:
    return torch.randint(3, 384, (n,), generator=torch.Generator().manual_seed(5))


def _eager_column_sums(model, ids) -> list[torch.Tensor]:
    """Column sums of the full eager attention matrices, per layer ``[q_head, L]``."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids[None], output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(before)
    return [a[0].double().sum(1) for a in out.attentions]  # [q_head, L, L] -> [q_head, L]


def _prefill_with_sums(model, ids, chunk_size=None, block_size=7):
    from relaylens.model.prefill import prefill_history

    return prefill_history(model, ids, window_size=8, chunk_size=chunk_size, column_sums=True,
                           column_block_size=block_size)


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
def test_captured_column_sums_equal_eager(variant):
    """Every rope layout (YaRN amplitude, partial, interleaved, Gemma-3 sliding layers) through prefill_history."""
    model, ids = tiny_model(variant), _ids()
    pre = _prefill_with_sums(model, ids)
    ref = _eager_column_sums(model, ids)
    assert len(pre.column_sums) == len(ref)
    for got, want in zip(pre.column_sums, ref):
        torch.testing.assert_close(got.sum(-1), torch.full_like(got[:, 0], float(L)), atol=1e-4, rtol=0)  # L queries
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [16, 9])
def test_chunked_prefill_gives_the_same_sums(chunk_size):
    model, ids = tiny_model("llama"), _ids()
    whole = _prefill_with_sums(model, ids)
    chunked = _prefill_with_sums(model, ids, chunk_size=chunk_size)
    for a, b in zip(whole.column_sums, chunked.column_sums):
        # each chunk counted
        torch.testing.assert_close(b.sum(-1), torch.full_like(b[:, 0], float(L)), atol=1e-4, rtol=0)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_h2o_from_prefill_equals_eager_definition():
    model, ids = tiny_model("llama"), _ids()
    pre = _prefill_with_sums(model, ids)
    ref = _eager_column_sums(model, ids)
    k, r = 10, 5
    sel = H2O().select(pre, None, k)
    for l in range(2):
        for h in range(2):
            col = ref[l][2 * h : 2 * h + 2].mean(0)[: L - r].tolist()  # GQA mean, non-recent columns
            heavy = sorted(sorted(range(L - r), key=lambda j: (-col[j], -j))[: k - r])
            assert sel.positions[l, h].tolist() == heavy + list(range(L - r, L))


@pytest.mark.parametrize("block", [1, 5, 64])
def test_block_size_does_not_change_sums(block):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 30, 8, generator=gen) * 3, torch.randn(2, 30, 8, generator=gen)
    ref = causal_column_sums(q, k, 0.3, block_size=30)
    torch.testing.assert_close(causal_column_sums(q, k, 0.3, block_size=block), ref)
    probs = (q.view(2, 3, 30, 8) @ k[:, None].transpose(-1, -2) * 0.3).masked_fill(
        torch.ones(30, 30, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)  # [2, 3, 30, 30]
    torch.testing.assert_close(ref, probs.sum(2).reshape(6, 30))


def test_no_block_holds_more_than_heads_x_block_x_length(monkeypatch):
    """Every logits buffer is at most [kv_head, group * block, L]: no L x L matrix."""
    sizes, real_bmm = [], torch.bmm

    def spy(a, b):
        out = real_bmm(a, b)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(torch, "bmm", spy)
    q, k = torch.randn(9, 500, 16), torch.randn(3, 500, 16)
    causal_column_sums(q, k, 0.25, block_size=32)
    assert sizes and max(sizes) <= 9 * 32 * 500 < 500 * 500 * 9


def test_hooks_removed_on_exit_and_on_error():
    model = tiny_model("llama")
    attn = [layer.self_attn for layer in model.model.layers]
    with capture_column_sums(model):
        assert all(len(a._forward_hooks) == 1 for a in attn)
    assert all(len(a._forward_hooks) == 0 for a in attn)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_column_sums(model):
            raise RuntimeError("boom")
    assert all(len(a._forward_hooks) == 0 for a in attn)
    with pytest.raises(ShapeError, match="batch size 1"):
        with capture_column_sums(model), torch.no_grad():
            model(torch.ones(2, 5, dtype=torch.long))
    assert all(len(a._forward_hooks) == 0 for a in attn)


def test_second_forward_without_cache_is_refused():
    model = tiny_model("llama")
    with pytest.raises(ShapeError, match="second forward"):
        with capture_column_sums(model), torch.no_grad():
            model(_ids()[None], use_cache=False)
            model(_ids()[None], use_cache=False)
