"""The text a finished run prints: the accuracy table in the paper's metric, evidence retention and skipped records.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from relaylens.errors import shown
from relaylens.reporting.crossrun import choose_metrics
from relaylens.reporting.retention import retention_lines
from relaylens.reporting.summaries import run_overview
from relaylens.results.store import load_tables


def skipped_summary(tables: dict[str, pd.DataFrame]) -> str:
    """One line per skipped record (reasons and the units affected), for the run summary; empty when none."""
    skipped = tables.get("skipped")
    if skipped is None or skipped.empty:
        return ""
    lines = [f"skipped {len(skipped)} unit(s) of {skipped.record_id.nunique()} record(s):"]
    for rid, group in skipped.groupby("record_id", sort=True):  # dataset text: shown, one line per record
        reason, detail = shown(group.reason.iloc[0]), shown(group.detail.iloc[0])
        lines.append(f"  {shown(rid)}: {reason} ({len(group)} unit(s)) - {detail}")
    return "\n".join(lines)


def run_summary(run_dir: str | Path) -> str:
    """The accuracy table (the paper's metric when the run has it), evidence retention and skipped records of a
    finished run, as printed by ``relaylens run``."""
    tables = load_tables(run_dir)
    lines = []
    if len(tables["answers"]):
        metrics, note = choose_metrics(tables["scores"])  # the paper's metric when the run has it
        table = run_overview(tables, metric=metrics[0])
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if note:
            lines.append(f"note: {note}")
    lines.extend(retention_lines(tables["answers"]))
    summary = skipped_summary(tables)
    if summary:
        lines.append(summary)
    return "\n".join(lines)
