"""Table 8, the paper's (``analyses/main_table.py`` grid): per setting (model, dataset, selector, budget) the paired
RoPERelay - Original difference of the run's metric with its 95% cluster-bootstrap interval (10,000 resamples), and
how many settings improve ("N of M settings improve"). Several run directories (``relaylens figures RUN...``) make
the model x dataset grid."""

from __future__ import annotations

import pandas as pd

from relaylens.crossrun import paired_settings_table, settings_count
from relaylens.figures.registry import needs_relay_pairs, register
from relaylens.summaries import accuracy_scores, metric_list


@register("table8", "table", "Table 8: paired RoPERelay - Original difference per setting (95% cluster bootstrap, "
          "10,000 resamples)", needs_relay_pairs)
def table8(tables: dict) -> pd.DataFrame:
    scores = accuracy_scores(tables)
    parts = [paired_settings_table(scores, metric) for metric in metric_list(scores)]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    out.attrs["note"] = "; ".join(f"{m}: {settings_count(out[out['metric'] == m])}" for m in out["metric"].unique())
    return out
