"""The text a finished run prints: the accuracy table in the paper's metric, evidence retention and skipped records;
and, for a run that produced no answer, the one line saying why and what to change (:func:`empty_run_problem`).
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


#: per skip reason, what to change (the CLI prints it when every unit of a run was skipped)
SKIP_FIXES = {
    "too_short": "raise the budget (e.g. --budget 0.2) or use longer records; where a selector's budget fits no whole "
                 "unit, a finer unit (bm25:granularity=turn) or bm25:packing=truncate; a history must also be longer "
                 "than the 32-token observation window",
    "too_long": "use shorter records or fewer --max-new-tokens, a smaller condition shift, or a model with a longer "
                "context (or raise --max-history-tokens where it cut the records); dilation(k) and key_only(k) need "
                "about k times the history's positions: extend the rotary range with --rope-scaling "
                "yarn:FACTOR:ORIGINAL_MAX --max-position N (e.g. yarn:4:32768 --max-position 131072 for Qwen2.5)",
    "position": "use conditions that can place these selections (a smaller move= or shift)",
}


def empty_run_problem(tables: dict[str, pd.DataFrame]) -> str | None:
    """One line for a finished run without a single answer: the cause (every unit skipped, with the reasons
    counted and one example, or no unit at all) and the fix. None when the run has answers.

    Example:
        >>> skipped = pd.DataFrame({"record_id": ["a", "b"], "selector": "bm25", "budget": 0.1, "reason": "too_short",
        ...                         "history_length": 180, "detail": "K=18 fits no session"})
        >>> print(empty_run_problem({"answers": pd.DataFrame(), "skipped": skipped}))  # doctest: +ELLIPSIS
        the run produced no answer: all 2 unit(s) of 2 record(s) were skipped (too_short: 2; e.g. K=18 fits no ...
        >>> empty_run_problem({"answers": pd.DataFrame({"answer": ["x"]}), "skipped": skipped}) is None
        True
    """
    answers = tables.get("answers")
    if answers is not None and len(answers):
        return None
    skipped = tables.get("skipped")
    if skipped is None or skipped.empty:
        return ("the run produced no answer and skipped nothing: it had no unit to run. Fix: check --data, --limit "
                "and --shard (a shard may own no record) and the analysis's selectors and budgets")
    counts = skipped.reason.value_counts()  # most frequent first
    reasons = ", ".join(f"{shown(r)}: {n}" for r, n in counts.items())
    first = skipped[skipped.reason == counts.index[0]].iloc[0]
    fixes = "; ".join(SKIP_FIXES.get(r, f"see the skipped table for {shown(r)}") for r in counts.index)
    return (f"the run produced no answer: all {len(skipped)} unit(s) of {skipped.record_id.nunique()} record(s) were "
            f"skipped ({reasons}; e.g. {shown(first.detail)}). Fix: {fixes}; then run the "
            "same command with --retry-skipped (or a new --out)")


def run_problem(run_dir: str | Path) -> str | None:
    """:func:`empty_run_problem` of a finished run directory (None: it has answers)."""
    return empty_run_problem(load_tables(run_dir))


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
