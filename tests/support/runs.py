"""Helpers shared by the result-store, shard and whole-run tests (not a test module: no tests here): fabricated
units, a tiny saved model with a records file, the real CLI in a subprocess, and timing-free tables."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from relaylens.results.store import RunStore, UnitKey, build_manifest, load_tables
from relaylens.results.tables import TABLES, TIMING_COLUMNS

CLI_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}  # two shared cores: one torch thread is far faster

CONDITIONS = ("original", "relay")


def unit_rows(record_id: str, selector: str = "bm25", budget: float = 0.1, cluster: str | None = None,
              bump: float = 0.0):
    """Rows of one unit: two conditions, two score metrics (one NaN judge), 2 layers x 2 heads of one probe."""
    key = dict(record_id=record_id, selector=selector, budget=budget)
    rec = dict(question_type="single-session-user", is_abstention=record_id.endswith("_abs"), cluster_id=cluster)
    answers, scores, probes = [], [], []
    for j, cond in enumerate(CONDITIONS):
        answers.append(key | rec | dict(condition=cond, prompt_mode="chat", answer=f"ans {record_id} {cond}",
                                        stop_reason="eos", hit_limit=False, new_tokens=3 + j, history_length=100,
                                        max_count=10, mean_count=9.5, question_start=100 if cond == "original" else 10,
                                        gold_units_total=2, gold_units_kept=1, references='["x"]', elapsed_s=0.01,
                                        prefill_s=0.1, selection_s=0.01, batch_rows=1,
                                        first_token_eos_prob=0.05))
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


def tiny_workspace(root: Path, records: list[dict]) -> tuple[Path, Path, Path]:
    """``(root, model_dir, data)``: a tiny random Llama with its tokenizer saved under ``root`` and ``records``
    written to ``root/records.json`` (what ``relaylens run --model --data`` reads)."""
    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir = root / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = root / "records.json"
    data.write_text(json.dumps(records))
    return root, model_dir, data


def cli(*args, env: dict | None = None, timeout: float = 600, check: bool = True, prefix: list[str] | None = None):
    """Run ``relaylens ARGS...`` in a subprocess (``prefix`` replaces ``python -m relaylens.cli``); with ``check``
    a non-zero exit fails the test with the end of stderr."""
    command = (prefix or [sys.executable, "-m", "relaylens.cli"]) + [str(a) for a in args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or CLI_ENV)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def committed_units(run_dir: Path) -> int:
    """Unit files committed in a run directory (0 when it does not exist yet)."""
    return len(list((Path(run_dir) / "units").glob("[0-9a-f]*.json.gz")))


def comparable_tables(run_dir) -> dict[str, pd.DataFrame]:
    """The run's tables without timing columns, in their canonical (key) order."""
    return {name: frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns]).reset_index(drop=True)
            for name, frame in load_tables(run_dir).items()}
