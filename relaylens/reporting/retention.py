"""Evidence retention (torch-free): did the selection keep the gold evidence at all?

A record's evidence is *retained* under a (selector, budget) when every gold unit (session or turn, at the run's
granularity) keeps at least one history state (``answers.gold_units_kept == gold_units_total``). Records without
gold units (abstention questions) are not counted. Every run summary, report and figure footer states
"gold evidence retained in X of N records" per selector and budget; probe figures can be restricted to the
records whose evidence survived (:func:`retained_keys`).

Example:
    >>> import pandas as pd
    >>> answers = pd.DataFrame({"record_id": ["a", "a", "b", "c"], "selector": ["bm25"] * 4, "budget": [0.1] * 4,
    ...                         "condition": ["original", "relay", "original", "original"],
    ...                         "gold_units_total": [1, 1, 2, 0], "gold_units_kept": [1, 1, 1, 0]})
    >>> retention_lines(answers)
    ['bm25 @ 0.1: gold evidence retained in 1 of 2 records']
"""

from __future__ import annotations

import pandas as pd

__all__ = ["retention_table", "retention_lines", "retained_keys", "restrict_to_retained"]


def _per_unit(answers: pd.DataFrame) -> pd.DataFrame:
    cols = ["record_id", "selector", "budget", "gold_units_total", "gold_units_kept"]
    units = answers[cols].drop_duplicates(["record_id", "selector", "budget"])  # conditions share one selection
    return units[units.gold_units_total > 0].assign(retained=lambda u: u.gold_units_kept >= u.gold_units_total)


def retention_table(answers: pd.DataFrame) -> pd.DataFrame:
    """Per (selector, budget): ``records`` with gold evidence, ``retained`` of them, and ``rate``."""
    units = _per_unit(answers)
    if units.empty:
        return pd.DataFrame(columns=["selector", "budget", "records", "retained", "rate"])
    table = units.groupby(["selector", "budget"], sort=True).agg(records=("retained", "size"),
                                                                 retained=("retained", "sum")).reset_index()
    table["retained"] = table["retained"].astype(int)
    table["rate"] = table.retained / table.records
    return table


def retention_lines(answers: pd.DataFrame) -> list[str]:
    """``"SELECTOR @ BUDGET: gold evidence retained in X of N records"`` per selector and budget."""
    return [f"{r.selector} @ {r.budget:g}: gold evidence retained in {r.retained} of {r.records} records"
            for r in retention_table(answers).itertuples()]


def retained_keys(answers: pd.DataFrame) -> set[tuple[str, str, float]]:
    """``(record_id, selector, budget)`` of the units whose gold evidence was retained."""
    units = _per_unit(answers)
    units = units[units.retained]
    return set(zip(units.record_id, units.selector, units.budget.astype(float)))


def restrict_to_retained(frame: pd.DataFrame, answers: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``frame`` (probes or scores) belonging to units whose gold evidence was retained."""
    keep = retained_keys(answers)
    mask = [(r, s, float(b)) in keep for r, s, b in zip(frame.record_id, frame.selector, frame.budget)]
    return frame[mask]
