"""The ``learned_geometry`` run: records, split, preparation, training and evaluation in one resumable run
directory (the steps are described in :mod:`relaylens.experiments.learned`).

Run directory: the usual manifest, units and tables (:mod:`relaylens.results.store`), plus the ``geometry`` table
(one training unit, ``record_id`` ``training``) and ``learned_geometry.json``. Re-running the same command resumes:
training continues at its last committed step, evaluation skips committed test records, and records are prepared
again only when something still needs them (a prefill per record is the run's largest cost besides training).

Example (the CLI: ``relaylens run learned_geometry --limit 16 --steps 20 --out runs/learned``; from Python):
    >>> from relaylens.experiments.specs import load_analysis
    >>> from relaylens.experiments.config import RunConfig
    >>> analysis = load_analysis("learned_geometry")
    >>> run_learned_geometry(analysis.spec, RunConfig(limit=16, out="runs/learned"), analysis.options)  # doctest: +SKIP
    PosixPath('runs/learned')
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from relaylens.conditions.family import LEARNED_FILE, Learned
from relaylens.errors import RelaylensError, shown
from relaylens.experiments.config import RunConfig, check_config
from relaylens.experiments.learned import LearnOptions, Prepared, fit_settings, learned_file, split_records, train
from relaylens.experiments.record_rows import process_record
from relaylens.experiments.run_setup import open_run
from relaylens.experiments.specs import ExperimentSpec
from relaylens.experiments.walk import PrefillReuse, RecordWork, RunWalk, answer_tokens, progress_bar
from relaylens.generation.cache import coordinates_of, keep_selected
from relaylens.generation.single import answer_log_probs
from relaylens.results.atomic import safe_subdir
from relaylens.results.store import UNITS, UnitKey, manifest_diff, manifest_section
from relaylens.results.tables import ANSWER_LOGLIK, TRAINING_UNIT


def run_learned_geometry(spec: ExperimentSpec, config: RunConfig, options: LearnOptions | None = None,
                         progress: bool = True, model_and_tokenizer=None) -> Path:
    """Run (or resume) ``learned_geometry``; returns the run directory (tables consolidated, learned file written)."""
    options = options or LearnOptions()
    check_config(config)
    _refuse_unsupported(spec, config)
    opened = open_run(spec, config, model_and_tokenizer)
    model, tokenizer, factors, out = opened.model, opened.tokenizer, opened.factors, opened.out
    train_records, test_records = split_records(opened.records, config.seed, options.train_fraction)
    plan = {"record_ids": [r.record_id for r in test_records], "units": len(test_records),
            "train_ids": [r.record_id for r in train_records]}
    # the manifests of this run never recorded the placement or the judge URL: kept so, so resumes still match
    opened = opened.with_manifest(plan, {"learn": asdict(options)}, placement=False, judge_url=False)
    spec, manifest = opened.spec, opened.manifest
    with opened.session(previous=True) as session:
        store, judge, previous = session.store, session.judge, session.previous
        selector, budget = spec.selectors[0], float(spec.budgets[0])
        key = {"record_id": TRAINING_UNIT, "selector": selector, "budget": budget}
        training_key = UnitKey(TRAINING_UNIT, selector, budget)
        rows = _training_rows(store, training_key)
        if _must_retrain(previous, manifest, rows, options):  # --force with another split, seed, data, rate, ...
            _discard_all(store, out)
            rows = []
        split = ([r.record_id for r in train_records], [r.record_id for r in test_records])
        finished = _finished(out, rows, options, manifest, spec, config.seed, split)
        if not finished:  # evaluations of an older geometry (e.g. fewer steps) are computed again after training
            _discard_evaluations(store, training_key)
        pending_test = [r for r in test_records if not store.is_done(UnitKey(r.record_id, selector, budget))]
        wanted = pending_test if finished else train_records + test_records
        with progress_bar(progress) as bar:
            # one prefill per record, never kept for the next (training holds only each record's kept states)
            walk = RunWalk.start(model, tokenizer, spec, config, store, factors, reuse=PrefillReuse(enabled=False))
            prepared = _prepare(walk, wanted, options, bar)
            train_items = [prepared[r.record_id] for r in train_records if r.record_id in prepared
                           and prepared[r.record_id].answer_ids.numel()]
            test_items = [prepared[r.record_id] for r in test_records if r.record_id in prepared
                          and prepared[r.record_id].answer_ids.numel()]
            if not finished:
                if not train_items or not test_items:
                    raise RelaylensError(f"learned_geometry: {len(train_items)} train and {len(test_items)} test "
                                         "records have a reference answer and fit the model; it needs at least one of "
                                         "each. Fix: pass more records (--limit) or other data")

                def commit(new_rows):
                    store.write_unit(training_key, [], [], [], replace=store.is_done(training_key),
                                     geometry_rows=new_rows)

                task = bar.add_task("train", total=options.steps, stage="") if bar else None

                def tick(step, text):
                    if bar:
                        bar.update(task, completed=step, stage=text)

                values = train(model, factors, train_items, test_items, options, config.seed, key, rows,
                               config.window_mode, commit, tick)
                if bar:
                    bar.update(task, completed=options.steps, stage="trained")
                selection = train_items[0].unit.selection
                learned_file(out, values, options, manifest, spec, [r.record_id for r in train_records],
                             [r.record_id for r in test_records], config.seed, selection.num_layers,
                             selection.num_kv_heads)
            ready = [prepared[r.record_id] for r in pending_test if r.record_id in prepared]
            _evaluate(walk, ready, judge, out, bar)
        store.consolidate()
    return out


def _refuse_unsupported(spec: ExperimentSpec, config: RunConfig) -> None:
    """Refuse what this run cannot do, before any record or model loads: shards, other conditions, several
    selectors or budgets."""
    if config.shard:
        raise RelaylensError("learned_geometry trains one geometry on all its train records; it does not run in "
                             "shards. Fix: drop --shard (and use relaylens run, not sweep)")
    others = [c for c in spec.conditions + spec.replay_conditions if c not in ("original", "relay")]
    if others:  # it evaluates original, relay and its own learned map only: another condition would be ignored
        raise RelaylensError(f"learned_geometry evaluates original, relay and the learned map on its test records; it "
                             f"does not run {', '.join(map(str, others))}. Fix: drop --condition here, and run those "
                             "(or learned:RUN_DIR) with another analysis, e.g. relaylens run coordinate_ablation")
    if len(spec.selectors) != 1 or len(spec.budgets) != 1:
        raise RelaylensError(f"learned_geometry learns one geometry for one selector and one budget; got selectors "
                             f"{list(spec.selectors)} and budgets {list(spec.budgets)}. Fix: pass one --selector and "
                             "one --budget")


#: manifest keys whose change leaves the committed training valid: more (or other evaluation) steps continue it;
#: package versions and the source state are --force's usual business
_TRAINING_KEEPS = {"config.learn.steps", "config.learn.eval_every", "source", "versions", "git_commit"}


def _must_retrain(previous: dict | None, manifest: dict, rows: list[dict], options: LearnOptions) -> bool:
    """Whether the committed training unit cannot be continued: the run was forced onto other settings that training
    depends on (split, seed, data, model, selector, learning rate, sharing, ...: anything but the step counts), it
    went past ``options.steps``, or it holds non-finite parameters (a diverged step committed by an older version)."""
    if not rows:
        return False
    if previous is not None and manifest_diff(previous, manifest, ignore=_TRAINING_KEEPS):
        return True
    steps = [r["step"] for r in rows if r["metric"] == "b"]
    finite = all(math.isfinite(float(r["value"])) for r in rows if r["metric"] in ("b", "s", "alpha"))
    return not finite or (bool(steps) and max(steps) > options.steps)


def _discard_all(store, out: Path) -> None:
    """Delete the training unit, every evaluated (or skipped) record and the learned file: the run starts again."""
    safe_subdir(out, UNITS, create=False)  # a linked units/: refused, nothing deleted through it
    store.invalidate()
    for path in store.unit_paths():
        path.unlink(missing_ok=True)
    (out / LEARNED_FILE).unlink(missing_ok=True)


def _discard_evaluations(store, training_key) -> None:
    """Delete every committed unit but the training unit (they were evaluated, or skipped, before training ended)."""
    safe_subdir(store.run_dir, UNITS, create=False)  # a linked units/: refused, nothing deleted through it
    keep = store.unit_path(training_key)
    others = [p for p in store.unit_paths() if p != keep]
    if others:
        store.invalidate()
        for path in others:
            path.unlink(missing_ok=True)


def _finished(out: Path, rows: list[dict], options: LearnOptions, manifest: dict, spec, seed: int, split) -> bool:
    """Training is done and ``learned_geometry.json`` is this run's: parameters at ``options.steps``, and a file
    whose options, seed, split and fit settings are the ones this run trains with."""
    if not any(r["metric"] == "b" and r["step"] == options.steps for r in rows):
        return False
    try:
        doc = json.loads((out / LEARNED_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    fit = fit_settings(spec, manifest_section(manifest, "config", "run"))
    return isinstance(doc, dict) and doc.get("options") == asdict(options) and doc.get("seed") == seed \
        and doc.get("train_records") == split[0] and doc.get("test_records") == split[1] and doc.get("fit") == fit


def _training_rows(store, key) -> list[dict]:
    """The geometry rows of the committed training unit (empty before the first step)."""
    if not store.is_done(key):
        return []
    columns = store.load_unit(store.unit_path(key))["geometry"]
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _prepare(walk: RunWalk, records, options: LearnOptions, bar) -> dict[str, Prepared]:
    """Prefill and select each record once (the run's walk) and keep only its kept states; records that cannot run
    are committed as skipped units (``too_long`` / ``too_short``), once, and left out."""
    spec, store = walk.spec, walk.store
    unit = (spec.selectors[0], float(spec.budgets[0]))
    task = bar.add_task("prepare", total=len(records), stage="") if bar else None
    out = {}
    for record in records:
        if bar:
            bar.update(task, stage=f"{shown(record.record_id)}: prefill")
        committed = [unit] if store.is_done(UnitKey(record.record_id, *unit)) else []
        work = walk.prepare(record, [unit], committed=committed, placed=False)  # placed: at evaluation, learned map
        if work is not None and work.units:
            answer = answer_tokens(walk.tokenizer, record, spec.prompt_mode)[: options.max_answer_tokens]
            selected = work.units[0]
            out[record.record_id] = Prepared(record, work.prompt, keep_selected(work.prefill, selected.selection),
                                             selected, work.prefill_s, torch.tensor(answer, dtype=torch.long))
        del work  # the full prefill goes before the next record's
        if bar:
            bar.update(task, advance=1, stage=f"{shown(record.record_id)}: ready")
    return out


def _evaluate(walk: RunWalk, items: list[Prepared], judge, out: Path, bar) -> None:
    """Every pending test record under original, relay and the learned map: the runner's answers, scores and probes
    (and sensitivity) plus ``answer_loglik`` scores, committed per record."""
    model, factors, config, store = walk.model, walk.factors, walk.config, walk.store
    learned = Learned.from_run_dir(out, display="learned")
    trained_on = set(learned.info.get("train_records") or ())
    seen = [item.record.record_id for item in items if item.record.record_id in trained_on]
    if seen:  # the split guarantees it cannot happen; a test record the fit saw would never be evaluated
        raise RelaylensError(f"learned_geometry: records {seen[:3]} are in the learned geometry's train split and "
                             "would be evaluated as test records. Fix: re-run with --force (training starts again)")
    eval_spec = walk.spec.replace(conditions=("original", "relay", learned))
    evaluation = walk.with_spec(eval_spec)
    conditions = evaluation.conditions  # parsed once
    task = bar.add_task("evaluate", total=len(items), stage="") if bar else None
    for item in items:
        record = item.record
        if bar:
            bar.update(task, stage=f"{shown(record.record_id)}: decoding")
        units = evaluation.placeable(record, item.prompt, [item.unit])  # a skip committed, once
        if not units:
            continue
        work = RecordWork(record, item.prompt, item.prefill, item.prefill_s, units)
        for unit, answers, scores, probes, _ in process_record(evaluation, work, judge):
            meta = {"record_id": record.record_id, "selector": unit.selector, "budget": float(unit.budget),
                    "question_type": record.question_type, "is_abstention": bool(record.is_abstention),
                    "cluster_id": record.cluster_id or record.record_id}
            for condition in conditions:  # how far from the question the condition puts the kept keys
                coords = coordinates_of(condition, unit.selection)
                distance = (float(coords.question_start) - coords.key_positions.double())[unit.selection.valid]
                scores.append(meta | {"condition": condition.label, "metric": "mean_key_distance",
                                      "value": float(distance.mean())})
            if item.answer_ids.numel():
                with torch.no_grad():
                    for condition in conditions:
                        value = answer_log_probs(model, item.prefill, unit.selection, condition,
                                                 item.prompt.question_ids, item.answer_ids, factors,
                                                 config.window_mode).mean()
                        scores.append(meta | {"condition": condition.label, "metric": ANSWER_LOGLIK,
                                              "value": float(value)})
            store.write_unit(UnitKey(record.record_id, unit.selector, unit.budget), answers, scores, probes)
        if bar:
            bar.update(task, advance=1, stage=f"{shown(record.record_id)}: committed")
