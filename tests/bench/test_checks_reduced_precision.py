"""Issue 51 item 5: ``relaylens model check`` in bfloat16 / float16 compares relocated keys with the model's own keys
at shifted positions at layer 0 (thresholded) and over all layers against the *measured* rounding of the shifted
forward, so a correct relocation passes and a wrong one still fails (on CPU here; on CUDA in tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from relaylens.bench import checks
from relaylens.testing import tiny_model, tiny_tokenizer


def _verdicts(dtype):
    model = tiny_model("qwen2", dtype=dtype)
    results = checks.run_checks(model, tiny_tokenizer(), history_tokens=120)
    return {name: (value, limit, ok) for name, value, limit, ok in checks.verdicts(results, dtype)}


def _shifted(found):
    return {name: v for name, v in found.items() if "model's own keys at p + 1000" in name and v[1] is not None}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_correct_relocation_passes_in_16_bit(dtype):
    found = _verdicts(dtype)
    failed = {name: v for name, v in found.items() if not v[2]}
    assert not failed, failed
    shifted = _shifted(found)
    assert len(shifted) == 2, found  # layer 0, and all layers against the measured tolerance
    assert any(name.startswith("shift tolerance:") for name in found)


def test_a_wrong_relocation_fails_in_bfloat16(monkeypatch):
    real = checks.relocate_keys

    def off_by_one(keys, source, target, factors, layer=None):
        return real(keys, source, target + 1, factors, layer=layer)  # one position too far

    monkeypatch.setattr(checks, "relocate_keys", off_by_one)
    shifted = _shifted(_verdicts(torch.bfloat16))
    assert shifted and not any(ok for _, _, ok in shifted.values()), shifted
