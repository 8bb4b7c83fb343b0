"""Issue 51 item 4 (Table 3 from the command line) and issue 52 item 17 (every bench option bounded before any work).

``relaylens bench overhead`` takes the paper's protocol (--data, --budgets 2048,8192, --selectors, --steps, --repeats)
and passes it to the benchmark; bad values are refused in one line before a model loads; ``bench roofline`` refuses
lengths past 2**24 or past the model's rotary range before measuring, and reports the decoding floor."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from relaylens.bench import registry, requests, roofline
from relaylens.bench.registry import Benchmark
from relaylens.cli import app
from relaylens.model import loading
from relaylens.testing import tiny_model, tiny_tokenizer


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded before the refusal"))


def test_overhead_takes_the_papers_protocol(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setitem(registry.BENCHMARKS, "overhead", Benchmark(
        lambda **o: seen.append(o) or [{"case": "x"}], options=registry.BENCHMARKS["overhead"].options,
        own_progress=True))
    result = CliRunner().invoke(app, ["bench", "overhead", "--budgets", "2048,8192", "--selectors",
                                      "bm25,snapkv,pyramidkv", "--steps", "128", "--repeats", "3", "--records", "2",
                                      "--data", "sample", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    options = seen[0]
    assert (options["budgets"], options["selectors"], options["new_tokens"], options["repeats"], options["records"],
            options["data"]) == ("2048,8192", "bm25,snapkv,pyramidkv", 128, 3, 2, "sample")


@pytest.mark.parametrize("args, message", [
    (["roofline", "--lengths", "50000000000"], "past 16,777,216 tokens"),
    (["roofline", "--lengths", "0,5"], "positive token counts"),
    (["regime", "--records", "0"], "--records must be between 1"),
    (["overhead", "--records", "-3"], "--records must be between 1"),
    (["overhead", "--new-tokens", "-1"], "between 0 and"),
    (["overhead", "--budgets", "2048,lots"], "--budgets must be"),
    (["overhead", "--budgets", "1.5"], "--budgets must be"),
    (["overhead", "--selectors", "snapkv,nosuch"], "--selectors must name"),
    (["overhead", "--steps", "64", "--new-tokens", "32"], "disagree"),
    (["overhead", "--data", "/nonexistent/records.json"], "--data"),
])
def test_bad_bench_options_are_refused_before_anything_loads(no_model, args, message):
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_parsers():
    assert requests.parse_budgets("2048,8192") == (2048, 8192) and requests.parse_budgets("0.1") == (0.1,)
    assert requests.parse_selectors("bm25,snapkv,pyramidkv") == ("bm25", "snapkv", "pyramidkv")
    with pytest.raises(ValueError):
        requests.parse_budgets("0")


def test_roofline_refuses_lengths_past_the_rotary_range_before_measuring(monkeypatch):
    model = tiny_model("llama", max_position_embeddings=256)
    monkeypatch.setattr(roofline, "measure_limits", lambda *a, **k: pytest.fail("measured before the refusal"))
    with pytest.raises(ValueError, match="past the model's rotary range"):
        roofline.run_roofline(model=model, quick=True, lengths="100,300")


def test_roofline_reports_the_decoding_floor():
    rows = roofline.run_roofline(model=tiny_model("llama"), quick=True)
    floor = [r for r in rows if str(r.get("case", "")).startswith("decoding floor")]
    assert len(floor) == 1 and floor[0]["time_ms"] > 0
    weights = sum(p.numel() * p.element_size() for p in tiny_model("llama").parameters())
    assert floor[0]["time_ms"] == pytest.approx(1e3 * weights / (floor[0]["gb_s"] * 1e9))


def test_overhead_refuses_a_budget_larger_than_the_history(monkeypatch):
    monkeypatch.setattr(requests, "load_bench_model", lambda *a, **k: (tiny_model("llama"), tiny_tokenizer()))
    with pytest.raises(ValueError, match="exceeds record"):
        requests.run_overhead(records=1, budgets="100000", selectors="snapkv", new_tokens=2, repeats=1)


def test_overhead_stratifies_records_by_history_length():
    prompts = requests.stratified_prompts(tiny_tokenizer(), 3, "sample")
    lengths = [p.history_length for p in prompts]
    every = sorted(p.history_length for p in requests.stratified_prompts(tiny_tokenizer(), 10_000, "sample"))
    assert lengths == sorted(lengths) and lengths[0] == every[0] and lengths[-1] == every[-1]
