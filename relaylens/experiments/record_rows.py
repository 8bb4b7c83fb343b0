"""One record's rows decoded and tabulated: the decode corridor every runner enters once per record.

:func:`process_record` takes a record made ready by the walk (:class:`relaylens.experiments.walk.RecordWork`: prompt,
prefill, selected units) and the run's conditions (parsed once per run, the ``conditions`` of
:class:`relaylens.experiments.walk.RunWalk`), decodes every row (unit x condition) in batches of
``config.batch_rows`` rows (:mod:`relaylens.generation.rows`, or :func:`relaylens.probes.readouts.probe_rows` when
the spec's probes run), and yields each unit's ``answers``,
``scores`` and ``probes`` rows (plus its token view) as soon as its rows are done, with what every enabled probe kind
adds (:mod:`relaylens.probes.registry`). The analysis runner commits them; the learned-geometry runner adds its own
scores first.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import torch

from relaylens.experiments.units import UnitWork
from relaylens.experiments.walk import RecordWork, RunWalk, answer_tokens
from relaylens.generation.rows import Row, default_eos_ids, run_rows
from relaylens.probes.readouts import probe_rows
from relaylens.probes.registry import UnitContext, run_probes
from relaylens.scoring.metrics import score_answer

__all__ = ["first_token_end_probability", "process_record"]


def first_token_end_probability(last_logits: torch.Tensor, end_ids: list[int]) -> float:
    """The probability the final question token gives the end-of-answer tokens (EOS / end of turn) as the first
    answer token: an answer that is empty before it starts. NaN when the model has no such token.

    >>> round(first_token_end_probability(torch.zeros(3), [2]), 4), first_token_end_probability(torch.zeros(3), [])
    (0.3333, nan)
    """
    if not end_ids:
        return float("nan")
    probs = torch.softmax(last_logits.detach().double(), dim=-1)  # [vocab]
    return float(probs[[i for i in end_ids if 0 <= i < probs.numel()]].sum())


def _gold_units(prompt, selection, granularity: str) -> tuple[int, int]:
    units = [u for u in prompt.units(granularity) if u.is_evidence]
    kept = selection.positions[selection.valid]
    kept_set = torch.zeros(prompt.history_length, dtype=torch.bool)
    kept_set[kept] = True
    return len(units), sum(bool(kept_set[u.start : u.end].any()) for u in units)


def process_record(walk: RunWalk, work: RecordWork, judge=None, views: bool = False):
    """Every row (unit x condition) of one record made ready by ``walk`` (``work``: prompt, prefill, selected units),
    under the walk's conditions (parsed once per run), decoded in batches of ``config.batch_rows`` rows (None: all).

    Yields ``(unit, answers, scores, probes, view)`` per unit, in order, as soon as all its rows are done (``view``:
    the unit's token view when ``views`` and probes ran, else None). Attribution probes (``spec.attribution``) need
    autograd: the batch decodes without it, and each row's question pass and teacher-forced token run once more on
    their own with autograd (:func:`relaylens.probes.readouts.probe_rows` with ``grad=True``; no decoding under
    autograd).
    """
    model, tokenizer, factors, spec, config = walk.model, walk.tokenizer, walk.factors, walk.spec, walk.config
    record, prompt, prefill, prefill_s = work.record, work.prompt, work.prefill, work.prefill_s
    conditions = walk.conditions
    evidence = prompt.evidence_mask(spec.granularity)
    do_probes = spec.probes and bool(evidence.any())
    answer_ids = answer_tokens(tokenizer, record, spec.prompt_mode)
    teacher = answer_ids[0] if spec.teacher_forcing and answer_ids else None
    attribution = dict(grad=True, next_answer_token=answer_ids[1] if len(answer_ids) > 1 else None) \
        if spec.attribution and teacher is not None else {}
    common = dict(settings=walk.decode_settings)
    shared = dict(model=model, tokenizer=tokenizer, record=record, prompt=prompt, prefill=prefill, evidence=evidence,
                  spec=spec, config=config, factors=factors, answer_ids=tuple(answer_ids), views=views)  # every unit's
    units = list(work.units)
    rows = [(unit, condition) for unit in units for condition in conditions]
    size = config.batch_rows or max(len(rows), 1)  # no rows: nothing to run
    outcomes: list[tuple] = []  # per row, in order: (generation, probed or None, elapsed_s, rows in its batch)
    width = len(conditions)
    for first in range(0, len(rows), size):
        chunk = rows[first : first + size]
        started = time.perf_counter()
        if do_probes:  # attribution: grad=True, a row's autograd question pass on its own after the batch decodes
            probed = probe_rows(model, prefill, [(unit.selection, condition) for unit, condition in chunk],
                                prompt.question_ids, evidence, teacher_token=teacher, **attribution, **common)
            results = [(p.generation, p) for p in probed]
        else:
            generations = run_rows(model, prefill, [Row(unit.selection, condition) for unit, condition in chunk],
                                   prompt.question_ids, **common)
            results = [(g, None) for g in generations]
        elapsed = (time.perf_counter() - started) / len(chunk)
        outcomes.extend((generation, probed, elapsed, len(chunk)) for generation, probed in results)
        while len(outcomes) >= width:  # a unit's rows are consecutive: commit each unit as soon as it is complete
            mine, outcomes = outcomes[:width], outcomes[width:]
            unit = units.pop(0)
            key = {"record_id": record.record_id, "selector": unit.selector, "budget": float(unit.budget)}
            context = UnitContext(key=key, selection=unit.selection, **shared,
                                  probed={g.condition: p for g, p, _, _ in mine if p is not None})
            yield (unit, *_unit_tables(context, unit, mine, prefill_s, judge))


def _unit_tables(context: UnitContext, unit: UnitWork, outcomes: list, prefill_s: float, judge) -> tuple:
    """The answers, scores and probes rows of one unit from its conditions' outcomes, plus what every enabled probe
    kind adds (:mod:`relaylens.probes.registry`: replay, sensitivity, layer sweep, token view)."""
    record, prompt, selection, spec, key = context.record, context.prompt, context.selection, context.spec, context.key
    gold_total, gold_kept = _gold_units(prompt, selection, spec.granularity)
    meta = {"question_type": record.question_type, "is_abstention": bool(record.is_abstention),
            "cluster_id": record.cluster_id or record.record_id}
    answers, scores, probe_frames, view = [], [], [], None
    end_ids = sorted(default_eos_ids(context.model, context.tokenizer))  # ends an answer, whatever the run's --stop
    for generation, probed, elapsed, batch_rows in outcomes:
        label = generation.condition
        if probed is not None:
            probe_frames.append(probed.readouts.assign(condition=label, source="forward"))
        answers.append({
            **key, "condition": label, **meta, "prompt_mode": spec.prompt_mode, "answer": generation.text,
            "stop_reason": generation.stop_reason, "hit_limit": generation.hit_limit,
            "new_tokens": len(generation.token_ids), "history_length": prompt.history_length,
            "max_count": selection.max_count, "mean_count": float(selection.counts.float().mean()),
            "question_start": generation.question_start, "gold_units_total": gold_total, "gold_units_kept": gold_kept,
            "references": json.dumps(list(record.answers)), "elapsed_s": elapsed, "prefill_s": prefill_s,
            "selection_s": unit.selection_s, "batch_rows": batch_rows,
            "first_token_eos_prob": first_token_end_probability(generation.last_logits, end_ids),
        })
        metrics = score_answer(record, generation.text) if record.answers else {}  # summaries: judged only
        if judge is not None:  # blinded: the judge sees question, references and answer, never selector or condition
            metrics.update(judge.judge(record, generation.text).scores())
        for metric, value in metrics.items():
            scores.append({**key, "condition": label, **meta, "metric": metric, "value": float(value)})
    for tables in run_probes(context):  # in registry order: the tables' row order
        probe_frames.extend(tables.probes)
        scores.extend({**key, "condition": row["condition"], **meta, "metric": row["metric"], "value": row["value"]}
                      for row in tables.scores)
        view = tables.view if tables.view is not None else view
    probes = pd.concat(probe_frames, ignore_index=True).assign(**key) if probe_frames else pd.DataFrame()
    return answers, scores, probes, view
