"""Experiment runner: records x selectors x budgets x conditions, paired, resumable, with a progress bar.

For each record: render the prompt, prefill the history once, then for each (selector, budget) select once; the rows
(selector x budget x condition) of the record then run in batches of ``batch_rows`` rows (default: all of them in one
batch; ``1``: one row at a time) sharing the prefill (question pass with probes, greedy generation, scoring; see
:mod:`relaylens.generation.rows`). One (record, selector, budget) is one unit of work, committed atomically to the
run directory; re-running the same command skips committed units, so a killed run resumes where it stopped. After a
unit's rows, every probe kind its spec enables adds its rows (:mod:`relaylens.probes.registry`); the run is opened
by the one recipe every runner shares (:mod:`relaylens.experiments.run_setup`).

Example (the CLI: ``relaylens run coordinate_ablation --limit 4 --out runs/ablation``; from Python):
    >>> from relaylens.experiments.specs import load_analysis
    >>> config = RunConfig(limit=4, out="runs/ablation")
    >>> run_analysis(load_analysis("coordinate_ablation").spec, config)  # doctest: +SKIP
    PosixPath('runs/ablation')
    >>> config.model, config.data, config.chunk_size
    ('smollm2-135m-instruct', 'sample', 2048)
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pandas as pd
import torch

from relaylens import moved_name
from relaylens.conditions.scoped import expand_conditions, unit_position_problem
from relaylens.datasets import Record
from relaylens.datasets.prompting import render_prompt
from relaylens.errors import RelaylensError, shown
from relaylens.experiments.config import RunConfig, check_config
from relaylens.experiments.run_setup import analysis_plan, open_run
from relaylens.experiments.specs import ExperimentSpec
from relaylens.experiments.units import UnitWork, prefill_record, query_window, select_units, selector_objects
from relaylens.generation.rows import Row, default_eos_ids, run_rows
from relaylens.model.tokens import encode_data_text
from relaylens.probes.readouts import probe_rows
from relaylens.probes.registry import UnitContext, run_probes
from relaylens.progress import progress_view
from relaylens.results.atomic import read_text, write_atomic
from relaylens.results.store import UnitKey
from relaylens.results.tables import split_unit_label
from relaylens.results.views import has_view, write_view
from relaylens.scoring.metrics import score_answer


def first_answer_token(tokenizer, record: Record, mode: str) -> int | None:
    """The first token of the first reference answer as it would follow the answer cue."""
    ids = answer_tokens(tokenizer, record, mode)
    return ids[0] if ids else None


def answer_tokens(tokenizer, record: Record, mode: str) -> list[int]:
    """The tokens of the first reference answer as they would follow the answer cue (empty for abstentions)."""
    if not record.answers or record.is_abstention:
        return []
    prefix = " " if mode == "completion" else ""
    ids, _ = encode_data_text(tokenizer, prefix + record.answers[0])  # special-token strings in data stay text
    return [int(i) for i in ids]


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


def process_record(model, tokenizer, factors, record: Record, prompt, prefill, prefill_s: float, units: list[UnitWork],
                   spec: ExperimentSpec, config: RunConfig, judge=None, views: bool = False):
    """Every row (unit x condition) of one record, decoded in batches of ``config.batch_rows`` rows (None: all).

    Yields ``(unit, answers, scores, probes, view)`` per unit, in order, as soon as all its rows are done (``view``:
    the unit's token view when ``views`` and probes ran, else None). Attribution probes (``spec.attribution``) need
    autograd: the batch decodes without it, and each row's question pass and teacher-forced token run once more on
    their own with autograd (:func:`relaylens.probes.readouts.probe_rows` with ``grad=True``; no decoding under
    autograd).
    """
    evidence = prompt.evidence_mask(spec.granularity)
    do_probes = spec.probes and bool(evidence.any())
    answer_ids = answer_tokens(tokenizer, record, spec.prompt_mode)
    teacher = answer_ids[0] if spec.teacher_forcing and answer_ids else None
    attribution = dict(grad=True, next_answer_token=answer_ids[1] if len(answer_ids) > 1 else None) \
        if spec.attribution and teacher is not None else {}
    common = dict(max_new_tokens=spec.max_new_tokens, tokenizer=tokenizer,
                  stop_at_newline=spec.stops_at_newline(spec.prompt_mode), window_mode=config.window_mode,
                  factors=factors, eos_token_ids=set() if spec.stop == "none" else None)
    shared = dict(model=model, tokenizer=tokenizer, record=record, prompt=prompt, prefill=prefill, evidence=evidence,
                  spec=spec, config=config, factors=factors, answer_ids=tuple(answer_ids), views=views)  # every unit's
    units = list(units)
    conditions = expand_conditions(spec.conditions, model)  # scoped conditions learn the model's layer types
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


def run_analysis(spec: ExperimentSpec, config: RunConfig, progress: bool = True, model_and_tokenizer=None) -> Path:
    """Run (or resume) ``spec`` under ``config``; returns the run directory with consolidated tables.

    Records that cannot run (history over ``max_history_tokens`` or the rotary range, or too short for a selector's
    window or budget) are committed as ``skipped`` rows naming the record and the reason; the run goes on.
    """
    check_config(config)
    opened = open_run(spec, config, model_and_tokenizer)
    opened = opened.with_manifest(analysis_plan(opened))  # learned:RUN_DIR conditions pinned by content
    with opened.session() as session:
        _run_units(opened.model, opened.tokenizer, opened.factors, opened.records, opened.spec, config, session.store,
                   session.judge, progress)
        session.store.consolidate()
    return opened.out


def _run_units(model, tokenizer, factors, records, spec: ExperimentSpec, config: RunConfig, store, judge,
               progress: bool) -> None:
    selectors = selector_objects(spec, config.seed)
    reuse = PrefillReuse(prefill_reuse_enabled())  # records over one history (LoCoMo questions) prefill it once
    units = spec.units([r.record_id for r in records])
    bar = progress_bar(progress)
    labels = spec.unit_selectors()
    per_record = len(labels) * len(spec.budgets)
    with bar as live:
        task = live.add_task(f"{spec.name}", total=len(units), stage="loading") if live else None
        for order, record in enumerate(records):
            keys = [UnitKey(record.record_id, name, b) for name in labels for b in spec.budgets]
            if config.retry_skipped:
                _forget_skipped(store, keys)
            pending = [(k.selector, k.budget) for k in keys if not store.is_done(k)]
            redo = _missing_views(store, keys) if order < config.view_records else []  # committed, view lost
            if not pending and not redo:
                advance_bar(live, task, per_record, record.record_id, "done earlier")
                continue
            with _naming_record(record.record_id):  # an error of this record names it
                advance_bar(live, task, per_record - len(pending), record.record_id, "prefill")
                prompt = render_prompt(record, tokenizer, mode=spec.prompt_mode)
                reason = history_problem(prompt, spec, config, factors)
                if reason is not None and not pending:
                    continue  # only views to write again, and the record no longer fits (--force with other settings)
                if reason is not None:
                    for name, budget in pending:
                        skip_unit(store, record.record_id, name, budget, prompt.history_length, *reason)
                    advance_bar(live, task, len(pending), record.record_id, f"skipped ({reason[0]})")
                    continue
                started = time.perf_counter()
                prefill = reuse.prefill(model, prompt, config, selectors.values())
                bases = dict.fromkeys(split_unit_label(name)[0] for name, _ in pending + redo)
                prepared = {name: selectors[name].prepare(model, prefill, prompt, factors)  # FINCH: its question pass
                            for name in bases}
                prefill_s = time.perf_counter() - started
                advance_bar(live, task, 0, record.record_id, f"selecting {len(pending)} units")
                units, too_short = select_units(prefill, prompt, pending + redo, prepared, spec.protect_instructions)
                too_short = [t for t in too_short if t[:2] not in redo]
                for name, budget, err in too_short:
                    skip_unit(store, record.record_id, name, budget, prompt.history_length, "too_short",
                              f"record {record.record_id}: {name} @ {budget:g}: {err}")
                    advance_bar(live, task, 1, record.record_id, "skipped (too_short)")
                units = _skip_unplaceable(store, record, prompt, units, redo, spec, model, factors, live, task)
                advance_bar(live, task, 0, record.record_id, f"decoding {len(units) * len(spec.conditions)} rows")
                for unit, answers, scores, probes, view in process_record(
                        model, tokenizer, factors, record, prompt, prefill, prefill_s, units, spec, config, judge,
                        views=order < config.view_records):
                    again = (unit.selector, unit.budget) in redo  # committed earlier: only its view is written
                    if not again:
                        store.write_unit(UnitKey(record.record_id, unit.selector, unit.budget), answers, scores, probes)
                    if view is not None:  # after the commit: a failed unit leaves no view behind (reliability suite)
                        write_view(store.run_dir, view | {"order": order})
                    if not again:
                        advance_bar(live, task, 1, record.record_id, "committed")
    reuse.finish(store.run_dir, progress)


@contextmanager
def _naming_record(record_id: str):
    """Re-raise a relaylens error of one record with the record's id in front (unless the message names it)."""
    try:
        yield
    except RelaylensError as err:
        if record_id in str(err):
            raise
        raise type(err)(f"record {record_id}: {err}") from err


def history_problem(prompt, spec: ExperimentSpec, config: RunConfig, factors) -> tuple[str, str] | None:
    """``(reason, detail)`` when a record cannot run at all, else None.

    * ``too_long``: the history exceeds ``config.max_history_tokens``, or the positions the run needs (history, the
      largest condition shift, question, teacher token and ``max_new_tokens``) pass the model's rotary range.
    * ``too_short``: the history is not longer than the observation window the prefill captures.
    """
    L, rid = prompt.history_length, prompt.record_id
    if config.max_history_tokens is not None and L > config.max_history_tokens:
        return "too_long", (f"record {rid}: history of {L} tokens exceeds --max-history-tokens "
                            f"{config.max_history_tokens}")
    needed = L + spec.max_shift + int(prompt.question_ids.numel()) + max(spec.max_new_tokens, 1) + 1
    if needed > factors.position_limit:
        limit = (f"max_position_embeddings={factors.max_position}" if factors.position_limit == factors.max_position
                 else "of 2**24 positions (float32 phases cannot tell larger positions apart)")
        return "too_long", (f"record {rid}: history of {L} tokens needs positions up to {needed - 1} (largest "
                            f"condition shift {spec.max_shift}, question and {spec.max_new_tokens} new tokens), "
                            f"past the model's rotary range {limit}")
    if L <= config.window_size:
        return "too_short", (f"record {rid}: history of {L} tokens is not longer than the {config.window_size}-token "
                             "observation window")
    return None


def _skip_unplaceable(store, record, prompt, units, redo, spec: ExperimentSpec, model, factors, live, task) -> list:
    """The units every condition can place; the others are committed as skipped (``too_long``: a question start
    past the rotary range, e.g. a large ``geometry`` b; ``position``: a ``move=`` past the question), as
    :func:`history_problem` skips a ``query_only`` shift past the range (issue 41, item 13)."""
    conditions = expand_conditions(spec.conditions, model)
    tail = int(prompt.question_ids.numel()) + max(spec.max_new_tokens, 1) + 1
    kept = []
    for unit in units:
        problem = unit_position_problem(conditions, unit.selection, tail, factors.position_limit)
        if problem is None:
            kept.append(unit)
            continue
        if (unit.selector, unit.budget) in redo:  # committed earlier (only its view was due): left as it is
            continue
        skip_unit(store, record.record_id, unit.selector, unit.budget, prompt.history_length, problem[0],
                  f"record {record.record_id}: {unit.selector} @ {unit.budget:g}: {problem[1]}")
        advance_bar(live, task, 1, record.record_id, f"skipped ({problem[0]})")
    return kept


def skip_unit(store, record_id: str, selector: str, budget: float, history_length: int, reason: str,
              detail: str) -> None:
    row = {"record_id": record_id, "selector": selector, "budget": float(budget), "reason": reason,
           "history_length": int(history_length), "detail": detail}
    store.write_unit(UnitKey(record_id, selector, budget), [], [], [], skipped_rows=[row])


def _forget_skipped(store, keys) -> None:
    """Delete committed units that only record a skip, so they run again (``--retry-skipped``)."""
    for key in keys:
        path = store.unit_path(key)
        if path.exists() and len(store.read_unit(path)["skipped"]):
            store.remove_unit(key)


def _missing_views(store, keys) -> list[tuple[str, float]]:
    """``(selector, budget)`` of the committed units whose probes ran (a token view was due) but whose view is
    missing or damaged (a write that failed after the commit): the resumed run computes them again for the view
    only."""
    missing = []
    for key in keys:
        if store.is_done(key) and not has_view(store.run_dir, key):
            probes = store.load_unit(store.unit_path(key))["probes"]
            if "forward" in probes["source"]:
                missing.append((key.selector, key.budget))
    return missing


def progress_bar(enabled: bool):
    if not enabled or _jupyter_without_widgets():
        return nullcontext(None)  # in Jupyter without ipywidgets rich would warn once per refresh: no bar instead
    return progress_view()


def _jupyter_without_widgets() -> bool:
    """True inside a Jupyter kernel where ipywidgets cannot be imported (rich's live display needs it there)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        import ipywidgets  # noqa: F401, PLC0415 - lazy on purpose: an optional package, probed only inside Jupyter
    except ImportError:
        return True
    return False


def advance_bar(live, task, steps: int, record_id: str, stage: str) -> None:
    if live is not None:  # a record id is dataset text: shown, never interpreted by the terminal
        live.update(task, advance=steps, stage=f"{shown(record_id)}: {stage}")


PREFILL_REUSE_FILE = "prefill_reuse.json"
"""The run directory's record of history prefills reused (summed over the invocations that reused one)."""


def prefill_reuse_enabled() -> bool:
    """Whether a run reuses a history's prefill for the next record with the same history tokens: yes, unless
    ``RELAYLENS_NO_PREFILL_REUSE`` is set to anything but ``0`` (then every record prefills its own history)."""
    return os.environ.get("RELAYLENS_NO_PREFILL_REUSE", "0") in ("", "0")


class PrefillReuse:
    """The last history prefill of a run, reused by the next record whose rendered history tokens are identical
    (questions over one conversation, e.g. LoCoMo's; the records of a conversation are consecutive in the file).

    The prefill depends on the history tokens only (its window queries are the history's last tokens; the window
    and column sums follow from the run's selectors and the history length, both part of the key); what depends on
    the question (FINCH's ``prepare``, the selection, every condition's question pass) still runs per record. The
    reused :class:`~relaylens.model.prefill.PrefillResult` is shared read-only, as every unit and condition of one
    record already shares it: relocation and selection build new tensors and never write into it (a test checks
    this). ``prefills`` / ``reused`` count the prefills computed and reused; ``saved_s`` sums the prefill seconds
    each reuse did not spend (the reused prefill's own time). A record that reuses a prefill reports in its
    ``prefill_s`` column only the time it spent itself (FINCH's question pass, when the run has FINCH). Only the last
    history is kept, so a resumed run or a shard prefills the first history it meets again.

    Example:
        >>> reuse = PrefillReuse(enabled=False)
        >>> reuse.prefills, reuse.reused, reuse.saved_s
        (0, 0, 0.0)
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.prefills, self.reused, self.saved_s = 0, 0, 0.0
        self._last = None  # (history_ids [L], (window, column sums), PrefillResult, its prefill seconds)

    def prefill(self, model, prompt, config: RunConfig, selectors):
        """The prefill of ``prompt``'s history: the last one when its history tokens and capture settings match, else
        :func:`~relaylens.experiments.units.prefill_record`."""
        selectors = list(selectors)
        key = (query_window(config, selectors, prompt.history_length),
               any(getattr(s, "needs_column_sums", False) for s in selectors))
        last = self._last
        if last is not None and last[1] == key and torch.equal(last[0], prompt.history_ids):
            self.reused += 1
            self.saved_s += last[3]
            return last[2]
        self._last = None  # the previous history's states are released before the next prefill
        started = time.perf_counter()
        prefill = prefill_record(model, prompt, config, selectors)
        self.prefills += 1
        if self.enabled:
            self._last = (prompt.history_ids.clone(), key, prefill, time.perf_counter() - started)
        return prefill

    def finish(self, run_dir: Path, say: bool = True) -> dict | None:
        """Add this invocation's counts to ``RUN_DIR/prefill_reuse.json`` (written once a prefill was reused) and
        print them when ``say``; returns the run's totals, or None when nothing was reused."""
        path = Path(run_dir) / PREFILL_REUSE_FILE
        if not self.reused and not path.exists():
            return None
        try:
            totals = json.loads(read_text(path) or "{}")  # no link followed (relaylens.fileio)
        except ValueError:
            totals = {}  # a damaged note is started afresh: it carries timing only, never results
        totals = {"prefills": int(totals.get("prefills", 0)) + self.prefills,
                  "reused": int(totals.get("reused", 0)) + self.reused,
                  "saved_s": round(float(totals.get("saved_s", 0.0)) + self.saved_s, 3)}
        write_atomic(path, json.dumps(totals, indent=2, sort_keys=True) + "\n")  # whole, no link followed
        if say and self.reused:
            print(f"history prefill reused for {self.reused} record(s) sharing a history ({self.prefills} computed); "
                  f"{self.saved_s:.1f} s of prefill saved (run total {totals['saved_s']:.1f} s, {PREFILL_REUSE_FILE})",
                  file=sys.stderr)
        return totals


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
