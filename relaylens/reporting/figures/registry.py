"""The figure registry: every paper figure and table as ``build(tables) -> Figure | DataFrame``, what each needs,
and which ones a run draws (writing them into a run directory: :mod:`relaylens.reporting.figures.writer`).

One file per figure, named after the analysis it draws (``relaylens/reporting/figures/ordering.py`` draws what
``relaylens/analyses/ordering.py`` runs); each registers its entries with :func:`register`. A new figure is one new
file plus one import line in ``relaylens/reporting/figures/__init__.py``.

Example:
    >>> from relaylens.results.tables import example_tables
    >>> t = example_tables(records=2, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    >>> needs_budgets(t), needs_probes(t) is None
    ('a single budget (no curve to draw)', True)
"""

from __future__ import annotations

import re
import textwrap
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
from matplotlib.figure import Figure

from relaylens.errors import RelaylensError
from relaylens.registry import Registry
from relaylens.reporting import plots
from relaylens.reporting.crossrun import choose_metrics
from relaylens.reporting.retention import restrict_to_retained, retention_lines
from relaylens.reporting.summaries import REFERENCE, accuracy_scores
from relaylens.results.tables import get_table

__all__ = ["REGISTRY", "ENTRY_POINT_GROUP", "check_entry", "ORDER", "COMPANIONS", "FigureEntry", "FigureError",
           "register", "names", "supported", "build", "check_not_empty", "select_figures", "figure_plan",
           "footer_lines", "prepare_tables", "cross_run_entries", "needs_scores", "needs_answers",
           "needs_other_conditions", "needs_budgets", "needs_ordering", "needs_rank_sync", "needs_probes"]

ORDER = ("table1", "table2", "table6", "table7", "table8", "table10", "table11", "cross_judge", "layer_bands",
         "evidence_bands", "table3", "figure3", "figure4",
         "figure5", "figure6", "figure6_attribution", "alignment")
"""The order in which entries are drawn and listed (entries not named here follow, in registration order)."""
CROSS_RUN = ("table1", "table8", "relay_gain", "cross_judge", "history_length", "history_length_table")
"""Entries built across several run directories (one per model x dataset)."""
COMPANIONS = {"figure6": ("layer_bands", "evidence_bands", "figure6_attribution"),
              "table1": ("table8", "relay_gain", "cross_judge", "answering", "judge_agreement", "longmemeval_metrics"),
              "figure3": ("table8", "answering"),
              "figure4": ("answering", "table6", "judge_agreement", "longmemeval_metrics"),
              "figure5": ("ordering_table",), "table6": ("longmemeval_metrics",)}
"""Entries drawn together with an entry named in ``SPEC.figures`` (Figure 6's numbers are the layer-band table, its
per-record paired intervals the evidence-band table, and its attribution companion is drawn when the probes table has
attribution readouts; Table 1's paired differences per
setting are Table 8, drawn as ``relay_gain``; a second judge adds the cross-judge table; any judge adds its agreement
with ``contains``; Figure 3's paired differences per selector and budget are Table 8, with the answering table beside
them; Figure 5's numbers are the ordering table; Figure 4's runs also give Table 6, accuracy per question type;
LongMemEval's own judge adds its metrics table to Tables 1 and 6 and
Figure 4)."""


FOOTER_WIDTH = 160
"""Characters per line of a figure's footer (longer lines, such as the per-selector retention line, wrap)."""


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


ENTRY_POINT_GROUP = "relaylens.figures"
"""The entry-point group of figure plugins: ``[project.entry-points."relaylens.figures"] NAME = "pkg.mod:ENTRY"`` in
a distribution's ``pyproject.toml`` makes that :class:`FigureEntry` (named ``NAME``) a figure or table of every run."""


def check_entry(name: str, entry) -> None:
    """Refuse what cannot be the figure or table ``name``: no :class:`FigureEntry`, one named otherwise, or a kind
    other than ``figure`` / ``table``."""
    if not isinstance(entry, FigureEntry) or entry.name != name or entry.kind not in ("figure", "table"):
        raise FigureError(f"figure {name!r} is {entry!r}, not a FigureEntry named {name!r} of kind 'figure' or "
                          f"'table'. Fix: point it at FigureEntry({name!r}, 'figure', title, build, needs) "
                          "(relaylens.reporting.figures.registry)")


REGISTRY: Registry[FigureEntry] = Registry("figure", entry_point_group=ENTRY_POINT_GROUP, check=check_entry)
"""Every figure and table by name (:func:`register`; a :class:`~relaylens.registry.Registry`), then those of installed
plugins (entry-point group :data:`ENTRY_POINT_GROUP`)."""


def register(name: str, kind: str, title: str, needs: Callable[[dict], str | None]):
    """Decorator: register ``fn(tables)`` as the figure or table ``name`` (a name registered twice is refused)."""
    def wrap(fn):
        REGISTRY.register(name, FigureEntry(name, kind, title, fn, needs), owner=f"{fn.__module__}.{fn.__qualname__}")
        return fn
    return wrap


def names() -> list[str]:
    """Registered entry names in drawing order (:data:`ORDER`, then registration order)."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(REGISTRY, key=lambda n: rank.get(n, len(ORDER)))  # stable: unlisted keep registration order


# ------------------------------------------------------------------------------------------------ requirements

def needs_scores(tables: dict) -> str | None:
    """Why accuracy figures cannot be drawn (no rows of the reported metrics), or None."""
    chosen = "/".join(tables.get("metrics") or ("contains", "f1"))
    return None if len(accuracy_scores(tables)) else f"no {chosen} rows in the scores table"


def needs_relay_pairs(tables: dict) -> str | None:
    """Why Table 8 cannot be built (no original/relay pairs), or None."""
    reason = needs_scores(tables)
    conds = set(accuracy_scores(tables)["condition"])
    return reason or (None if {"original", "relay"} <= conds else "no original and relay conditions to pair")


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
    """Raise :class:`FigureError` when every result table is empty (a run whose units were all skipped is not
    empty: its ``skipped`` table says why)."""
    if not any(len(get_table(tables, n)) for n in ("answers", "scores", "probes", "skipped")):
        raise FigureError("the run's result tables are empty (no committed units). Fix: run or resume the analysis "
                          "(`relaylens run ANALYSIS --out RUN_DIR`) before drawing figures")


def build(name: str, tables: dict) -> Figure | pd.DataFrame:
    """Build the registered figure/table ``name`` from ``tables``; raises :class:`FigureError` if unsupported."""
    check_not_empty(tables)
    reason = supported(tables, name)
    if reason:
        raise FigureError(f"cannot build {name}: {reason}")
    with plots.style():
        result = REGISTRY[name].build(tables)
        # many selectors (a kvpress sweep) make long lines: wrapped, so the footer stays as wide as the figure
        footer = [part for line in footer_lines(tables)
                  for part in textwrap.wrap(line, FOOTER_WIDTH, break_long_words=False)]
        if isinstance(result, Figure) and footer:
            label = getattr(result, "_supxlabel", None)  # the figure's footnote, extended with the run's caveats
            if label is not None:
                label.set_text("\n".join([label.get_text(), *footer]))
            else:
                result.supxlabel("\n".join(footer), fontsize=7, color="#555555")
        return result


def footer_lines(tables: dict) -> list[str]:
    """What every figure footer and table note states: the metric note (when the run lacks the paper's metric)
    and "gold evidence retained in X of N records" per selector and budget."""
    lines = [tables["metric_note"]] if tables.get("metric_note") else []
    status = tables.get("run_status") or {}
    progress = status.get("planned")
    if progress and progress[0] < progress[1]:
        lines.append(f"incomplete run: {progress[0]} of {progress[1]} planned units")
    for run in status.get("runs", []):  # a cross-run grid: every incomplete run, named
        done, planned = run["planned"]
        if done < planned:
            lines.append(f"incomplete run {run['label']}: {done} of {planned} planned units")
    answers = get_table(tables, "answers")
    if len(answers):
        retained = retention_lines(answers)
        if retained:
            lines.append("; ".join(retained))
    return lines


def prepare_tables(tables: dict, metric: str | None = None, retained_only: bool = False) -> dict:
    """``tables`` with the metric choice (``tables["metrics"]``, ``tables["metric_note"]``; see
    :func:`relaylens.reporting.crossrun.choose_metrics`) and, with ``retained_only``, probes restricted to the units
    whose gold evidence survived the selection (the answers keep every unit, so footers still count all of them)."""
    metrics, note = choose_metrics(get_table(tables, "scores"), metric)
    out = dict(tables, metrics=metrics, metric_note=note)
    if retained_only and len(get_table(tables, "probes")):
        out["probes"] = restrict_to_retained(tables["probes"], get_table(tables, "answers"))
        out["metric_note"] = "; ".join(filter(None, [note, "probes: records whose gold evidence was retained"]))
    return out


# ------------------------------------------------------------------------------------------------ choosing

def _spec_figures(manifest: dict) -> list[str] | None:
    """``SPEC.figures`` as the manifest records it; a malformed spec is warned about and ignored."""
    config = manifest.get("config")
    spec = config.get("spec") if isinstance(config, dict) else None
    listed = spec.get("figures") if isinstance(spec, dict) else None
    if spec is not None and not isinstance(spec, dict) or listed and (
            not isinstance(listed, (list, tuple)) or not all(isinstance(n, str) for n in listed)):
        what = (f"config.spec should be an object (the analysis spec), got {type(spec).__name__}"
                if not isinstance(spec, dict) else f"config.spec.figures should be a list of names, got {listed!r}")
        warnings.warn(f"the manifest's {what}: the figures are chosen from the tables alone. Fix: restore "
                      "manifest.json, or pass --only NAMES", stacklevel=3)
        return None
    return list(listed) if listed else None


def figure_plan(tables: dict, manifest: dict | None = None, only: str | Sequence[str] | None = None,
                all_supported: bool = False) -> tuple[list[str], dict[str, str]]:
    """``(entries to draw, {entry of SPEC.figures not drawn: why, and how to get it})``: ``only`` (a name,
    comma-separated names or a list); else the analysis's ``SPEC.figures`` (from the manifest) with companions; else
    (or with ``all_supported``, or when none of ``SPEC.figures`` can be built) every entry the tables support. Each
    entry's ``needs`` says why it cannot be built and how to get it."""
    check_not_empty(tables)
    if only:
        chosen = [n.strip() for n in only.split(",") if n.strip()] if isinstance(only, str) else list(only)
        for name in chosen:
            reason = supported(tables, name)
            if reason:
                raise FigureError(f"cannot build {name}: {reason}")
        return chosen, {}
    spec = None if all_supported else _spec_figures(manifest or {})
    not_drawn = {}
    if spec:
        chosen = []
        for name in spec:
            chosen += [name] + list(COMPANIONS.get(name, ()))
        for name in dict.fromkeys(spec):
            reason = supported(tables, name) if name in REGISTRY else "not a registered figure or table"
            if reason:
                not_drawn[name] = reason
        chosen = [n for n in dict.fromkeys(chosen) if n in REGISTRY and supported(tables, n) is None]
        if chosen:
            return chosen, not_drawn
    return [n for n in names() if supported(tables, n) is None], not_drawn


def select_figures(tables: dict, manifest: dict | None = None, only: str | Sequence[str] | None = None,
                   all_supported: bool = False) -> list[str]:
    """The entries to draw (:func:`figure_plan`)."""
    return figure_plan(tables, manifest, only, all_supported)[0]


def cross_run_entries(tables: dict) -> list[str]:
    """The cross-run entries (:data:`CROSS_RUN`) the grid's tables support."""
    return [n for n in CROSS_RUN if supported(tables, n) is None]
