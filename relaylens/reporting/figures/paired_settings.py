"""Table 8, the paper's (``analyses/main_table.py`` grid): per setting (model, dataset, selector, budget) the paired
RoPERelay - Original difference of the run's metric with its 95% cluster-bootstrap interval (10,000 resamples), the
two means over the same valid pairs (they reconcile with the difference when a judge failed on some rows), and how
many settings improve ("N of M settings improve", over the settings with a valid pair). A setting with fewer than
10 clusters is flagged (``flag``; its interval takes few distinct values). Several run directories
(``relaylens figures RUN...``) make the model x dataset grid."""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.crossrun import paired_settings_table, settings_count
from relaylens.reporting.figures.registry import needs_relay_pairs, register
from relaylens.reporting.summaries import accuracy_scores, budget_label, metric_list


@register("table8", "table", "Table 8: paired RoPERelay - Original difference per setting (95% cluster bootstrap, "
          "10,000 resamples)", needs_relay_pairs)
def table8(tables: dict) -> pd.DataFrame:
    scores = accuracy_scores(tables)
    parts = [paired_settings_table(scores, metric) for metric in metric_list(scores)]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    out.attrs["note"] = "; ".join(f"{m}: {settings_count(out[out['metric'] == m])}" for m in out["metric"].unique())
    return out


def table8_lines(scores: pd.DataFrame, metrics) -> list[tuple[str, str]]:
    """``("Table 8 (metric)", "N of M settings improve (...): setting delta [low, high], ...")`` per metric: the
    report's summary of Table 8 (settings named ``model x dataset: selector @ budget`` in a cross-run grid)."""
    if not {"original", "relay"} <= set(scores["condition"]):
        return []
    lines = []
    for metric in metrics:
        t8 = paired_settings_table(scores, metric)
        if len(t8):
            deltas = ", ".join(f"{_setting(r)} {r.delta:+.3f} [{r.delta_low:+.3f}, {r.delta_high:+.3f}]"
                               + (f" - {r.flag}" if r.flag else "") for r in t8.itertuples())
            lines.append((f"Table 8 ({metric})", f"{settings_count(t8)}: {deltas}"))
    return lines


def _setting(row) -> str:
    grid = " x ".join(str(getattr(row, c)) for c in ("model", "dataset") if hasattr(row, c))
    return (f"{grid}: " if grid else "") + f"{row.selector} @ {budget_label(float(row.budget))}"
