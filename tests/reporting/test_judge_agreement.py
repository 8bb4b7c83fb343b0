"""The judge-vs-contains table: counts and rates by hand, failures left out of everything but ``failed``, kappa
against the formula written out here, and when the table is drawn."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from relaylens.reporting import figures
from relaylens.reporting.figures.judge_agreement import judge_agreement_table

# (record, condition, judge verdict or None = failed reply, contains)
ANSWERS = [("r0", "original", 1, 1), ("r1", "original", 0, 0), ("r2", "original", 0, 1), ("r3", "original", 0, 0),
           ("r0", "relay", 1, 0), ("r1", "relay", None, 1), ("r2", "relay", 1, 1), ("r3", "relay", 0, 0)]


def _scores(answers=ANSWERS, judge="judge_small") -> pd.DataFrame:
    rows = []
    for record, condition, verdict, contains in answers:
        meta = dict(record_id=record, selector="bm25", budget=0.1, condition=condition, cluster_id=record)
        rows += [dict(meta, metric="contains", value=float(contains)), dict(meta, metric="f1", value=0.5),
                 dict(meta, metric=judge, value=math.nan if verdict is None else float(verdict)),
                 dict(meta, metric=f"{judge}_failed", value=float(verdict is None))]
    return pd.DataFrame(rows)


def _kappa(pairs) -> float:
    n = len(pairs)
    p_o = sum(a == b for a, b in pairs) / n
    pa, pb = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    p_e = pa * pb + (1 - pa) * (1 - pb)
    return (p_o - p_e) / (1 - p_e)


def test_counts_rates_and_kappa_per_condition_and_pooled():
    table = judge_agreement_table({"scores": _scores()}).set_index("condition")
    assert list(table.index) == ["original", "relay", "all"] and set(table["judge"]) == {"judge_small"}
    orig, relay, pooled = table.loc["original"], table.loc["relay"], table.loc["all"]
    assert (orig["answers"], orig["failed"], orig["n"]) == (4, 0, 4)
    assert (orig["both_correct"], orig["judge_only"], orig["contains_only"]) == (1, 0, 1)
    assert orig["judge_accuracy"] == 0.25 and orig["contains_accuracy"] == 0.5 and orig["agreement"] == 0.75
    assert orig["kappa"] == pytest.approx(_kappa([(1, 1), (0, 0), (0, 1), (0, 0)]))
    # r1 under relay: a failed reply counts in `failed` only, never as wrong or right
    assert (relay["answers"], relay["failed"], relay["n"]) == (4, 1, 3)
    assert (relay["both_correct"], relay["judge_only"], relay["contains_only"]) == (1, 1, 0)
    assert relay["judge_accuracy"] == pytest.approx(2 / 3) and relay["contains_accuracy"] == pytest.approx(1 / 3)
    valid = [(v, c) for _, _, v, c in ANSWERS if v is not None]
    assert (pooled["answers"], pooled["failed"], pooled["n"]) == (8, 1, 7)
    assert pooled["agreement"] == pytest.approx(sum(a == b for a, b in valid) / 7)
    assert pooled["kappa"] == pytest.approx(_kappa(valid))


def test_drawn_with_figure4_and_table1_only_when_a_judge_scored():
    scores = _scores()
    answers = scores[scores.metric == "contains"].drop(columns=["metric", "value"]).assign(answer="x")
    tables = {"scores": scores, "answers": answers, "probes": pd.DataFrame()}
    assert figures.supported(tables, "judge_agreement") is None
    assert "judge_agreement" in figures.COMPANIONS["figure4"] and "judge_agreement" in figures.COMPANIONS["table1"]
    no_judge = {**tables, "scores": scores[~scores.metric.str.startswith("judge")]}
    assert "no judge scored" in figures.supported(no_judge, "judge_agreement")
    no_contains = {**tables, "scores": scores[scores.metric != "contains"]}
    assert "no contains" in figures.supported(no_contains, "judge_agreement")


def test_two_judges_get_their_own_rows():
    both = pd.concat([_scores(), _scores([(r, c, 1, k) for r, c, _, k in ANSWERS], judge="judge_big")])
    table = judge_agreement_table({"scores": both})
    pooled = table[table.condition == "all"].set_index("judge")
    assert sorted(pooled.index) == ["judge_big", "judge_small"]
    assert pooled.loc["judge_big", "judge_accuracy"] == 1.0 and pooled.loc["judge_big", "failed"] == 0
