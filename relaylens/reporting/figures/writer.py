"""Drawing a run directory: its tables with what they lack against the run's plan, the entries of the registry
(:mod:`relaylens.reporting.figures.registry`) written as files, and what could not be drawn, said.

:func:`load_run_tables` reads one run (or a grid of several) and warns when the run holds fewer units than its
manifest plans or a judge pass is not shown; :func:`write_figures` draws the chosen entries into ``RUN_DIR/figures/``
(or ``--out``), warns about each entry of ``SPEC.figures`` it cannot draw, and records them in ``index.json``.

Example:
    >>> status_rows({"run_status": {"planned": (6, 6), "hidden": {}}})
    [('units', '6 of 6 planned units')]
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from relaylens.reporting import plots
from relaylens.reporting.crossrun import METRIC_NAMES, load_runs
from relaylens.reporting.figures.registry import (
    REGISTRY,
    FigureError,
    build,
    cross_run_entries,
    figure_plan,
    footer_lines,
    prepare_tables,
)
from relaylens.reporting.summaries import table_cells, table_markdown
from relaylens.results.atomic import safe_subdir, write_atomic
from relaylens.results.locks import output_lock
from relaylens.results.passes import pass_metrics, read_passes
from relaylens.results.shards import plan_progress
from relaylens.results.store import RunStore, load_run
from relaylens.results.tables import get_table

__all__ = ["load_run_tables", "skipped_tables", "status_rows", "warn_not_drawn", "write_entry", "write_figures"]


def status_rows(tables: dict) -> list[tuple[str, str]]:
    """Report rows on what the run lacks: its skipped records, the units it holds of those its plan lists, and the
    judge passes whose scores are not shown (``tables["run_status"]``, from :func:`load_run_tables`)."""
    rows = [("skipped", f"{rid}: {g['reason'].iloc[0]} ({len(g)} unit(s)) - {g['detail'].iloc[0]}")
            for rid, g in get_table(tables, "skipped").groupby("record_id", sort=True)]
    status = tables.get("run_status") or {}
    if status.get("planned"):
        done, planned = status["planned"]
        rows.append(("units", f"{done} of {planned} planned units" + ("" if done == planned else
                     " (incomplete: the tables hold only these; resume the run, or finish the shards and merge)")))
    for run in status.get("runs", []):  # a cross-run grid: each run's own count
        done, planned = run["planned"]
        rows.append(("units", f"{run['label']}: {done} of {planned} planned units" + ("" if done == planned else
                     " (incomplete: the tables hold only these; resume that run, or finish its shards and merge)")))
    return rows + [("judge not shown", line) for line in status.get("hidden", {}).values()]


def _progress(run_dir, store, stacklevel: int) -> tuple[int, int] | None:
    """``(committed, planned)`` units of one run (None without a plan), warned about when incomplete."""
    units = [p.name.removesuffix(".json.gz") for p in store.unit_paths()]
    planned = plan_progress(store.manifest, units) if units else None
    if planned and planned[0] < planned[1]:
        warnings.warn(f"{run_dir} holds {planned[0]} of the {planned[1]} units its manifest plans: the tables "
                      "describe only those. Fix: resume the run (the same command), or finish the missing shards "
                      "and merge again", stacklevel=stacklevel + 1)
    return planned


def skipped_tables(tables: dict) -> list[dict]:
    """The report's table of skipped units (``name``, ``title``, ``head``, ``rows``), when the run has any."""
    skipped = get_table(tables, "skipped")
    if not len(skipped):
        return []
    head, rows = table_cells(skipped)
    return [{"name": "skipped", "title": f"Skipped units ({len(skipped)}): not run, and why", "head": head,
             "rows": rows}]


def warn_not_drawn(not_drawn: dict[str, str]) -> None:
    """One warning per entry of ``SPEC.figures`` not drawn, saying why and how to get it."""
    for name, why in not_drawn.items():
        warnings.warn(f"{name} not drawn: {why}", stacklevel=3)


def _warn_all_skipped(tables: dict) -> None:
    units = get_table(tables, "skipped")
    if len(units) and not len(get_table(tables, "answers")) and not len(get_table(tables, "scores")):
        reasons = ", ".join(f"{r}: {n}" for r, n in units["reason"].value_counts().sort_index().items())
        warnings.warn(f"every committed unit of the run was skipped ({len(units)} units; {reasons}): there is "
                      "nothing to draw. Fix: read the skipped table of `relaylens report RUN_DIR`, remove the cause, "
                      "then re-run the same command with --retry-skipped", stacklevel=3)


def _check_pass_metric(metric: str | None, run_dir, hidden: dict[str, str]) -> None:
    """Refuse a ``--metric`` whose judge pass is not shown (failed, interrupted, partial) with what is true of that
    pass and its fix (:func:`relaylens.results.passes.hidden_passes`), not as a metric the run lacks."""
    if not metric or not hidden:
        return
    owners = pass_metrics(read_passes(run_dir))
    for name in (n.strip() for n in str(metric).split(",") if n.strip()):
        owner = owners.get(METRIC_NAMES.get(name, name))
        if owner in hidden:
            raise FigureError(f"--metric {name}: {hidden[owner]}")


def load_run_tables(run_dirs: Sequence[str | Path], metric: str | None = None,
                    retained_only: bool = False) -> tuple[dict, dict]:
    """``(tables, manifest)`` ready to draw (:func:`~relaylens.reporting.figures.registry.prepare_tables`): one
    run's tables and manifest, or several runs (one per model x dataset) as one grid
    (:func:`relaylens.reporting.crossrun.load_runs`) with the manifest ``{"analysis": "cross-run", "runs": [{"model",
    "dataset", "run_dir"}, ...]}``.

    One run's tables carry ``run_status``: ``planned`` (``(committed, planned)`` units of the manifest's plan, when it
    records one) and ``hidden`` (``{judge pass: why its scores are not shown}``); both are also warned. A grid's carry
    ``run_status["runs"]``: per run with a plan, its ``label`` (model x dataset) and ``planned`` count, warned about
    and stated in footers and the report just as for one run."""
    if len(run_dirs) == 1:
        store = RunStore.open(run_dirs[0])
        tables, hidden = load_run(run_dirs[0])
        planned = _progress(run_dirs[0], store, stacklevel=3)
        for line in hidden.values():
            warnings.warn(line, stacklevel=3)
        _check_pass_metric(metric, run_dirs[0], hidden)
        tables = prepare_tables(tables, metric, retained_only)
        return {**tables, "run_status": {"planned": planned, "hidden": hidden}}, store.manifest
    grid, labels = load_runs(run_dirs)
    runs = []  # each run's own "K of N planned units", as it gets alone (issue 41, item 10)
    for label in labels:
        planned = _progress(label["run_dir"], RunStore.open(label["run_dir"]), stacklevel=3)
        if planned:
            runs.append({"label": f"{label['model']} x {label['dataset']}", "planned": planned})
    tables = prepare_tables(grid, metric, retained_only)
    return {**tables, "run_status": {"runs": runs}}, {"analysis": "cross-run", "runs": labels}


def write_entry(name: str, tables: dict, out_dir: str | Path, formats: Sequence[str] = plots.FORMATS) -> list[Path]:
    """Build one entry and write it: figures as ``name.<fmt>``, tables as ``name.csv`` and ``name.md``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = build(name, tables)
    if isinstance(result, pd.DataFrame):
        csv, md = out_dir / f"{name}.csv", out_dir / f"{name}.md"
        write_atomic(csv, result.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
        notes = [result.attrs["note"]] if result.attrs.get("note") else []
        notes += footer_lines(tables)
        write_atomic(md, f"**{REGISTRY[name].title}**\n\n" + table_markdown(result)
                     + "".join(f"\n{line}\n" for line in notes))
        return [csv, md]
    return plots.save_figure(result, out_dir / name, formats)


def _output_dir(out_dir: Path, run_dirs: Sequence[Path], create: bool = True) -> Path:
    """``out_dir``, made when missing; inside a run directory (``RUN_DIR/figures``, the default) every folder below
    that run directory must be a real folder (:func:`relaylens.fileio.safe_subdir`: a symbolic link there is refused,
    so no figure is written, and no same-named file replaced, through it). Compared by path, not by resolving links."""
    where = Path(os.path.abspath(out_dir))
    for run_dir in run_dirs:
        try:
            below = where.relative_to(os.path.abspath(run_dir))
        except ValueError:
            continue
        return safe_subdir(run_dir, *below.parts, create=create) if below.parts else Path(run_dir)
    if create:
        out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def write_figures(run_dir: str | Path, only: str | Sequence[str] | None = None,
                  formats: Sequence[str] = plots.FORMATS, all_supported: bool = False,
                  progress: Callable[[str], None] | None = None, metric: str | None = None,
                  retained_only: bool = False, out: str | Path | None = None) -> list[Path]:
    """Draw the run's figures/tables into ``RUN_DIR/figures/`` (or ``out``; chosen by
    :func:`~relaylens.reporting.figures.registry.figure_plan`, each entry of ``SPEC.figures`` it cannot draw warned
    about and listed under ``not_drawn`` in ``index.json``); returns the files.

    ``metric`` is a ``--metric`` name (default: the paper's metric when the run has it); ``retained_only`` restricts
    probe figures to records whose gold evidence survived
    (:func:`~relaylens.reporting.figures.registry.prepare_tables`). Several run directories (one per model x dataset)
    build the cross-run tables (:data:`~relaylens.reporting.figures.registry.CROSS_RUN`) into ``out``. Only the written
    directory is locked."""
    for fmt in formats:
        if fmt not in plots.FORMATS:
            raise FigureError(f"unknown figure format {fmt!r}; choose from {', '.join(plots.FORMATS)}")
    run_dirs = [Path(run_dir)] if isinstance(run_dir, (str, Path)) else [Path(d) for d in run_dir]
    if len(run_dirs) > 1 and out is None:
        raise FigureError("several run directories make cross-run tables; pass --out DIR for them")
    tables, manifest = load_run_tables(run_dirs, metric, retained_only)
    out_dir = Path(out) if out else run_dirs[0] / "figures"
    if len(run_dirs) == 1:
        chosen, not_drawn = figure_plan(tables, manifest, only, all_supported)
    else:
        chosen, not_drawn = figure_plan(tables, manifest, only or cross_run_entries(tables))
    warn_not_drawn(not_drawn)
    _warn_all_skipped(tables)
    paths = []
    _output_dir(out_dir, run_dirs, create=False)  # a linked figures/ is refused before its target is even locked
    with output_lock(out_dir, run_dirs, "figures"):  # one writer per written directory
        out_dir = _output_dir(out_dir, run_dirs)
        for name in chosen:
            if progress:
                progress(name)
            paths += write_entry(name, tables, out_dir, formats)
        index = {"analysis": manifest.get("analysis"), "entries": chosen,
                 "files": [p.name for p in paths], **({"not_drawn": not_drawn} if not_drawn else {})}
        write_atomic(out_dir / "index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
    return paths
