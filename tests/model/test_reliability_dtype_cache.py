"""Round 5 (issue 52, item 16): a damaged ``$RELAYLENS_CACHE/dtype_auto.json`` entry of this machine -- a dtype missing,
text or a boolean where a number belongs, NaN, infinity, zero or a negative time, a bad shape -- is measured again and
replaced, as the module promises: never a traceback, never a choice made by NaN."""

from __future__ import annotations

import json
import math

import pytest

from relaylens.model import dtype_auto
from relaylens.model.placement import Placement

FLAGS = frozenset({"fpu", "avx512f", "avx512_bf16"})
GOOD = {"decode_ms": {"float32": 1.0, "bfloat16": 0.5}, "prefill_gflops": {"float32": 90.0, "bfloat16": 300.0},
        "packed": True, "shape": [896, 4864], "rows": 5, "prefill_rows": 2048, "measured_at": "2026-01-01T00:00:00Z"}
DAMAGE = {
    "bfloat16 missing": ("decode_ms", {"float32": 1.0}),
    "float32 missing": ("prefill_gflops", {"bfloat16": 300.0}),
    "text": ("decode_ms", {"float32": "1.0", "bfloat16": 0.5}),
    "NaN": ("decode_ms", {"float32": math.nan, "bfloat16": 0.5}),
    "infinity": ("prefill_gflops", {"float32": math.inf, "bfloat16": 300.0}),
    "zero": ("decode_ms", {"float32": 1.0, "bfloat16": 0.0}),
    "negative": ("prefill_gflops", {"float32": 90.0, "bfloat16": -1.0}),
    "boolean": ("decode_ms", {"float32": True, "bfloat16": 0.5}),
    "not a mapping": ("decode_ms", [1.0, 0.5]),
    "packed as text": ("packed", "yes"),
    "bad shape": ("shape", [896]),
    "shape of text": ("shape", ["896", 4864]),
}


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    monkeypatch.delenv("RELAYLENS_DTYPE_AUTO", raising=False)
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", " ".join(sorted(FLAGS)))
    calls = []

    def fake(key, *args, **kwargs):
        calls.append(key)
        return dtype_auto.Measurement(key, {"float32": 4.0, "bfloat16": 1.0}, {"float32": 90.0, "bfloat16": 300.0},
                                      True)

    monkeypatch.setattr(dtype_auto, "measure", fake)
    return calls


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_measured_again_and_replaced(measuring, tmp_path, damage):
    key = dtype_auto.machine_key(FLAGS)
    field, value = DAMAGE[damage]
    path = tmp_path / "dtype_auto.json"
    path.write_text(json.dumps({key: {**GOOD, "key": key, field: value}}, allow_nan=True))
    placement = Placement.resolve("cpu", "auto")
    assert measuring == [key], "measured again"
    assert placement.dtype == "bfloat16" and "measured on this machine (now)" in placement.dtype_reason
    stored = json.loads(path.read_text())[key]
    assert stored["decode_ms"] == {"float32": 4.0, "bfloat16": 1.0}, "the damaged entry was replaced"
    measurement, cached = dtype_auto.measured(FLAGS)
    assert cached and measuring == [key], "the replacement is read back, not measured a third time"


def test_a_whole_entry_is_read_back_as_before(measuring, tmp_path):
    key = dtype_auto.machine_key(FLAGS)
    (tmp_path / "dtype_auto.json").write_text(json.dumps({key: {**GOOD, "key": key}}))
    measurement, cached = dtype_auto.measured(FLAGS)
    assert cached and measuring == [] and measurement.decode_ms == GOOD["decode_ms"]
    assert measurement.shape == (896, 4864) and dtype_auto.choose(measurement) == ("bfloat16", "bfloat16")
