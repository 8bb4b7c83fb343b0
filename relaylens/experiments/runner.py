"""Experiment runner: records x selectors x budgets x conditions, paired, resumable, with a progress bar.

For each record: render the prompt, prefill the history once, then for each (selector, budget) select once; the rows
(selector x budget x condition) of the record then run in batches of ``batch_rows`` rows (default: all of them in one
batch; ``1``: one row at a time) sharing the prefill (question pass with probes, greedy generation, scoring; see
:mod:`relaylens.generation.rows`). One (record, selector, budget) is one unit of work, committed atomically to the run directory; re-running the same command skips committed
units, so a killed run resumes where it stopped.

Example (the CLI: ``relaylens run coordinate_ablation --limit 4 --out runs/ablation``; from Python):
    >>> from relaylens.experiments.specs import load_analysis
    >>> config = RunConfig(limit=4, out="runs/ablation")
    >>> run_analysis(load_analysis("coordinate_ablation").SPEC, config)  # doctest: +SKIP
    PosixPath('runs/ablation')
    >>> config.model, config.data, config.chunk_size
    ('smollm2-135m-instruct', 'sample', 2048)
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from relaylens.errors import BudgetError, RelaylensError, TooShortError, shown
from relaylens.datasets import SAMPLE, resolve_data
from relaylens.experiments.config import RunConfig, check_config
from relaylens.experiments.judges import make_judge
from relaylens.experiments.specs import ExperimentSpec, split_unit_selector
from relaylens.datasets.records import Record
from relaylens.generation.rows import default_eos_ids


def first_answer_token(tokenizer, record: Record, mode: str) -> int | None:
    """The first token of the first reference answer as it would follow the answer cue."""
    ids = answer_tokens(tokenizer, record, mode)
    return ids[0] if ids else None


def answer_tokens(tokenizer, record: Record, mode: str) -> list[int]:
    """The tokens of the first reference answer as they would follow the answer cue (empty for abstentions)."""
    if not record.answers or record.is_abstention:
        return []
    prefix = " " if mode == "completion" else ""
    from relaylens.datasets.prompting import encode_data_text

    ids, _ = encode_data_text(tokenizer, prefix + record.answers[0])  # special-token strings in data stay text
    return [int(i) for i in ids]


def selector_objects(spec: ExperimentSpec, seed: int) -> dict:
    import dataclasses

    from relaylens.selectors import make_selector, selector_class

    objects = {}
    for name in spec.selectors:
        options = dict(spec.selector_options.get(name, {}))
        cls_fields = {f.name for f in dataclasses.fields(selector_class(name))}
        if "seed" in cls_fields:
            options.setdefault("seed", seed)
        objects[name] = make_selector(name, **options)
    return objects


def query_window(config: RunConfig, selectors, history_length: int) -> int:
    """Window queries the prefill captures: ``config.window_size``, or more when a selector votes with a longer
    window of history queries (Scissorhands' ``query_window``), capped at the history length."""
    extra = max([getattr(s, "query_window", 0) for s in selectors] + [0])
    return max(config.window_size, min(extra, history_length))


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


@dataclass
class UnitWork:
    """One (record, selector, budget) of a record: its selection and how long selecting took."""

    selector: str
    budget: float
    selection: object  # relaylens.geometry.selection.Selection
    selection_s: float


def select_units(prefill, prompt, pending: list[tuple[str, float]], selectors: dict,
                 protect: bool = False) -> tuple[list[UnitWork], list]:
    """Select once per pending (selector, budget); every condition of that unit shares the selection.

    ``selectors``: selector name -> the object whose ``select`` runs (prepared for this record). ``protect``: keep
    the instruction and template states outside the budget (:func:`relaylens.selectors.protection.select_protected`).
    Returns the units and ``(selector, budget, error)`` for budgets the record's history is too short for.
    ``kvpress:`` units share their history passes (:func:`relaylens.selectors.kvpress_pass.share_press_passes`);
    each one's ``selection_s`` carries an equal share of the shared passes' time.
    """
    from relaylens.selectors.kvpress_pass import share_press_passes
    from relaylens.selectors.protection import framing_mask, select_protected

    shared_s, served = 0.0, set()
    cells = any(split_unit_selector(name)[1] is not None for name, _ in pending)
    if not protect and not cells:  # every kvpress unit of the record scored in one history pass per kernel
        _, shared_s, served = share_press_passes(selectors, prefill, pending)
    share = shared_s / max(1, sum(name in served for name, _ in pending))
    units, too_short = [], []
    for name, budget in pending:
        started = time.perf_counter()
        base, cell = split_unit_selector(name)
        try:
            if cell is not None:  # the framing analysis: the cell's kept set on top of the sessions' budget
                sessions = prompt.history_length - int(prompt.protected_mask().sum())
                selection = select_protected(selectors[base], prefill, prompt, budget, framing_mask(prompt, cell),
                                             source_length=sessions)
            elif protect:
                selection = select_protected(selectors[base], prefill, prompt, budget)
            else:
                selection = selectors[base].select(prefill, prompt, budget)
        except (BudgetError, TooShortError) as err:  # the budget or the history is too small for the selector
            too_short.append((name, budget, err))
            continue
        spent = time.perf_counter() - started + (share if name in served else 0.0)
        units.append(UnitWork(name, budget, selection, spent))
    return units, too_short


def process_record(model, tokenizer, factors, record: Record, prompt, prefill, prefill_s: float, units: list[UnitWork],
                   spec: ExperimentSpec, config: RunConfig, judge=None, views: bool = False):
    """Every row (unit x condition) of one record, decoded in batches of ``config.batch_rows`` rows (None: all).

    Yields ``(unit, answers, scores, probes, view)`` per unit, in order, as soon as all its rows are done (``view``:
    the unit's token view when ``views`` and probes ran, else None). Attribution probes (``spec.attribution``) need
    autograd and run one row at a time.
    """
    from relaylens.probes.readouts import probe_condition, probe_rows
    from relaylens.generation.rows import Row, run_rows
    from relaylens.conditions.scoped import expand_conditions

    evidence = prompt.evidence_mask(spec.granularity)
    do_probes = spec.probes and bool(evidence.any())
    answer_ids = answer_tokens(tokenizer, record, spec.prompt_mode)
    teacher = answer_ids[0] if spec.teacher_forcing and answer_ids else None
    attribution = dict(grad=True, next_answer_token=answer_ids[1] if len(answer_ids) > 1 else None) \
        if spec.attribution and teacher is not None else {}
    common = dict(max_new_tokens=spec.max_new_tokens, tokenizer=tokenizer, stop_at_newline=spec.stops_at_newline(spec.prompt_mode),
                  window_mode=config.window_mode, factors=factors, eos_token_ids=set() if spec.stop == "none" else None)
    units = list(units)
    conditions = expand_conditions(spec.conditions, model)  # scoped conditions learn the model's layer types
    rows = [(unit, condition) for unit in units for condition in conditions]
    size = 1 if attribution and do_probes else (config.batch_rows or max(len(rows), 1))  # no rows: nothing to run
    outcomes: list[tuple] = []  # per row, in order: (generation, probed or None, elapsed_s, rows in its batch)
    width = len(conditions)
    for first in range(0, len(rows), size):
        chunk = rows[first : first + size]
        started = time.perf_counter()
        if do_probes and attribution:
            (unit, condition), = chunk
            probed = [probe_condition(model, prefill, unit.selection, condition, prompt.question_ids, evidence,
                                      teacher_token=teacher, **attribution, **common)]
            results = [(p.generation, p) for p in probed]
        elif do_probes:
            probed = probe_rows(model, prefill, [(unit.selection, condition) for unit, condition in chunk],
                                prompt.question_ids, evidence, teacher_token=teacher, **common)
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
            yield (unit, *_unit_tables(model, tokenizer, record, prompt, prefill, prefill_s, unit, mine, spec, config,
                                        factors, evidence, do_probes, judge, views))


def _unit_tables(model, tokenizer, record, prompt, prefill, prefill_s, unit: UnitWork, outcomes: list, spec, config,
                 factors, evidence, do_probes, judge, views: bool) -> tuple:
    """The answers, scores and probes rows of one unit from its conditions' outcomes (plus its layer sweep and token
    view, if any)."""
    from relaylens.probes.layer_sweep import layer_sweep
    from relaylens.probes.readouts import replay_conditions
    from relaylens.conditions.scoped import expand_conditions
    from relaylens.scoring.metrics import score_answer

    selection = unit.selection
    gold_total, gold_kept = _gold_units(prompt, selection, spec.granularity)
    key = {"record_id": record.record_id, "selector": unit.selector, "budget": float(unit.budget)}
    meta = {"question_type": record.question_type, "is_abstention": bool(record.is_abstention),
            "cluster_id": record.cluster_id or record.record_id}
    answers, scores, probe_frames, reference, recorders = [], [], [], None, {}
    end_ids = sorted(default_eos_ids(model, tokenizer))  # what ends an answer, whatever the run's --stop
    for generation, probed, elapsed, batch_rows in outcomes:
        label = generation.condition
        if probed is not None:
            recorders[label] = probed.question_recorder
            probe_frames.append(probed.readouts.assign(condition=label, source="forward"))
            if label == "original":
                reference = probed
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
    if do_probes and reference is not None and spec.replay_conditions:
        replay = replay_conditions(reference, prefill, selection, evidence, expand_conditions(spec.replay_conditions, model),
                                   int(prompt.question_ids.numel()), factors)
        probe_frames.append(replay.assign(source="replay"))
    if spec.sensitivity:
        sensitivity = sensitivity_frames(model, tokenizer, record, prompt, prefill, selection, spec, config, factors)
        probe_frames.extend(frame.assign(source="forward") for frame in sensitivity)
    if spec.sweep == "layers":
        sweep_scores, sweep_probes = layer_sweep(model, prefill, selection, prompt.question_ids, evidence if do_probes else None,
                                                 first_answer_token(tokenizer, record, spec.prompt_mode), factors,
                                                 config.window_mode)
        scores.extend({**key, "condition": row["condition"], **meta, "metric": row["metric"], "value": row["value"]}
                      for row in sweep_scores)
        if len(sweep_probes):
            probe_frames.append(sweep_probes)
    probes = pd.concat(probe_frames, ignore_index=True).assign(**key) if probe_frames else pd.DataFrame()
    view = None
    if views and recorders:
        from relaylens.probes.token_view import token_view

        view = token_view(prompt, tokenizer, selection, spec.granularity, recorders, key)
    return answers, scores, probes, view


def sensitivity_frames(model, tokenizer, record, prompt, prefill, selection, spec: ExperimentSpec, config: RunConfig,
                       factors, conditions=None) -> list[pd.DataFrame]:
    """The positional sensitivity readout (:mod:`relaylens.probes.sensitivity`) of every condition of ``spec`` (or
    ``conditions``) on one unit, as probe frames with a ``condition`` column; none for records without an answer."""
    from relaylens.conditions.scoped import expand_conditions
    from relaylens.probes.sensitivity import positional_sensitivity

    target = first_answer_token(tokenizer, record, spec.prompt_mode)
    if target is None:
        return []
    frames = []
    for condition in conditions or expand_conditions(spec.conditions, model):
        frame = positional_sensitivity(model, prefill, selection, condition, prompt.question_ids, target, factors,
                                       config.window_mode)
        frames.append(frame.assign(condition=condition.label, probe_point="question_final"))
    return frames


def run_analysis(spec: ExperimentSpec, config: RunConfig, progress: bool = True, model_and_tokenizer=None) -> Path:
    """Run (or resume) ``spec`` under ``config``; returns the run directory with consolidated tables.

    Records that cannot run (history over ``max_history_tokens`` or the rotary range, or too short for a selector's
    window or budget) are committed as ``skipped`` rows naming the record and the reason; the run goes on.
    """
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.model.hf import rope_summary
    from relaylens.scoring.judge import redact_url
    from relaylens.results.locks import run_lock
    from relaylens.model.loading import load_model, model_files_fingerprint, model_fingerprint
    from relaylens.datasets import load_records
    from relaylens.experiments.launch import detect_shard, shard_dir
    from relaylens.experiments.learned import check_learned_conditions
    from relaylens.results.store import RunStore, build_manifest, prepare_run_dir
    from relaylens.results.shards import parse_shard, shard_records

    check_config(config)
    auto = bool(config.shard) and config.shard.strip().lower() == "auto"
    launcher = detect_shard() if auto else None  # torchrun / accelerate / SLURM: the shard and the local rank
    placement = config.placement(local_rank=launcher.local_rank if launcher else None)
    data_path = resolve_data(spec.data if config.data == SAMPLE else config.data)  # an analysis may bring its own sample
    records = load_records(data_path, format=config.data_format)
    if not records:
        raise RelaylensError(f"{data_path} holds no records")
    limit = config.limit if config.limit is not None else spec.limit
    records = records[:limit] if limit else records
    shard = (launcher.index, launcher.count) if launcher else parse_shard(config.shard) if config.shard else None
    if shard:
        chosen = set(shard_records([r.record_id for r in records], *shard))
        records = [r for r in records if r.record_id in chosen]
    out = Path(config.out or f"runs/{spec.name}")
    if launcher:  # one run directory, one shard directory per process
        out = shard_dir(out, *shard)
    model, tokenizer = model_and_tokenizer or load_model(config.model, **placement.load_kwargs())
    if spec.prompt_mode == "auto":
        spec = spec.replace(prompt_mode="chat" if getattr(tokenizer, "chat_template", None) else "completion")
    factors = RotaryFactors.from_model(model)
    run = vars(config) | {"out": None, "force": None, "shard": None, "retry_skipped": None, "batch_rows": None, "view_records": None,
                          "judge_url": redact_url(config.judge_url) if config.judge_url else None}
    plan = {"record_ids": [r.record_id for r in records], "units": len(spec.units([r.record_id for r in records]))}
    # the device kind, not its index: shards on cuda:0 and cuda:1 (or a resumed shard on another GPU) still agree
    recorded = placement.to_dict() | {"device": placement.device and placement.device.split(":")[0]}
    manifest = build_manifest(spec.name, {"spec": spec.to_dict(), "run": run, "placement": recorded,
                                          "rope": rope_summary(model)},
                              config.model, model_fingerprint(model), data_path, shard,
                              model_info=model_files_fingerprint(model, tokenizer), plan=plan)
    spec = check_learned_conditions(spec, manifest, plan["record_ids"])  # learned:RUN_DIR checked, pinned by content
    prepare_run_dir(out)
    with run_lock(out, "run"):
        judge = make_judge(config, out, records)  # a bad judge setting or template fails before the manifest
        store = RunStore.create_or_open(out, manifest, force=config.force)
        _run_units(model, tokenizer, factors, records, spec, config, store, judge, progress)
        store.consolidate()
    return out


def _run_units(model, tokenizer, factors, records, spec: ExperimentSpec, config: RunConfig, store, judge,
               progress: bool) -> None:
    from relaylens.datasets.prompting import render_prompt
    from relaylens.results.store import UnitKey
    from relaylens.results.views import write_view

    selectors = selector_objects(spec, config.seed)
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
                prefill = prefill_record(model, prompt, config, selectors.values())
                bases = dict.fromkeys(split_unit_selector(name)[0] for name, _ in pending + redo)
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


@contextmanager
def _naming_record(record_id: str):
    """Re-raise a relaylens error of one record with the record's id in front (unless the message names it)."""
    try:
        yield
    except RelaylensError as err:
        if record_id in str(err):
            raise
        raise type(err)(f"record {record_id}: {err}") from err


def prefill_record(model, prompt, config: RunConfig, selectors):
    from relaylens.model.prefill import prefill_history

    needs_columns = any(getattr(s, "needs_column_sums", False) for s in selectors)
    return prefill_history(model, prompt.history_ids, window_size=query_window(config, selectors, prompt.history_length),
                           chunk_size=config.chunk_size, attn_implementation=config.attn_implementation,
                           column_sums=needs_columns)


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
        return "too_long", (f"record {rid}: history of {L} tokens needs positions up to {needed - 1} (largest condition "
                            f"shift {spec.max_shift}, question and {spec.max_new_tokens} new tokens), past the model's "
                            f"rotary range {limit}")
    if L <= config.window_size:
        return "too_short", (f"record {rid}: history of {L} tokens is not longer than the {config.window_size}-token "
                             "observation window")
    return None


def _skip_unplaceable(store, record, prompt, units, redo, spec: ExperimentSpec, model, factors, live, task) -> list:
    """The units every condition can place; the others are committed as skipped (``too_long``: a question start
    past the rotary range, e.g. a large ``geometry`` b; ``position``: a ``move=`` past the question), as
    :func:`history_problem` skips a ``query_only`` shift past the range (issue 41, item 13)."""
    from relaylens.conditions.scoped import expand_conditions, unit_position_problem

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


def skip_unit(store, record_id: str, selector: str, budget: float, history_length: int, reason: str, detail: str) -> None:
    from relaylens.results.store import UnitKey

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
    from relaylens.results.views import has_view

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
    from relaylens.progress import progress_view

    return progress_view()


def _jupyter_without_widgets() -> bool:
    """True inside a Jupyter kernel where ipywidgets cannot be imported (rich's live display needs it there)."""
    import sys

    if "ipykernel" not in sys.modules:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return False


def advance_bar(live, task, steps: int, record_id: str, stage: str) -> None:
    if live is not None:  # a record id is dataset text: shown, never interpreted by the terminal
        live.update(task, advance=steps, stage=f"{shown(record_id)}: {stage}")
