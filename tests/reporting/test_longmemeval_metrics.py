"""The longmemeval_metrics table: per type, task-averaged, overall and abstention accuracy as the benchmark's
print_qa_metrics.py computes them (hand-computed on an uneven example, and against that script's formula), paired
deltas, failures, intervals, and drawn only for runs with judge_lme scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from relaylens.reporting import figures, summaries
from relaylens.reporting.figures.longmemeval_metrics import (
    COLUMNS,
    lme_metrics,
    longmemeval_metrics_table,
    task_averaged,
)
from relaylens.reporting.figures.writer import write_entry
from relaylens.results.tables import example_tables
from relaylens.scoring.longmemeval_judge import QUESTION_TYPES

# record: (question type, original verdict, relay verdict); NaN = the judge failed
UNEVEN = {"ms1": ("multi-session", 1.0, 1.0), "ms2": ("multi-session", 1.0, 0.0), "ms3": ("multi-session", 1.0, 1.0),
          "ku1": ("knowledge-update", 0.0, 1.0), "tr1_abs": ("temporal-reasoning", 1.0, 0.0),
          "ss1": ("single-session-user", np.nan, 1.0)}


def _scores(verdicts: dict, metric: str = "judge_lme") -> pd.DataFrame:
    rows = []
    for rid, (qtype, *values) in verdicts.items():
        for condition, value in zip(("original", "relay"), values):
            common = dict(record_id=rid, selector="bm25", budget=0.1, condition=condition, question_type=qtype,
                          is_abstention="_abs" in rid, cluster_id=None)
            rows += [common | dict(metric=metric, value=value),
                     common | dict(metric=f"{metric}_failed", value=float(np.isnan(value))),
                     common | dict(metric="contains", value=0.0)]
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def fast_bootstrap(monkeypatch):
    monkeypatch.setattr(summaries, "N_RESAMPLES", 400)


def test_hand_computed_uneven_example():
    table = longmemeval_metrics_table({"scores": _scores(UNEVEN)}).set_index("condition")
    original, relay = table.loc["original"], table.loc["relay"]
    # original: multi-session 3/3, knowledge-update 0/1, temporal-reasoning 1/1, single-session-user failed
    assert (original.n, original.failed, original.n_types) == (5, 1, 3)
    assert original["multi-session"] == 1.0 and original["knowledge-update"] == 0.0
    assert original["temporal-reasoning"] == 1.0 and np.isnan(original["single-session-user"])
    assert original.task_averaged == pytest.approx(2 / 3)  # (1 + 0 + 1) / 3 types ...
    assert original.overall == pytest.approx(4 / 5)  # ... but 4 of 5 questions: the two differ on uneven types
    assert (original.abstention, original.n_abstention) == (1.0, 1)
    assert np.isnan(original.task_averaged_delta) and np.isnan(original.overall_delta)
    # relay: single-session-user 1/1, multi-session 2/3, knowledge-update 1/1, temporal-reasoning 0/1
    assert (relay.n, relay.failed, relay.n_types) == (6, 0, 4)
    assert relay.task_averaged == pytest.approx((1 + 2 / 3 + 1 + 0) / 4) and relay.overall == pytest.approx(4 / 6)
    assert relay.abstention == 0.0
    # paired on the five records judged under both: per-record differences ms 0, -1, 0; ku +1; tr -1
    assert relay.task_averaged_delta == pytest.approx((-1 / 3 + 1 - 1) / 3)
    assert relay.overall_delta == pytest.approx(-1 / 5)
    for row in (original, relay):
        for column in [*QUESTION_TYPES, "task_averaged", "overall", "abstention"]:
            if np.isfinite(row[column]):
                assert row[f"{column}_low"] <= row[column] <= row[f"{column}_high"], column
    assert (original["multi-session_low"], original["multi-session_high"]) == (1.0, 1.0)  # constant: no spread


def test_matches_the_benchmarks_print_qa_metrics_formula():
    rng = np.random.default_rng(3)
    verdicts = {}
    for i in range(60):
        qtype = QUESTION_TYPES[int(rng.integers(0, len(QUESTION_TYPES)))]
        rid = f"q{i}" + ("_abs" if rng.random() < 0.2 else "")
        verdicts[rid] = (qtype, float(rng.random() < 0.3 + 0.1 * QUESTION_TYPES.index(qtype)),
                         float(rng.random() < 0.5))
    row = longmemeval_metrics_table({"scores": _scores(verdicts)}).set_index("condition").loc["original"]
    # print_qa_metrics.py: type2acc per type, task_acc = mean of the type means, overall over all, abstention over
    # _abs ids
    type2acc = {t: [] for t in QUESTION_TYPES}
    abstention = []
    for rid, (qtype, value, _) in verdicts.items():
        type2acc[qtype].append(value)
        if "_abs" in rid:
            abstention.append(value)
    assert row.task_averaged == pytest.approx(np.mean([np.mean(v) for v in type2acc.values()]))
    assert row.overall == pytest.approx(np.mean([x for v in type2acc.values() for x in v]))
    assert row.abstention == pytest.approx(np.mean(abstention)) and row.n_abstention == len(abstention)
    for qtype, values in type2acc.items():
        assert row[qtype] == pytest.approx(np.mean(values))


def test_task_averaged_interval_resamples_within_each_type():
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    types = np.array(["a", "a", "a", "b", "b", "c"])
    result = task_averaged(values, types, np.arange(6).astype(str), n_resamples=2000)
    assert result.mean == pytest.approx((2 / 3 + 1 / 2 + 0) / 3) and result.n == 6 and result.n_clusters == 6
    assert 0.0 <= result.low <= result.mean <= result.high <= 2 / 3  # type c (one 0) is in every resample
    assert np.isnan(task_averaged([], [], []).mean)


def test_drawn_only_for_runs_with_judge_lme_scores(tmp_path):
    plain = example_tables(records=3, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    assert "no judge_lme scores" in figures.supported(plain, "longmemeval_metrics")
    manifest = {"config": {"spec": {"figures": ["table1"]}}}
    assert "longmemeval_metrics" not in figures.select_figures(plain, manifest)
    judged = dict(plain, scores=pd.concat([plain["scores"], _scores(UNEVEN).query("metric != 'contains'")],
                                          ignore_index=True))
    for spec in ("table1", "table6", "figure4"):
        assert "longmemeval_metrics" in figures.select_figures(judged, {"config": {"spec": {"figures": [spec]}}})
    paths = write_entry("longmemeval_metrics", judged, tmp_path)
    markdown = (tmp_path / "longmemeval_metrics.md").read_text()
    assert "task_averaged [95% CI]" in markdown and "| single-session-user [95% CI] |" in markdown
    assert "Questions judged: single-session-user 1, single-session-preference 0" in markdown
    assert "abstention (_abs ids, also counted in their type) 1" in markdown
    assert [p.name for p in paths] == ["longmemeval_metrics.csv", "longmemeval_metrics.md"]
    assert list(pd.read_csv(paths[0]).columns) == COLUMNS and sum(c.endswith("_low") for c in COLUMNS) == 11


def test_several_longmemeval_judges_each_get_rows():
    scores = pd.concat([_scores(UNEVEN), _scores(UNEVEN, "judge_lme_q15")], ignore_index=True)
    assert lme_metrics(scores) == ["judge_lme", "judge_lme_q15"]
    table = longmemeval_metrics_table({"scores": scores})
    assert list(table.judge) == ["judge_lme", "judge_lme", "judge_lme_q15", "judge_lme_q15"]
    assert list(table.condition) == ["original", "relay"] * 2
