"""``relaylens figures | report``: figures, tables and the HTML report from a run's result tables only (no model:
:mod:`relaylens.reporting` imports no torch)."""

from __future__ import annotations

from pathlib import Path

import typer

from relaylens.cli.common import console, fail, warned

METRIC_HELP = ("judge, choice, contains, f1, em or judge_NAME, or several comma-separated, e.g. contains,f1 (default: "
               "the paper's metric when the run has it, else contains and f1)")


def figures_command(
    run_dirs: list[Path] = typer.Argument(..., help="run directory (the --out of `relaylens run`); several (one per "
                                          "model x dataset) build the cross-run tables into --out"),
    only: str = typer.Option(None, help="draw only these figures/tables (comma-separated), e.g. figure6,table8"),
    formats: str = typer.Option("png,pdf,svg", "--format", help="comma-separated figure formats: png, pdf, svg"),
    all_supported: bool = typer.Option(False, "--all", help="draw every figure the tables support, not only the "
                                       "analysis's SPEC.figures"),
    metric: str = typer.Option(None, help=METRIC_HELP),
    retained_only: bool = typer.Option(False, "--retained-only", help="probe figures over records whose gold evidence "
                                       "survived the selection only"),
    out: Path = typer.Option(None, help="output directory (default RUN_DIR/figures; required with several runs)"),
) -> None:
    """Draw the run's figures and tables into RUN_DIR/figures/ from its result tables (byte-stable output)."""
    import matplotlib  # noqa: PLC0415 - CLI startup: importing the command line draws nothing

    matplotlib.use("Agg")
    from relaylens.reporting.figures import write_figures  # noqa: PLC0415 - CLI startup

    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    if not fmts:
        fail(f"--format {formats!r} names no figure format. Fix: pass one or more of png, pdf, svg (e.g. --format png)")
    paths = warned(write_figures, run_dirs[0] if len(run_dirs) == 1 else run_dirs, only=only, formats=fmts,
                   all_supported=all_supported, progress=lambda name: console.print(f"drawing {name} ..."),
                   metric=metric, retained_only=retained_only, out=out)
    for path in paths:
        print(path)
    console.print(f"[green]wrote[/] {len(paths)} files to {out or Path(run_dirs[0]) / 'figures'}")


def report_command(
    run_dirs: list[Path] = typer.Argument(..., help="run directory (the --out of `relaylens run`); several (one per "
                                          "model x dataset) make one cross-run report into --out"),
    out: Path = typer.Option(None, help="output HTML file (default RUN_DIR/report.html; required with several runs)"),
    metric: str = typer.Option(None, help=METRIC_HELP),
    retained_only: bool = typer.Option(False, "--retained-only", help="probe sections over records whose gold "
                                       "evidence survived the selection only"),
    view_records: int = typer.Option(3, "--view-records", min=0, help="token view: show the first N records the run "
                                     "stored views for (0: no token view)"),
) -> None:
    """Render the self-contained per-layer HTML report of a run, or the cross-run report of several (offline;
    figures and data inline)."""
    import matplotlib  # noqa: PLC0415 - CLI startup

    matplotlib.use("Agg")
    from relaylens.reporting.report import write_report  # noqa: PLC0415 - CLI startup

    with console.status("rendering report ..."):
        path = warned(write_report, run_dirs[0] if len(run_dirs) == 1 else run_dirs, out, view_records, metric=metric,
                      retained_only=retained_only)
    print(path)
    console.print(f"[green]wrote[/] {path}")
