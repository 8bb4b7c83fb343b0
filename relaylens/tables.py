"""Schemas of the consolidated result tables (long format, one parquet file each in a run directory).

Every row of every table carries the paired-comparison key ``(record_id, selector, budget, condition)``; all
conditions of one (record, selector, budget) share one prefill and one selection.

``answers`` — one row per key:

| column | type | meaning |
|---|---|---|
| record_id, selector, budget, condition | str, str, float, str | the key (``budget``: retention ratio, or states when > 1) |
| question_type, is_abstention, cluster_id | str, bool, str | from the record (cluster: bootstrap unit) |
| prompt_mode | str | ``chat`` / ``completion`` |
| answer | str | decoded greedy answer |
| stop_reason, hit_limit | str, bool | ``eos`` / ``newline`` / ``limit``; whether ``max_new_tokens`` cut the answer |
| new_tokens | int | generated tokens |
| history_length, max_count, mean_count | int, int, float | ``L``, ``M``, mean kept states per (layer, kv_head) |
| question_start | int | first question position under the condition |
| gold_units_total, gold_units_kept | int, int | gold units of the record, and those with at least one retained token |
| references | str | JSON list of reference answers |
| elapsed_s | float | question pass + decoding of this row (a batch's wall time split evenly over its rows) |
| prefill_s, selection_s | float | the record's history prefill, and this unit's selection (shared by its conditions) |
| batch_rows | int | rows decoded together with this one (``--batch-rows``; 1: sequential, complete-request timing) |

Timing columns (``elapsed_s``, ``prefill_s``, ``selection_s``, ``batch_rows``) are excluded from determinism checks;
a complete request is ``prefill_s + selection_s + elapsed_s`` of a ``batch_rows == 1`` row.

``scores`` — one row per (key, metric): columns ``record_id, selector, budget, condition, question_type,
is_abstention, cluster_id, metric, value``; metrics ``exact_match``, ``f1``, ``contains``, ``choice_accuracy``,
``abstention``, ``judge`` (``value`` NaN with ``judge_failed`` when a judge verdict is not valid JSON).

``probes`` — one row per (key, probe point, layer, head, metric): columns ``record_id, selector, budget,
condition, probe_point, source, layer, head, metric, value``; ``probe_point`` is ``question_final`` or
``first_answer_token``; ``source`` is ``forward`` (readouts of the real pass) or ``replay`` (phase replay).
With ``attribution`` (the ``evidence_reading`` analysis) the forward readouts add ``evidence_grad_x_input``,
``history_grad_x_input``, ``evidence_grad_x_input_share``, ``evidence_logit_contribution`` and
``history_logit_contribution`` (:mod:`relaylens.attribution`).

``skipped`` — one row per (record, selector, budget) unit that was not run: columns ``record_id, selector, budget,
reason, history_length, detail``; ``reason`` is ``too_long`` (history over ``--max-history-tokens`` or the rotary
range), ``too_short`` (history or budget smaller than a selector's observation window, or a budget that keeps no
state); ``detail`` is the full one-line explanation. A skipped unit is committed like any other, so a resumed run
does not retry it silently (``--retry-skipped`` does, on purpose).
"""

from __future__ import annotations

KEY_COLUMNS = ["record_id", "selector", "budget", "condition"]
TIMING_COLUMNS = ["elapsed_s", "prefill_s", "selection_s", "batch_rows"]

ANSWER_COLUMNS = KEY_COLUMNS + [
    "question_type", "is_abstention", "cluster_id", "prompt_mode", "answer", "stop_reason", "hit_limit", "new_tokens",
    "history_length", "max_count", "mean_count", "question_start", "gold_units_total", "gold_units_kept", "references",
    "elapsed_s", "prefill_s", "selection_s", "batch_rows",
]
SCORE_COLUMNS = KEY_COLUMNS + ["question_type", "is_abstention", "cluster_id", "metric", "value"]
PROBE_COLUMNS = KEY_COLUMNS + ["probe_point", "source", "layer", "head", "metric", "value"]
SKIPPED_COLUMNS = ["record_id", "selector", "budget", "reason", "history_length", "detail"]
TABLES = {"answers": ANSWER_COLUMNS, "scores": SCORE_COLUMNS, "probes": PROBE_COLUMNS, "skipped": SKIPPED_COLUMNS}
OPTIONAL_TABLES = ("skipped",)
"""Tables that unit files written before they existed may lack (read as empty)."""
