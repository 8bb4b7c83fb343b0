"""Judge agreement (torch-free): raw agreement and Cohen's kappa between judges, and the cross-judge table.

The cross-judge table (the paper's Table 12) puts, per selector and budget, the RoPERelay gain under each judge
(paired mean of ``relay - original`` over records both conditions of which each judge scored) beside the two
judges' raw agreement and Cohen's kappa over the same answers (every condition; failed verdicts excluded).

Example:
    >>> cohen_kappa([1, 1, 0, 0], [1, 1, 0, 1])
    0.5
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd

from relaylens.errors import ShapeError

__all__ = ["cohen_kappa", "judge_metrics", "cross_judge_table"]

_JUDGE = re.compile(r"^judge(_[a-z0-9_]+)?$")


def cohen_kappa(a, b) -> float:
    """Cohen's kappa of two binary raters over the same items: ``(p_o - p_e) / (1 - p_e)``; NaN for no items, 1.0
    when both raters are constant and equal (chance agreement 1)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ShapeError(f"raters rated different numbers of items: {x.shape} vs {y.shape}. Fix: pass both raters' "
                         "labels for the same items, in the same order")
    if x.size == 0:
        return math.nan
    observed = float(np.mean(x == y))
    px, py = float(x.mean()), float(y.mean())
    expected = px * py + (1 - px) * (1 - py)
    if expected >= 1.0:
        return 1.0 if observed == 1.0 else math.nan
    return (observed - expected) / (1 - expected)


def judge_metrics(scores: pd.DataFrame) -> list[str]:
    """Judge verdict metrics present in a scores table: ``judge`` (the run's inline judge) and ``judge_<name>``
    (``relaylens judge``), failure flags excluded."""
    names = sorted(m for m in scores["metric"].unique() if _JUDGE.match(m) and not m.endswith("_failed"))
    return sorted(names, key=lambda m: (m != "judge", m))


def _gain(frame: pd.DataFrame, metric: str, treatment: str, reference: str) -> tuple[float, int]:
    wide = frame[frame.metric == metric].pivot_table(index="record_id", columns="condition", values="value",
                                                     aggfunc="first")
    if treatment not in wide or reference not in wide:
        return math.nan, 0
    pair = wide[[treatment, reference]].dropna()
    return (float((pair[treatment] - pair[reference]).mean()) if len(pair) else math.nan), len(pair)


def cross_judge_table(scores: pd.DataFrame, treatment: str = "relay", reference: str = "original") -> pd.DataFrame:
    """One row per (selector, budget, judge pair), plus ``all`` selectors pooled: each judge's paired gain
    (``gain_a``, ``gain_b``, in accuracy points 0-1), the answers both judged validly (``n``), raw agreement and
    Cohen's kappa. Empty when fewer than two judges scored the run."""
    judges = judge_metrics(scores)
    columns = ["selector", "budget", "judge_a", "judge_b", "gain_a", "gain_b", "n", "agreement", "kappa"]
    if len(judges) < 2:
        return pd.DataFrame(columns=columns)
    frame = scores[scores.metric.isin(judges)]
    groups = [(sel, budget, g) for (sel, budget), g in frame.groupby(["selector", "budget"], sort=True)]
    for budget, g in frame.groupby("budget", sort=True):
        if g.selector.nunique() > 1:
            groups.append(("all", budget, g.assign(record_id=g.record_id + "|" + g.selector)))
    rows = []
    for selector, budget, g in groups:
        wide = g.pivot_table(index=["record_id", "condition"], columns="metric", values="value", aggfunc="first")
        for a, b in itertools.combinations(judges, 2):
            if a not in wide or b not in wide:
                continue
            both = wide[[a, b]].dropna()
            rows.append({"selector": selector, "budget": float(budget), "judge_a": a, "judge_b": b,
                         "gain_a": _gain(g, a, treatment, reference)[0], "gain_b": _gain(g, b, treatment, reference)[0],
                         "n": len(both), "agreement": float((both[a] == both[b]).mean()) if len(both) else math.nan,
                         "kappa": cohen_kappa(both[a], both[b])})
    return pd.DataFrame(rows, columns=columns)
