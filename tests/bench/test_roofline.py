"""``relaylens bench roofline`` on a tiny random model, tiny sizes: limits, stages, fractions, CPU flags, outputs."""

from __future__ import annotations

import json
import math

import pytest

from relaylens.bench.machine import ModelCost, linear_shapes, parse_cpuinfo
from relaylens.bench.roofline import parse_lengths, run_roofline, table, write_outputs
from relaylens.testing import tiny_model

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme sse2 avx2 avx512f avx512dq avx512_bf16 avx512_vnni
"""
XEON = "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"


def test_cpu_flags_parsed_from_a_cpuinfo_text():
    epyc = parse_cpuinfo(EPYC, threads=2)
    assert epyc.model == "AMD EPYC 9R14 96-Core Processor"
    assert epyc.flags == {"AMX-BF16": False, "AVX512-BF16": True, "AVX512F": True}
    assert epyc.flag_text() == "AVX512-BF16 AVX512F -AMX-BF16"
    assert "no AMX-BF16" in epyc.describe() and "2 torch threads" in epyc.describe()
    assert parse_cpuinfo(XEON, threads=1).flags == {"AMX-BF16": True, "AVX512-BF16": True, "AVX512F": True}
    bare = parse_cpuinfo("", threads=1)  # not Linux: a name from platform, no flags
    assert bare.model and not any(bare.flags.values())


def test_model_cost_counts_the_modules():
    model = tiny_model("llama")  # hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 kv heads, vocab 384
    cost = ModelCost.of(model)
    per_layer = 64 * (4 + 2 * 2) * 16 + 64 * 64 + 3 * 64 * 128
    assert cost.layer_params == 2 * per_layer and cost.head_params == 384 * 64
    assert cost.forward_flops(1, context=0) == 2 * (2 * per_layer + 384 * 64) + 4 * 2 * 4 * 16
    assert cost.kv_bytes(10, batch=3) == 2 * 3 * 2 * 2 * 10 * 16 * 4
    assert linear_shapes(model.config) == {"qkv": (64, 128), "o": (64, 64), "mlp_up": (64, 128),
                                           "mlp_down": (128, 64), "lm_head": (64, 384)}


def test_lengths_option_refuses_what_is_not_token_counts():
    assert parse_lengths("2048, 8192") == (2048, 8192)
    with pytest.raises(ValueError, match="positive token counts.*got '2k'"):
        parse_lengths("2k")


def test_quick_roofline_rows_are_complete_and_fractions_finite(tmp_path):
    rows = run_roofline(model=tiny_model("llama"), quick=True)
    assert all(row["cpu"] and "threads" in row and "flags" in row for row in rows), "every row names the CPU"
    cases = [row["case"] for row in rows]
    for dtype in ("float32", "bfloat16"):
        assert any(r["section"] == "limit" and r["dtype"] == dtype and r["case"].startswith("gemm mix") for r in rows)
    assert any(c.startswith("copy") for c in cases)
    expected = ["prefill 24 tokens", "prefill 40 tokens", "relocation of 32 kept states", "question pass 4 tokens",
                "decode step, batch 1 (relaylens rows)", "decode step, batch 2 (transformers DynamicCache)"]
    assert all(name in cases for name in expected), cases
    stages = [r for r in rows if r["section"] == "stage"]
    for row in stages:
        for key in ("time_ms", "floor_ms", "fraction", "limit_gflop_s", "limit_gb_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["case"], key, row[key])
        assert row["bound"] in ("compute", "memory")
        assert row["fraction"] == pytest.approx(row["floor_ms"] / row["time_ms"])
    decode = [r for r in stages if "relaylens rows" in r["case"]]
    assert len(decode) == 2 and all(math.isfinite(r["vs_plain"]) and r["vs_plain"] > 0 for r in decode)
    md, saved = write_outputs(rows, tmp_path)
    saved = json.loads(saved.read_text())
    assert saved["machine"]["cpu"] == rows[0]["cpu"] and len(saved["rows"]) == len(rows)
    assert rows[0]["cpu"] in md.read_text().splitlines()[0] and rows[0]["cpu"] in table(rows).title


def test_cli_writes_csv_markdown_and_json_naming_the_cpu(tmp_path):
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.testing import tiny_tokenizer

    model_dir, out = tmp_path / "tiny", tmp_path / "bench"
    tiny_model("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    bad = CliRunner().invoke(app, ["bench", "roofline", "--model", str(model_dir), "--lengths", "2k",
                                   "--out", str(out)])
    assert bad.exit_code == 2 and "--lengths" in bad.output
    done = CliRunner().invoke(app, ["bench", "roofline", "--model", str(model_dir), "--quick", "--lengths", "20",
                                    "--out", str(out)])
    assert done.exit_code == 0, done.output
    cpu = json.loads((out / "roofline.json").read_text())["machine"]["cpu"]
    assert cpu in (out / "roofline.md").read_text() and cpu in (out / "roofline.csv").read_text()
    assert "prefill 20 tokens" in (out / "roofline.csv").read_text()
