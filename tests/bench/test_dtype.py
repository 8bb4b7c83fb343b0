"""``relaylens bench dtype`` end to end on a tiny Qwen2 saved to disk (two subprocess arms, one record, two tokens):
every row of the table is there and the comparisons read both runs."""

from __future__ import annotations

import math

import pytest

from relaylens.bench.dtype import answer_agreement, probe_differences, run_dtype
from relaylens.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    tiny_model("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_bench_dtype_measures_both_arms_and_compares_them(tiny_dir, tmp_path):
    rows = run_dtype(model_spec=str(tiny_dir), records=1, new_tokens=2, repeats=1, out=str(tmp_path / "runs"),
                     lengths=(256, 512))
    cases = {row["case"]: row for row in rows}
    for length in (256, 512):
        row = cases[f"prefill {length} tokens (tokens/s)"]
        assert row["float32"] > 0 and row["bfloat16"] > 0
        assert math.isclose(row["speedup"], row["bfloat16"] / row["float32"])
    record = cases["coordinate_ablation record (s, median)"]
    assert record["float32"] > 0 and math.isclose(cases["coordinate_ablation records per hour"]["float32"],
                                                  3600 / record["float32"])
    assert 0.0 <= cases["same answer text (5 rows)"]["agreement"] <= 1.0
    assert any(case.startswith("probe evidence_share") for case in cases)
    assert cases["process peak resident set (MB)"]["float32"] > 0
    runs = tmp_path / "runs"
    arms = sorted(p.name.rsplit("-", 1)[1] for p in runs.iterdir() if not p.name.startswith("."))
    assert arms == ["bfloat16", "float32"]
    # the same run compared with itself: full agreement, zero probe differences
    f32 = next(p for p in runs.iterdir() if p.name.endswith("-float32"))
    same, prefix, total = answer_agreement(f32, f32, str(tiny_dir))
    assert same == 1.0 and total == 5
    assert all(mean == 0.0 and largest == 0.0 for mean, largest, _ in probe_differences(f32, f32).values())
