"""``relaylens bench`` (relaylens.cli.benchmarks) reads what each benchmark takes from its registry entry: a planted
benchmark gets exactly the options it declares, and its own outputs, with no name of it in the command line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from relaylens.bench import registry
from relaylens.bench.registry import BENCHMARKS, MODEL_OPTIONS, Benchmark
from relaylens.cli import app


def test_every_entry_is_a_benchmark_and_the_model_ones_take_the_model_options():
    assert all(isinstance(b, Benchmark) for b in BENCHMARKS.values())
    assert {n for n, b in BENCHMARKS.items() if not set(MODEL_OPTIONS) <= set(b.options)} == {"geometry", "selectors"}
    assert [n for n, b in BENCHMARKS.items() if b.own_progress] == ["overhead"]
    assert [n for n, b in BENCHMARKS.items() if b.write or b.view] == ["roofline"]


def test_a_planted_benchmark_gets_only_its_options(monkeypatch, tmp_path):
    seen = []

    def run_toy(**options):
        seen.append(options)
        return [{"case": "toy", "seconds": 1.0}]

    def write(rows, out: Path):
        (out / "toy.json").write_text("[]")
        return (out / "toy.json",)

    toy = Benchmark(run_toy, options=("quick", "records"), own_progress=True, write=write, view=lambda rows: "TOY VIEW")
    monkeypatch.setitem(registry.BENCHMARKS, "toy", toy)
    result = CliRunner().invoke(app, ["bench", "toy", "--quick", "--records", "2", "--schedule", "back-to-back",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen == [{"quick": True, "records": 2}], "schedule and the model options are not the toy's"
    assert (tmp_path / "toy.csv").exists() and (tmp_path / "toy.json").exists() and "TOY VIEW" in result.output
    CliRunner().invoke(app, ["bench", "toy", "--repeats", "2", "--out", str(tmp_path)])
    assert seen[-1] == {"quick": False, "repeats": 2}
