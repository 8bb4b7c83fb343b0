"""Run-store helpers shared by the result-store and shard tests (not a test module: no tests here)."""

from __future__ import annotations

import math

import pandas as pd

from relaylens.results import RunStore, UnitKey, build_manifest
from relaylens.tables import TABLES

CONDITIONS = ("original", "relay")


def unit_rows(record_id: str, selector: str = "bm25", budget: float = 0.1, cluster: str | None = None, bump: float = 0.0):
    """Rows of one unit: two conditions, two score metrics (one NaN judge), 2 layers x 2 heads of one probe."""
    key = dict(record_id=record_id, selector=selector, budget=budget)
    rec = dict(question_type="single-session-user", is_abstention=record_id.endswith("_abs"), cluster_id=cluster)
    answers, scores, probes = [], [], []
    for j, cond in enumerate(CONDITIONS):
        answers.append(key | rec | dict(condition=cond, prompt_mode="chat", answer=f"ans {record_id} {cond}",
                                        stop_reason="eos", hit_limit=False, new_tokens=3 + j, history_length=100,
                                        max_count=10, mean_count=9.5, question_start=100 if cond == "original" else 10,
                                        gold_units_total=2, gold_units_kept=1, references='["x"]', elapsed_s=0.01,
                                        prefill_s=0.1, selection_s=0.01, batch_rows=1))
        scores.append(key | rec | dict(condition=cond, metric="f1", value=0.5 * j + bump))
        scores.append(key | rec | dict(condition=cond, metric="judge", value=math.nan))
        for layer in (1, 0):
            for head in (1, 0):
                probes.append(key | dict(condition=cond, probe_point="question_final", source="forward", layer=layer,
                                         head=head, metric="evidence_share", value=0.1 * layer + 0.01 * head + j))
    return answers, scores, probes


def manifest(**config):
    return build_manifest("test_analysis", {"seed": 0, "budget": 0.1, **config}, "tiny-llama", "deadbeef")


def fill(store: RunStore, ids, **kw):
    for rid in ids:
        store.write_unit(UnitKey(rid, kw.get("selector", "bm25"), kw.get("budget", 0.1)), *unit_rows(rid, **kw))


def assert_tables_equal(a, b):
    for name in TABLES:
        pd.testing.assert_frame_equal(a[name], b[name])
