"""Schemas of the consolidated result tables (long format, one parquet file each in a run directory).

Every row of every table carries the paired-comparison key ``(record_id, selector, budget, condition)``; all
conditions of one (record, selector, budget) share one prefill and one selection.

``answers`` — one row per key:

| column | type | meaning |
|---|---|---|
| record_id, selector, budget, condition | str, str, float, str | the key (``budget``: retention ratio, or states when >
1) | | question_type, is_abstention, cluster_id | str, bool, str | from the record (cluster: bootstrap unit) | |
prompt_mode | str | ``chat`` / ``completion`` | | answer | str | decoded greedy answer | | stop_reason, hit_limit | str,
bool | ``eos`` / ``newline`` / ``limit``; whether ``max_new_tokens`` cut the answer | | new_tokens | int | generated
tokens | | history_length, max_count, mean_count | int, int, float | ``L``, ``M``, mean kept states per (layer, kv_head)
| | question_start | int | first question position under the condition | | gold_units_total, gold_units_kept | int, int
| gold units of the record, and those with at least one retained token | | references | str | JSON list of reference
answers | | elapsed_s | float | question pass + decoding of this row (a batch's wall time split evenly over its rows) |
| prefill_s, selection_s | float | the record's history prefill, and this unit's selection (shared by its conditions) |
| batch_rows | int | rows decoded together with this one (``--batch-rows``; 1: sequential, complete-request timing) |

Timing columns (``elapsed_s``, ``prefill_s``, ``selection_s``, ``batch_rows``) are excluded from determinism checks;
a complete request is ``prefill_s + selection_s + elapsed_s`` of a ``batch_rows == 1`` row.

``scores`` — one row per (key, metric): columns ``record_id, selector, budget, condition, question_type,
is_abstention, cluster_id, metric, value``; metrics ``exact_match``, ``f1``, ``contains``, ``choice_accuracy``,
``abstention``, ``judge`` (``value`` NaN with ``judge_failed`` when a judge verdict is not valid JSON); summaries
(HelloBench) carry ``quality``, ``factuality``, ``coverage`` (0-1; NaN with ``checklist_failed`` when the checklist
reply is malformed, :mod:`relaylens.scoring.checklist`) instead of the answer metrics.

``probes`` — one row per (key, probe point, layer, head, metric): columns ``record_id, selector, budget,
condition, probe_point, source, layer, head, metric, value``; ``probe_point`` is ``question_final`` or
``first_answer_token``; ``source`` is ``forward`` (readouts of the real pass) or ``replay`` (phase replay), or
``sweep`` (the per-layer causal sweep of ``--sweep layers``: ``evidence_share`` of the conditions ``original``,
``relay@layers=l`` and ``relay@layers=0-l``; their ``first_answer_logprob`` scores sit in ``scores``, and they have
no ``answers`` rows).
With ``sensitivity`` the forward readouts add ``positional_sensitivity_b`` and ``positional_sensitivity_s`` at
``question_final`` (their ``head`` column holds the **kv head**). With ``attribution`` (the ``evidence_reading``
analysis) the forward readouts add ``evidence_grad_x_input``, ``history_grad_x_input``, ``evidence_grad_x_input_share``,
``evidence_logit_contribution`` and ``history_logit_contribution`` (:mod:`relaylens.probes.attribution`).

``skipped`` — one row per (record, selector, budget) unit that was not run: columns ``record_id, selector, budget,
reason, history_length, detail``; ``reason`` is ``too_long`` (history over ``--max-history-tokens``, or positions a
condition needs past the rotary range), ``too_short`` (history or budget smaller than a selector's observation
window, or a budget that keeps no state), ``position`` (a condition cannot place the selection, e.g. a ``move=`` past
the question); ``detail`` is the full one-line explanation. A skipped unit is committed like any other, so a resumed run
does not retry it silently (``--retry-skipped`` does, on purpose).

``geometry`` (optional; written by ``learned_geometry``) — one row per (training step, layer, head, metric):
columns ``record_id, selector, budget, step, layer, head, metric, value``; ``record_id`` is ``training`` (the run's
one training unit, rewritten after every step); metrics ``train_loglik`` (mean teacher-forced answer log-likelihood
per token over the step's train records, at the parameters before the update), ``test_loglik`` and
``train_all_loglik`` (all test / train records, at evaluation steps), ``step_s`` (seconds of the step), the family's
parameters ``b``, ``s``, ``alpha`` after ``step`` updates (``layer``/``head`` ``-1`` where shared; ``head`` is a kv
head), and at the last step only Adam's moments ``adam_m:<parameter>``, ``adam_v:<parameter>`` (for resuming).

Column kinds are in :data:`DTYPES`, each table's row identity (and sort order) in :data:`SORT_COLUMNS`;
:func:`example_tables` fabricates small seeded tables of this schema for examples and tests.

Example:
    >>> t = example_tables(records=2, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    >>> {name: len(df) for name, df in t.items()}
    {'answers': 4, 'scores': 12, 'probes': 480}
    >>> list(get_table({}, "scores").columns) == SCORE_COLUMNS
    True
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pandas as pd

KEY_COLUMNS = ["record_id", "selector", "budget", "condition"]
TIMING_COLUMNS = ["elapsed_s", "prefill_s", "selection_s", "batch_rows"]

ANSWER_COLUMNS = KEY_COLUMNS + [
    "question_type", "is_abstention", "cluster_id", "prompt_mode", "answer", "stop_reason", "hit_limit", "new_tokens",
    "history_length", "max_count", "mean_count", "question_start", "gold_units_total", "gold_units_kept", "references",
    "elapsed_s", "prefill_s", "selection_s", "batch_rows", "first_token_eos_prob",
]
SCORE_COLUMNS = KEY_COLUMNS + ["question_type", "is_abstention", "cluster_id", "metric", "value"]
PROBE_COLUMNS = KEY_COLUMNS + ["probe_point", "source", "layer", "head", "metric", "value"]
SKIPPED_COLUMNS = ["record_id", "selector", "budget", "reason", "history_length", "detail"]
GEOMETRY_COLUMNS = ["record_id", "selector", "budget", "step", "layer", "head", "metric", "value"]
TABLES = {"answers": ANSWER_COLUMNS, "scores": SCORE_COLUMNS, "probes": PROBE_COLUMNS, "skipped": SKIPPED_COLUMNS,
          "geometry": GEOMETRY_COLUMNS}
OPTIONAL_TABLES = ("skipped", "geometry")
"""Tables that unit files written before they existed may lack (read as empty)."""
SWEEP_SOURCE = "sweep"
"""``source`` of the probe rows of the per-layer causal sweep (kept out of per-layer tables of the main conditions)."""
FIRST_ANSWER_LOGPROB = "first_answer_logprob"
"""Score metric: log-probability the final question token gives the first reference-answer token (sweep rows)."""
ANSWER_LOGLIK = "answer_loglik"
"""Score metric: mean per-token log-likelihood of the reference answer, teacher-forced after the question
(``learned_geometry``'s evaluation rows)."""
SENSITIVITY_METRICS = ("positional_sensitivity_b", "positional_sensitivity_s")
"""Probe metrics of the positional sensitivity readout (:mod:`relaylens.probes.sensitivity`); their ``head`` is a
kv head."""
TRAINING_UNIT = "training"
"""``record_id`` of the geometry table's rows: the one training unit of a ``learned_geometry`` run."""

INT, FLOAT, BOOL, STR, OPT_STR = "int", "float", "bool", "str", "str?"
DTYPES: dict[str, str] = {
    "record_id": STR, "selector": STR, "budget": FLOAT, "condition": STR, "question_type": STR,
    "is_abstention": BOOL, "cluster_id": OPT_STR, "prompt_mode": STR, "answer": STR, "stop_reason": STR,
    "hit_limit": BOOL, "new_tokens": INT, "history_length": INT, "max_count": INT, "mean_count": FLOAT,
    "question_start": INT, "gold_units_total": INT, "gold_units_kept": INT, "references": STR,
    "elapsed_s": FLOAT, "prefill_s": FLOAT, "selection_s": FLOAT, "batch_rows": INT, "first_token_eos_prob": FLOAT,
    "metric": STR, "value": FLOAT,
    "probe_point": STR, "source": STR, "layer": INT, "head": INT, "reason": STR, "detail": STR, "step": INT,
}
"""Column kinds: ``int`` (int64), ``float`` (float64, None -> NaN), ``bool``, ``str``, ``str?`` (None allowed)."""

SORT_COLUMNS = {
    "answers": KEY_COLUMNS,
    "scores": KEY_COLUMNS + ["metric"],
    "probes": KEY_COLUMNS + ["probe_point", "source", "layer", "head", "metric"],
    "skipped": ["record_id", "selector", "budget"],
    "geometry": ["record_id", "selector", "budget", "step", "layer", "head", "metric"],
}
"""Each table's row identity: the deterministic sort order, and no two rows may share these values."""


LATER_COLUMNS: dict[str, object] = {"prefill_s": None, "selection_s": None, "batch_rows": 1,
                                     "first_token_eos_prob": None}
"""Columns added after the first schema, with what a table written before them implies: stage times unknown (NaN);
one row decoded at a time (batched rows came later); the first-token end-of-answer probability not recorded (NaN).
:func:`coerce_table` fills them in older tables."""


def coerce_table(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """The canonical dtypes of table ``name`` (the same for fresh, consolidated and re-loaded tables).

    Columns of :data:`LATER_COLUMNS` missing from a table written by an older relaylens get their implied value;
    any other missing column raises ``KeyError``.
    """
    out = {}
    for col in TABLES[name]:
        if col not in df.columns and col in LATER_COLUMNS:
            df = df.assign(**{col: LATER_COLUMNS[col]})
        kind, s = DTYPES[col], df[col]
        if kind == INT:
            out[col] = s.astype("int64")
        elif kind == FLOAT:
            out[col] = pd.to_numeric(s, errors="coerce").astype("float64")
        elif kind == BOOL:
            out[col] = s.astype(bool)
        else:
            out[col] = s.astype(object).where(s.notna(), None).astype("str")
    return pd.DataFrame(out, index=df.index)


def sort_table(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """Rows of table ``name`` in the deterministic order of :data:`SORT_COLUMNS`."""
    return df.sort_values(SORT_COLUMNS[name], kind="mergesort", na_position="first").reset_index(drop=True)


def get_table(tables: dict, name: str) -> pd.DataFrame:
    """``tables[name]``, or an empty table with the schema's columns when the run has none."""
    df = tables.get(name)
    if df is None:
        return pd.DataFrame({c: [] for c in TABLES[name]})
    return df


EXAMPLE_CONDITIONS = ("original", "relay", "half_gap", "key_only", "query_only(2048)", "rank_sync", "score_order",
                      "reverse_order", "random_order(0)", "random_order(1)", "random_order(2)")
EXAMPLE_REPLAY = ("original", "half_gap", "relay", "compaction(0)", "compaction(0.25)", "compaction(0.5)",
                  "compaction(0.75)", "compaction(1)")


def example_tables(records: int = 6, selectors: Sequence[str] = ("bm25", "snapkv"),
                   budgets: Sequence[float] = (0.1, 0.2),
                   conditions: Sequence[str] = EXAMPLE_CONDITIONS, replay: Sequence[str] = EXAMPLE_REPLAY,
                   layers: int = 6, heads: int = 2, probes: bool = True, teacher: bool = True,
                   seed: int = 0) -> dict[str, pd.DataFrame]:
    """Fabricated ``answers`` / ``scores`` / ``probes`` tables of this schema (seeded; for examples and tests).

    Every (record, selector, budget) has every condition; scores carry ``contains``, ``f1`` and ``exact_match``;
    probes carry forward readouts (``evidence_share``, ``history_share``, ``evidence_value_norm``) at the final
    question token (and the first answer token with ``teacher``) plus ``replay_gold_share`` for ``replay``.
    """
    rng = np.random.default_rng(seed)
    qtypes = ("single-session-user", "multi-session", "temporal-reasoning")
    answers, scores, rows = [], [], []
    for r in range(records):
        for sel in selectors:
            for budget in budgets:
                key = dict(record_id=f"r{r}", selector=sel, budget=float(budget))
                common = dict(question_type=qtypes[r % 3], is_abstention=False, cluster_id=None)
                total = int(rng.integers(1, 4))
                kept = int(rng.integers(0, total + 1))
                for ci, cond in enumerate(conditions):
                    ok = bool(rng.random() < 0.25 + 0.05 * ci)
                    answers.append(key | common | dict(
                        condition=cond, prompt_mode="completion", answer="the harp <b>&" if ok else "no idea",
                        stop_reason="newline", hit_limit=False, new_tokens=int(rng.integers(1, 20)),
                        history_length=400, max_count=40, mean_count=40.0, question_start=400,
                        gold_units_total=total, gold_units_kept=kept, references=json.dumps(["harp"]),
                        elapsed_s=float(rng.uniform(0.1, 1.0)), prefill_s=float(rng.uniform(1.0, 2.0)),
                        selection_s=0.05, batch_rows=1,
                        first_token_eos_prob=0.05 + 0.02 * ci if ok else 0.4 + 0.02 * ci))  # no draw: stream kept
                    for metric in ("contains", "f1", "exact_match"):
                        value = float(ok) if metric != "f1" else float(ok) * float(rng.uniform(0.3, 1.0))
                        scores.append(key | common | dict(condition=cond, metric=metric, value=value))
                    if not probes:
                        continue
                    for point in ("question_final", "first_answer_token") if teacher else ("question_final",):
                        for layer in range(layers):
                            for head in range(heads):
                                for metric in ("evidence_share", "history_share", "evidence_value_norm"):
                                    rows.append(key | dict(condition=cond, probe_point=point, source="forward",
                                                           layer=layer, head=head, metric=metric,
                                                           value=float(rng.uniform(0, 0.5 + 0.05 * ci))))
                for cond in replay if probes else ():
                    for layer in range(layers):
                        for head in range(heads):
                            rows.append(key | dict(condition=cond, probe_point="question_final", source="replay",
                                                   layer=layer, head=head, metric="replay_gold_share",
                                                   value=float(rng.uniform(0, 1))))
    return {"answers": pd.DataFrame(answers, columns=TABLES["answers"]),
            "scores": pd.DataFrame(scores, columns=TABLES["scores"]),
            "probes": pd.DataFrame(rows, columns=TABLES["probes"])}


KEEP_MARK = "@keep="
"""Separates a selector from its framing cell in a unit's ``selector`` label (the ``framing`` analysis)."""


def unit_labels(selectors: Sequence[str], framing_cells: Sequence[str] = ()) -> list[str]:
    """The ``selector`` labels of a spec's units: the selectors, or ``NAME@keep=CELL`` per framing cell (the one rule
    of :meth:`relaylens.experiments.specs.ExperimentSpec.unit_selectors` and of the plans read from manifests).

    >>> unit_labels(["bm25"], ["none", "sink4"]), unit_labels(["snapkv"])
    (['bm25@keep=none', 'bm25@keep=sink4'], ['snapkv'])
    """
    if not framing_cells:
        return [str(name) for name in selectors]
    return [f"{name}{KEEP_MARK}{cell}" for name in selectors for cell in framing_cells]


def split_unit_label(label: str) -> tuple[str, str | None]:
    """``(selector, framing cell or None)`` of a unit's selector label.

    >>> split_unit_label("bm25@keep=sink4"), split_unit_label("snapkv")
    (('bm25', 'sink4'), ('snapkv', None))
    """
    name, mark, cell = label.partition(KEEP_MARK)
    return (name, cell) if mark else (label, None)
