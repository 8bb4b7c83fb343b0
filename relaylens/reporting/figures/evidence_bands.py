"""Figure 6's numbers with their uncertainty: per layer band, the paired difference of each condition's gold
evidence share against ``original`` in percentage points, with a 95% cluster-bootstrap interval and win:loss counts.

The layer-band table (:mod:`relaylens.reporting.figures.evidence_reading`) pools every record's heads and layers
into one mean per band; this table first reduces each record to one number per band (mean over the band's layers of
the mean over query heads, times 100), then pairs the records: the paper quotes Figure 6 as +2.52 / +0.84 / +0.71 pp
early / middle / late. Rows: pooled over selectors (``selector = "all"``; pairs are still per record and selector),
then per selector when the run has several. Quantities: the forward ``evidence_share`` at each probe point and the
phase-replay ``replay_gold_share`` (final question token only).
"""

from __future__ import annotations

import pandas as pd

from relaylens.conditions.bands import band_of
from relaylens.reporting.figures.evidence_reading import (
    FIGURE6_CONDITIONS,
    PROBE_POINTS,
)
from relaylens.reporting.figures.registry import needs_probes, register
from relaylens.reporting.summaries import (
    REFERENCE,
    condition_order,
    paired_deltas,
    win_loss,
)
from relaylens.results.tables import get_table

QUANTITIES = (("forward", "evidence_share"), ("replay", "replay_gold_share"))
"""(source, metric) pairs of the table, both shares of attention mass on the retained gold evidence."""
BAND_ORDER = ("early", "middle", "late")


def record_band_shares(tables: dict) -> pd.DataFrame:
    """Per (record, selector, budget, probe_point, source, band, condition) the share in pp; ``metric`` is
    ``<source>:<metric>`` and ``cluster_id`` comes from the answers table."""
    every = get_table(tables, "probes")
    keep = pd.Series(False, index=every.index)
    for source, metric in QUANTITIES:
        keep |= (every["source"] == source) & (every["metric"] == metric)
    probes = every[keep]
    present = set(probes["condition"])
    conditions = [c for c in FIGURE6_CONDITIONS if c in present] or [
        c for c in condition_order(present) if not c.startswith("compaction(")]
    probes = probes[probes["condition"].isin(conditions)]
    key = ["record_id", "selector", "budget", "condition", "probe_point", "source", "metric"]
    if probes.empty:
        return pd.DataFrame(columns=key + ["band", "cluster_id", "value"])
    num_layers = int(every["layer"].max()) + 1
    per_layer = probes.groupby(key + ["layer"], sort=True)["value"].mean().reset_index()
    per_layer["band"] = per_layer["layer"].map(band_of(num_layers))
    rows = per_layer.groupby(key + ["band"], sort=True)["value"].mean().mul(100.0).reset_index()
    rows["metric"] = rows["source"] + ":" + rows["metric"]
    clusters = get_table(tables, "answers")[["record_id", "selector", "budget", "cluster_id"]].drop_duplicates(
        ["record_id", "selector", "budget"])
    return rows.merge(clusters, on=["record_id", "selector", "budget"], how="left")


def evidence_band_table(tables: dict) -> pd.DataFrame:
    """One row per (selector or ``all``, probe point, quantity, band, condition other than original): the original
    mean and the condition's mean (pp), the paired ``delta`` (pp) with its 95% interval, ``n`` pairs, ``wins`` and
    ``losses``."""
    rows = record_band_shares(tables)
    columns = ["selector", "probe_point", "quantity", "band", "condition", "n", "original_pp", "value_pp", "delta_pp",
               "delta_low", "delta_high", "wins", "losses"]
    if rows.empty or REFERENCE not in set(rows["condition"]):
        return pd.DataFrame(columns=columns)
    pooled = [("all", rows, ["probe_point", "band"])]
    per_selector = [(sel, rows[rows["selector"] == sel], ["probe_point", "band"])
                    for sel in sorted(rows["selector"].unique())] if rows["selector"].nunique() > 1 else []
    metrics = [f"{s}:{m}" for s, m in QUANTITIES if (rows["metric"] == f"{s}:{m}").any()]
    parts = []
    for selector, data, by in pooled + per_selector:
        deltas = paired_deltas(data, by, reference=REFERENCE, metrics=metrics)
        counts = win_loss(data, by, reference=REFERENCE)
        means = data.groupby(by + ["metric", "condition"], sort=True)["value"].mean().unstack("condition")
        base = means[REFERENCE].rename("original_pp").reset_index()
        value = means.stack().rename("value_pp").reset_index()
        part = (deltas.merge(counts.drop(columns="n"), on=by + ["condition", "metric"], how="left")
                .merge(base, on=by + ["metric"], how="left").merge(value, on=by + ["metric", "condition"], how="left"))
        parts.append(part.assign(selector=selector))
    out = pd.concat(parts, ignore_index=True).rename(
        columns={"metric": "quantity", "mean": "delta_pp", "low": "delta_low", "high": "delta_high"})
    point_rank = {p: i for i, (p, _) in enumerate(PROBE_POINTS)}
    quantity_rank = {q: i for i, q in enumerate(metrics)}
    band_rank = {b: i for i, b in enumerate(BAND_ORDER)}
    cond_rank = {c: i for i, c in enumerate(condition_order(out["condition"].unique()))}
    out = out.assign(_s=out["selector"] != "all", _q=out["quantity"].map(quantity_rank),
                     _p=out["probe_point"].map(point_rank).fillna(len(point_rank)), _b=out["band"].map(band_rank),
                     _c=out["condition"].map(cond_rank))
    out = out.sort_values(["_s", "selector", "_q", "_p", "probe_point", "_c", "_b"], kind="mergesort")
    return out[columns].reset_index(drop=True).astype({"n": int, "wins": int, "losses": int})


@register("evidence_bands", "table", "Figure 6 per band: each condition's gold evidence share minus original's "
          "(pp, paired per record, 95% cluster bootstrap), win:loss counts", needs_probes)
def evidence_bands(tables: dict) -> pd.DataFrame:
    return evidence_band_table(tables)
