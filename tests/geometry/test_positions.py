"""The position rule (relaylens.geometry.positions): one rule on every relocation path (fused kernel, eager, float64,
autograd) and for phase replay: any integer width reads as int64, and nothing at or past 2**24 passes."""

from __future__ import annotations

import contextlib

import pytest
import torch

from relaylens.errors import PositionError
from relaylens.geometry import fused as kernels
from relaylens.geometry.rotary import RotaryFactors, relocate_keys, rotate_keys, unrotate_keys
from relaylens.testing import tiny_model

PATHS = ("fused", "eager", "float64", "autograd")
WIDTHS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32, torch.uint64)
SOURCE, TARGET = [0, 3, 9, 10, 40, 100], [7, 10, 16, 17, 47, 107]


@pytest.fixture(scope="module")
def factors():
    return RotaryFactors.from_model(tiny_model("llama"))


def _relocate(path: str, keys: torch.Tensor, source, target, factors) -> torch.Tensor:
    """``relocate_keys`` forced onto one path; the result in float64."""
    if path == "float64":
        keys = keys.double()
    elif path == "autograd":
        keys = keys.clone().requires_grad_()
    guard = kernels.disabled() if path == "eager" else contextlib.nullcontext()
    with guard:
        return relocate_keys(keys, source, target, factors).detach().double()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", WIDTHS, ids=str)
def test_every_integer_width_relocates_exactly_like_int64(factors, path, dtype):
    """Issue 28 item 14: uint8 positions indexed the float64/autograd tables as a boolean mask (keys off by 6.4, no
    error) and int8/int16 crashed the eager path, while the fused path accepted them."""
    keys = torch.randn(2, len(SOURCE), factors.head_dim, generator=torch.Generator().manual_seed(0))
    expected = _relocate(path, keys, torch.tensor(SOURCE), torch.tensor(TARGET), factors)
    got = _relocate(path, keys, torch.tensor(SOURCE, dtype=dtype), torch.tensor(TARGET, dtype=dtype), factors)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", WIDTHS, ids=str)
def test_phase_replay_reads_every_integer_width_as_positions(factors, dtype):
    content = torch.randn(2, len(SOURCE), factors.head_dim, generator=torch.Generator().manual_seed(1))
    positions = torch.tensor(SOURCE)
    rotated = rotate_keys(content, positions, factors)
    assert torch.equal(rotate_keys(content, positions.to(dtype), factors), rotated)
    assert torch.equal(unrotate_keys(rotated, positions.to(dtype), factors), unrotate_keys(rotated, positions, factors))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("source", "target", "message"), [
    (torch.tensor([0, 1, 2], dtype=torch.bool), torch.tensor([0, 1, 2]), "must be integer positions"),
    # floating-point positions are real-valued positions (tests/geometry/test_real.py): the same rule holds
    # for them on every path (no negative position); other non-integer dtypes are refused
    (torch.tensor([0, 1, 2], dtype=torch.complex64), torch.tensor([0, 1, 2]), "must be integer positions"),
    (torch.tensor([0.0, -1.0, 2.0]), torch.tensor([0, 1, 2]), "negative position"),
    (torch.tensor([0, 1, 2], dtype=torch.int8) - 3, torch.tensor([0, 1, 2]), "negative position"),
    (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2**63 - 1], dtype=torch.int64), "max_position_embeddings=131072"),
    (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2**64 - 1], dtype=torch.uint64), "2\\*\\*63 or more"),
])
def test_bad_positions_get_the_same_error_on_every_path(factors, path, source, target, message):
    keys = torch.randn(3, factors.head_dim)
    with pytest.raises(PositionError, match=message):
        _relocate(path, keys, source, target, factors)


def test_positions_float32_cannot_tell_apart_are_refused_even_when_the_config_allows_them():
    """Issue 28 item 13: a model whose config claims 2**25 positions still cannot tell positions past 2**24 apart
    (the rotary embedding's float32 positions collapse): the rule refuses them (checked without building tables)."""
    from relaylens.geometry.positions import POSITION_LIMIT, check_positions

    factors = RotaryFactors.from_model(tiny_model("llama", max_position_embeddings=2**25))
    assert factors.position_limit == POSITION_LIMIT == 2**24
    assert factors.check_positions(torch.tensor([0, 2**24 - 1]), "target positions") == 2**24 - 1
    with pytest.raises(PositionError, match=r"16777216.*2\*\*24.*float32"):
        factors.check_positions(torch.tensor([5, 2**24]), "target positions")
    with pytest.raises(PositionError, match=r"at kv_head 1, slot 0"):
        check_positions(torch.tensor([[0, 1], [2**24 + 1, 2]]), "key positions", axes=("kv_head", "slot"))


def test_float32_positions_really_collapse_at_2_24(factors):
    """Why the limit sits where it does: the model's own rotary gives 2**24 and 2**24 + 1 one phase."""
    from relaylens.model.hf import call_rotary

    # cos, sin: [1, 3, rotary_dim]
    cos, sin = call_rotary(factors.rotary_emb, torch.tensor([[2**24 - 1, 2**24, 2**24 + 1]]), None)
    assert torch.equal(cos[0, 1], cos[0, 2]) and torch.equal(sin[0, 1], sin[0, 2])
    assert not torch.equal(cos[0, 0], cos[0, 1])


@pytest.mark.parametrize(("factor", "message"),
                         [(float("inf"), "same phase in every plane"), (float("nan"), "non-finite")])
def test_a_rotary_that_encodes_no_position_is_refused(factor, message):
    """Issue 28 item 12: a linear factor of inf gives every position phase 0 (no positional encoding at all); NaN
    gives NaN phases. Rotary factors read from such a model are refused, whatever config produced it."""
    from relaylens.errors import RopeError

    model = tiny_model("llama", rope_parameters={"rope_type": "linear", "factor": factor, "rope_theta": 10000.0})
    with pytest.raises(RopeError, match=message):
        RotaryFactors.from_model(model)
