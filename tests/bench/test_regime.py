"""``relaylens bench regime``: one arm in this process on a tiny bfloat16 Qwen2 saved to disk (one record, two
tokens) runs with its flags set and leaves them as it found them; the rows are the arithmetic of the two arms; a bad
arm name or a used output folder is refused before any model loads; the command passes ``--dtype`` only when given."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from relaylens.bench import regime, registry
from relaylens.cli import app
from relaylens.errors import RelaylensError
from relaylens.experiments import runner
from relaylens.generation import attention
from relaylens.model import packed
from relaylens.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    tiny_model("qwen2", dtype=torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_an_arm_runs_with_its_flags_and_restores_them(tiny_dir, tmp_path, monkeypatch):
    seen, original = [], runner.run_analysis

    def spy(*args, **kwargs):  # the flags in force while each record runs
        seen.append((packed.PACKED_DECODING, attention.FUSED_UNOBSERVED))
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "run_analysis", spy)
    assert packed.PACKED_DECODING and attention.FUSED_UNOBSERVED, "the defaults are the 'after' path"
    result = regime.run_arm(str(tiny_dir), "before", records=1, out=tmp_path / "before", new_tokens=2)
    assert seen == [(False, False)] * 2, "warm-up and the timed record run with both flags off"
    assert (packed.PACKED_DECODING, attention.FUSED_UNOBSERVED) == (True, True), "the arm left the flags changed"
    assert result["flags"] == {"PACKED_DECODING": False, "FUSED_UNOBSERVED": False} and result["packed_linears"] == 0
    assert result["dtype"] == "bfloat16" and result["max_new_tokens"] == 2 and result["rows"] == 5
    assert len(result["record_times_s"]) == 1 and result["record_s"] == result["record_times_s"][0] > 0
    assert 0 < result["generated_tokens"] <= 10 and 0.0 <= result["hit_limit_rate"] <= 1.0
    assert result["packing_available"] == packed.packing_available() and "torch threads" in result["cpu"]


def test_flags_are_restored_when_the_run_fails():
    with pytest.raises(RuntimeError, match="boom"), regime.decoding_flags("before"):
        assert (packed.PACKED_DECODING, attention.FUSED_UNOBSERVED) == (False, False)
        raise RuntimeError("boom")
    assert (packed.PACKED_DECODING, attention.FUSED_UNOBSERVED) == (True, True)


def _arm(record_s: float, tokens_per_s: float, on: bool) -> dict:
    return dict(record_s=record_s, record_times_s=[record_s - 1, record_s, record_s + 5], tokens_per_s=tokens_per_s,
                prefill_s=6.0 if not on else 4.0,
                hit_limit_rate=0.2, cpu="AMD EPYC (2 torch threads)", dtype="bfloat16", max_new_tokens=512,
                flags=dict(PACKED_DECODING=on, FUSED_UNOBSERVED=on), packing_available=True,
                packed_linears=169 if on else 0)


def test_rows_compute_speedup_and_records_per_hour():
    rows = {r["case"]: r for r in regime.regime_rows("qwen", _arm(45.0, 40.0, False), _arm(30.0, 50.0, True),
                                                     (0.8, 12.5, 10))}
    record = rows["coordinate_ablation record (s, median)"]
    assert (record["before"], record["after"], record["speedup"]) == (45.0, 30.0, 1.5)
    hourly = rows["coordinate_ablation records per hour (all timed records)"]  # 3 records in 139 s vs 94 s
    assert math.isclose(hourly["before"], 3 * 3600 / 139) and math.isclose(hourly["after"], 3 * 3600 / 94)
    assert math.isclose(hourly["speedup"], 139 / 94)
    assert rows["prefill per record (s, mean)"]["speedup"] == 1.5
    assert math.isclose(rows["generated tokens per second (all rows)"]["speedup"], 1.25)
    assert rows["each record (s)"]["after"] == "29.0, 30.0, 35.0"
    assert rows["same answer text (10 rows)"]["agreement"] == 0.8
    assert rows["answers that hit the limit (512 tokens)"]["before"] == 0.2
    path = rows["decoding path"]
    assert path["before"].startswith("PACKED_DECODING=False FUSED_UNOBSERVED=False; 0 linear layers packed")
    assert "169 linear layers packed" in path["after"]
    assert rows["machine (CPU, torch threads)"]["after"] == "AMD EPYC (2 torch threads)"
    no_onednn = regime.regime_rows("qwen", _arm(45.0, 40.0, False), {**_arm(30.0, 50.0, True),
                                                                    "packing_available": False}, (1.0, 1.0, 1))
    assert "no packing" in no_onednn[1]["after"]


def test_a_bad_arm_or_a_used_folder_is_refused_before_loading(tmp_path, monkeypatch):
    monkeypatch.setattr("relaylens.model.loading.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(RelaylensError, match=r"arm must be one of before, after; got 'middle'"):
        regime.run_arm("any", "middle", records=1, out=tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    with pytest.raises(RelaylensError, match="already holds files"):
        regime.run_arm("any", "after", records=1, out=tmp_path / "run")
    assert (packed.PACKED_DECODING, attention.FUSED_UNOBSERVED) == (True, True)


def test_the_command_passes_the_model_options_and_dtype_only_when_given(monkeypatch, tmp_path):
    seen = []
    entry = registry.BENCHMARKS["regime"]
    monkeypatch.setitem(registry.BENCHMARKS, "regime", registry.Benchmark(
        lambda **options: seen.append(options) or [{"case": "x"}], options=entry.options))
    for extra in ([], ["--dtype", "bf16"]):
        result = CliRunner().invoke(app, ["bench", "regime", "--model", "qwen2.5-coder-0.5b-instruct", "--records", "2",
                                          "--out", str(tmp_path), *extra])
        assert result.exit_code == 0, result.output
    assert [(o["model_spec"], o["records"], o.get("dtype")) for o in seen] == [
        ("qwen2.5-coder-0.5b-instruct", 2, None), ("qwen2.5-coder-0.5b-instruct", 2, "bfloat16")]
    assert "new_tokens" not in seen[0] and seen[0]["load_kwargs"]["device"] == "cpu"
