"""``relaylens run | sweep | merge``: run an analysis (through its own runner where its record names one, else the
sweep runner), or as Ray shards; merge shard directories."""

from __future__ import annotations

from pathlib import Path

import typer

from relaylens.cli.common import console, fail, guard, print_summary, safe, warned
from relaylens.cli.options import analysis_options, flag_values, spec_and_config, with_run_options


@with_run_options
def run(ctx: typer.Context,
        analysis: str = typer.Argument(..., help="analysis name (relaylens/analyses/NAME.py), e.g. "
                                       "coordinate_ablation"),
        **options) -> None:
    """Run (or resume) an analysis; every condition of a record shares one prefill and one selection."""
    from relaylens.experiments.runner import run_analysis  # noqa: PLC0415 - CLI startup: the runner imports torch and transformers
    from relaylens.experiments.specs import load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis); CLI startup

    spec, config = spec_and_config({"analysis": analysis, **options})
    record = guard(load_analysis, analysis)
    own = analysis_options(record, flag_values(ctx))
    if record.run is not None:
        run_dir = guard(record.run, spec, config, own)
    else:
        run_dir = guard(run_analysis, spec, config)
    print_summary(run_dir)
    console.print(f"[green]run directory[/] {run_dir}")
    fail_if_empty(run_dir)
    shard = options["shard"]
    if shard and shard.strip().lower() == "auto":  # rank 0 does not merge on its own: the others may still run
        console.print(f"this is shard {run_dir.name} of one run; when every shard has finished: "
                      f"relaylens merge {run_dir.parent.parent}")


@with_run_options
def sweep(
    ctx: typer.Context,
    analysis: str = typer.Argument(..., help="analysis name, e.g. coordinate_ablation"),
    shards: int = typer.Option(..., "--shards", help="number of record shards, one Ray task each",
                               rich_help_panel="Ray"),
    gpus_per_shard: float = typer.Option(0, "--gpus-per-shard", help="GPUs each shard reserves", rich_help_panel="Ray"),
    cpus_per_shard: float = typer.Option(1, "--cpus-per-shard", help="CPUs each shard reserves (its torch threads)",
                                         rich_help_panel="Ray"),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster to join (auto, ray://HEAD:10001); "
                                    "default: start a local Ray instance", rich_help_panel="Ray"),
    max_retries: int = typer.Option(3, "--max-retries", help="restarts of a shard whose worker died (each resumes)",
                                    rich_help_panel="Ray"),
    ray_dashboard: bool = typer.Option(False, "--ray-dashboard", help="start Ray's dashboard with a local instance "
                                       "(on 127.0.0.1; a local instance listens on loopback only)",
                                       rich_help_panel="Ray"),
    report: bool = typer.Option(True, help="draw the figures and write the HTML report after the merge",
                                rich_help_panel="Ray"),
    **options,
) -> None:
    """Run an analysis as N shards on Ray (local or a cluster), merge them, then draw figures and the report.

    Takes every option of `relaylens run`. RUN_DIR (--out) must be on storage every Ray worker sees; each shard writes
    RUN_DIR/shards/I-of-N. Needs the ray extra: pip install 'relaylens[ray]'."""
    from relaylens.experiments.specs import load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis); CLI startup
    from relaylens.experiments.sweep import SweepOptions, run_sweep  # noqa: PLC0415 - CLI startup

    record = guard(load_analysis, analysis)
    if record.run is not None:
        fail(f"{analysis} trains one model-wide result on all its records and does not run in shards. Fix: relaylens "
             f"run {analysis}")
    analysis_options(record, flag_values(ctx))  # refuses the flags of other analyses
    spec, config = spec_and_config({"analysis": analysis, **options})
    sweep_options = guard(SweepOptions, shards=shards, gpus_per_shard=gpus_per_shard, cpus_per_shard=cpus_per_shard,
                          ray_address=ray_address, max_retries=max_retries, dashboard=ray_dashboard)
    run_dir = warned(run_sweep, spec, config, sweep_options, console=console, report=report)
    print_summary(run_dir)
    console.print(f"[green]run directory[/] {run_dir} (merged from {shards} shards"
                  f"{'; figures and report.html written' if report else ''})")
    fail_if_empty(run_dir)


def merge(
    shards: list[Path] = typer.Argument(..., help="shard run directories, or one run directory whose shards/ "
                                        "(from --shard auto or sweep) are merged into it"),
    out: Path = typer.Option(None, help="merged run directory (needed when merging shard directories)"),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="merge even when shards or units "
                                          "are missing (warned, and recorded in the manifest)"),
) -> None:
    """Combine shard run directories into one (manifests must agree; keys must not conflict; complete unless
    --allow-incomplete). With one RUN_DIR and no --out: merge RUN_DIR/shards/I-of-N into RUN_DIR."""
    from relaylens.results.shards import merge_run_dir, merge_runs  # noqa: PLC0415 - CLI startup

    if out is None and len(shards) != 1:
        fail("relaylens merge: pass --out DIR to merge several shard directories, or one run directory whose "
             "shards/ subdirectory holds the shards (relaylens merge RUN_DIR)")
    if out is None:
        merged = warned(merge_run_dir, shards[0], allow_incomplete=allow_incomplete)
    else:
        warned(merge_runs, [str(s) for s in shards], str(out), allow_incomplete=allow_incomplete)
    if out is None:
        console.print(f"[green]merged[/] {len(merged)} shards into {shards[0]}")
        return
    console.print(f"[green]merged[/] {len(shards)} shards into {out}")


def fail_if_empty(run_dir: Path) -> None:
    """Exit 1 with one ``error:`` line when the finished run produced no answer (every unit skipped, or none to
    run): the cause, the skip reasons counted, and the fix (:func:`relaylens.experiments.summary.empty_run_problem`).
    A run with some answers passes; its skips were listed by the summary."""
    from relaylens.experiments.summary import run_problem  # noqa: PLC0415 - CLI startup: summaries read pandas tables

    problem = guard(run_problem, run_dir)
    if problem:
        console.print(f"[bold red]error:[/] {safe(problem)}")
        raise typer.Exit(1)
