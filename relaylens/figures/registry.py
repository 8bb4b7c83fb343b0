"""The figure registry: every paper figure and table as ``build(tables) -> Figure | DataFrame``, what each needs,
which ones a run draws, and writing them into a run directory.

One file per figure, named after the analysis it draws (``figures/ordering.py`` draws what ``analyses/ordering.py``
runs); each registers its entries with :func:`register`. A new figure is one new file plus one import line in
``relaylens/figures/__init__.py``.

Example:
    >>> from relaylens.tables import example_tables
    >>> t = example_tables(records=2, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    >>> needs_budgets(t), needs_probes(t) is None
    ('a single budget (no curve to draw)', True)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
from matplotlib.figure import Figure

from relaylens.atomic import write_atomic
from relaylens import plots
from relaylens.errors import RelaylensError
from relaylens.summaries import REFERENCE, accuracy_scores, table_markdown
from relaylens.tables import get_table

__all__ = ["REGISTRY", "ORDER", "COMPANIONS", "FigureEntry", "FigureError", "register", "names", "supported",
           "build", "check_not_empty", "select_figures", "write_entry", "write_figures", "needs_scores",
           "needs_answers", "needs_other_conditions", "needs_budgets", "needs_ordering", "needs_rank_sync",
           "needs_probes"]

ORDER = ("table1", "table2", "table6", "table7", "table8", "table3", "figure3", "figure4", "figure5", "figure6",
         "figure6_attribution", "alignment")
"""The order in which entries are drawn and listed (entries not named here follow, in registration order)."""
COMPANIONS = {"figure6": ("table8", "figure6_attribution")}
"""Entries drawn together with a figure named in ``SPEC.figures`` (Figure 6's numbers are Table 8; its attribution
companion is drawn when the probes table has attribution readouts)."""


class FigureError(RelaylensError):
    """A figure that the run's tables cannot support, or tables that are empty."""


@dataclass(frozen=True)
class FigureEntry:
    """One registered figure or table: ``build(tables)`` and ``needs(tables)`` (why it cannot be built, or None)."""

    name: str
    kind: str  # "figure" | "table"
    title: str
    build: Callable[[dict], Figure | pd.DataFrame]
    needs: Callable[[dict], str | None]


REGISTRY: dict[str, FigureEntry] = {}


def register(name: str, kind: str, title: str, needs: Callable[[dict], str | None]):
    """Decorator: register ``fn(tables)`` as the figure or table ``name``."""
    def wrap(fn):
        REGISTRY[name] = FigureEntry(name, kind, title, fn, needs)
        return fn
    return wrap


def names() -> list[str]:
    """Registered entry names in drawing order (:data:`ORDER`, then registration order)."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(REGISTRY, key=lambda n: rank.get(n, len(ORDER)))  # stable: unlisted keep registration order


# ------------------------------------------------------------------------------------------------ requirements

def needs_scores(tables: dict) -> str | None:
    """Why accuracy figures cannot be drawn (no contains/f1 rows), or None."""
    return None if len(accuracy_scores(tables)) else "no contains/f1 rows in the scores table"


def needs_answers(tables: dict) -> str | None:
    return None if len(get_table(tables, "answers")) else "the answers table is empty"


def needs_other_conditions(tables: dict) -> str | None:
    reason = needs_scores(tables)
    if reason:
        return reason
    conds = set(accuracy_scores(tables)["condition"])
    return None if len(conds - {REFERENCE}) else "only one condition in the scores table"


def needs_budgets(tables: dict) -> str | None:
    reason = needs_scores(tables)
    return reason or (None if accuracy_scores(tables)["budget"].nunique() > 1 else "a single budget (no curve to draw)")


def needs_ordering(tables: dict) -> str | None:
    reason = needs_scores(tables)
    conds = set(accuracy_scores(tables)["condition"])
    if reason:
        return reason
    ordered = {c for c in conds if re.match(r"(score_order|reverse_order|random_order\(.*\))$", c)}
    return None if ordered else "no score_order / reverse_order / random_order(seed) conditions"


def needs_rank_sync(tables: dict) -> str | None:
    reason = needs_scores(tables)
    return reason or (None if "rank_sync" in set(accuracy_scores(tables)["condition"]) else "no rank_sync condition")


def needs_probes(tables: dict) -> str | None:
    """Why probe figures cannot be drawn (no probes, or no evidence readouts), or None."""
    probes = get_table(tables, "probes")
    if not len(probes):
        return "the run has no probes (analysis without probes=True)"
    have = set(probes["metric"])
    return None if have & {"evidence_share", "replay_gold_share"} else "no evidence readouts in the probes table"


def supported(tables: dict, name: str) -> str | None:
    """Why ``name`` cannot be built from ``tables`` (None: it can)."""
    if name not in REGISTRY:
        raise FigureError(f"unknown figure {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name].needs(tables)


def check_not_empty(tables: dict) -> None:
    """Raise :class:`FigureError` when every result table is empty."""
    if not any(len(get_table(tables, n)) for n in ("answers", "scores", "probes")):
        raise FigureError("the run's result tables are empty (no committed units). Fix: run or resume the analysis "
                          "(`relaylens run ANALYSIS --out RUN_DIR`) before drawing figures")


def build(name: str, tables: dict) -> Figure | pd.DataFrame:
    """Build the registered figure/table ``name`` from ``tables``; raises :class:`FigureError` if unsupported."""
    check_not_empty(tables)
    reason = supported(tables, name)
    if reason:
        raise FigureError(f"cannot build {name}: {reason}")
    with plots.style():
        return REGISTRY[name].build(tables)


# ------------------------------------------------------------------------------------------------ run drawing

def _spec_figures(manifest: dict) -> list[str] | None:
    spec = (manifest.get("config") or {}).get("spec") or {}
    listed = spec.get("figures")
    return list(listed) if listed else None


def select_figures(tables: dict, manifest: dict | None = None, only: str | Sequence[str] | None = None,
                   all_supported: bool = False) -> list[str]:
    """The entries to draw: ``only`` (a name, comma-separated names or a list); else the analysis's ``SPEC.figures`` (from the manifest) with companions;
    else (or with ``all_supported``) every entry the tables support."""
    check_not_empty(tables)
    if only:
        chosen = [n.strip() for n in only.split(",") if n.strip()] if isinstance(only, str) else list(only)
        for name in chosen:
            reason = supported(tables, name)
            if reason:
                raise FigureError(f"cannot build {name}: {reason}")
        return chosen
    spec = None if all_supported else _spec_figures(manifest or {})
    if spec:
        chosen = []
        for name in spec:
            chosen += [name] + list(COMPANIONS.get(name, ()))
        chosen = [n for n in dict.fromkeys(chosen) if n in REGISTRY and supported(tables, n) is None]
        if chosen:
            return chosen
    return [n for n in names() if supported(tables, n) is None]


def write_entry(name: str, tables: dict, out_dir: str | Path, formats: Sequence[str] = plots.FORMATS) -> list[Path]:
    """Build one entry and write it: figures as ``name.<fmt>``, tables as ``name.csv`` and ``name.md``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = build(name, tables)
    if isinstance(result, pd.DataFrame):
        csv, md = out_dir / f"{name}.csv", out_dir / f"{name}.md"
        write_atomic(csv, result.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
        write_atomic(md, f"**{REGISTRY[name].title}**\n\n" + table_markdown(result))
        return [csv, md]
    return plots.save_figure(result, out_dir / name, formats)


def write_figures(run_dir: str | Path, only: str | Sequence[str] | None = None,
                  formats: Sequence[str] = plots.FORMATS, all_supported: bool = False,
                  progress: Callable[[str], None] | None = None) -> list[Path]:
    """Draw the run's figures/tables into ``RUN_DIR/figures/`` (see :func:`select_figures`); returns the files."""
    from relaylens.results import RunStore, load_tables

    for fmt in formats:
        if fmt not in plots.FORMATS:
            raise FigureError(f"unknown figure format {fmt!r}; choose from {', '.join(plots.FORMATS)}")
    from relaylens.locks import run_lock

    run_dir = Path(run_dir)
    manifest = RunStore.open(run_dir).manifest
    with run_lock(run_dir, "figures"):  # one writer per run directory; every file written atomically
        return _write_figures(run_dir, manifest, load_tables(run_dir), only, formats, all_supported, progress)


def _write_figures(run_dir: Path, manifest: dict, tables: dict, only, formats, all_supported, progress) -> list[Path]:
    chosen = select_figures(tables, manifest, only, all_supported)
    paths = []
    for name in chosen:
        if progress:
            progress(name)
        paths += write_entry(name, tables, run_dir / "figures", formats)
    index = {"analysis": manifest.get("analysis"), "entries": chosen,
             "files": [p.name for p in paths]}
    write_atomic(run_dir / "figures" / "index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
    return paths
