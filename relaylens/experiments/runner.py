"""Experiment runner: records x selectors x budgets x conditions, paired, resumable, with a progress bar.

For each record: render the prompt, prefill the history once, then for each (selector, budget) select once; the rows
(selector x budget x condition) of the record then run in batches of ``batch_rows`` rows (default: all of them in one
batch; ``1``: one row at a time) sharing the prefill (question pass with probes, greedy generation, scoring; see
:mod:`relaylens.generation.rows`). One (record, selector, budget) is one unit of work, committed atomically to the
run directory; re-running the same command skips committed units, so a killed run resumes where it stopped. After a
unit's rows, every probe kind its spec enables adds its rows (:mod:`relaylens.probes.registry`). The run is opened
by the one recipe every runner shares (:mod:`relaylens.experiments.run_setup`), its records are made ready by the one
walk (:mod:`relaylens.experiments.walk`) and decoded by the one corridor (:mod:`relaylens.experiments.record_rows`);
this module keeps what only the analysis runner does: which units are still owed, commits, and token views.

Example (the CLI: ``relaylens run coordinate_ablation --limit 4 --out runs/ablation``; from Python):
    >>> from relaylens.experiments.specs import load_analysis
    >>> config = RunConfig(limit=4, out="runs/ablation")
    >>> run_analysis(load_analysis("coordinate_ablation").spec, config)  # doctest: +SKIP
    PosixPath('runs/ablation')
    >>> config.model, config.data, config.chunk_size
    ('smollm2-135m-instruct', 'sample', 2048)
"""

from __future__ import annotations

from pathlib import Path

from relaylens import moved_name
from relaylens.experiments.config import RunConfig, check_config
from relaylens.experiments.record_rows import process_record
from relaylens.experiments.run_setup import analysis_plan, open_run
from relaylens.experiments.specs import ExperimentSpec
from relaylens.experiments.walk import (
    RunWalk,
    advance_bar,
    forget_skipped,
    history_order,
    missing_views,
    naming_record,
    progress_bar,
)
from relaylens.model.upcast import float32_products
from relaylens.results.store import UnitKey
from relaylens.results.views import write_view

__all__ = ["RunConfig", "run_analysis"]


def run_analysis(spec: ExperimentSpec, config: RunConfig, progress: bool = True, model_and_tokenizer=None) -> Path:
    """Run (or resume) ``spec`` under ``config``; returns the run directory with consolidated tables.

    Records that cannot run (history over ``max_history_tokens`` or the rotary range, or too short for a selector's
    window or budget) are committed as ``skipped`` rows naming the record and the reason; the run goes on.
    """
    check_config(config)
    opened = open_run(spec, config, model_and_tokenizer)
    opened = opened.with_manifest(analysis_plan(opened))  # learned:RUN_DIR conditions pinned by content
    with opened.session() as session:
        _run_units(opened, session.store, session.judge, progress)
        session.store.consolidate()
    return opened.out


def _run_units(opened, store, judge, progress: bool) -> None:
    """Every unit of ``opened.records`` not yet committed (and the token views lost after a commit), record by record,
    through one :class:`~relaylens.experiments.walk.RunWalk` (records over one history, e.g. LoCoMo's questions,
    prefill it once)."""
    spec, config, records = opened.spec, opened.config, opened.records
    labels = spec.unit_selectors()
    per_record = len(labels) * len(spec.budgets)
    total = len(spec.units(opened.record_ids))
    with progress_bar(progress) as live:
        task = live.add_task(f"{spec.name}", total=total, stage="loading") if live else None

        def tick(steps: int, record_id: str, stage: str) -> None:
            advance_bar(live, task, steps, record_id, stage)

        walk = RunWalk.start(opened.model, opened.tokenizer, spec, config, store, opened.factors, tick=tick)
        upcast = opened.upcast()[0]  # bfloat16 on a CPU without bfloat16 hardware: float32 kernels
        for order in history_order(records):  # questions over one history in a row: its prefill is reused
            record = records[order]
            keys = [UnitKey(record.record_id, name, b) for name in labels for b in spec.budgets]
            if config.retry_skipped:
                forget_skipped(store, keys)
            pending = [(k.selector, k.budget) for k in keys if not store.is_done(k)]
            redo = missing_views(store, keys) if order < config.view_records else []  # committed, view lost
            if not pending and not redo:
                tick(per_record, record.record_id, "done earlier")
                continue
            with naming_record(record.record_id), float32_products(upcast):  # errors name the record
                tick(per_record - len(pending), record.record_id, "prefill")
                work = walk.prepare(record, pending + redo, committed=redo)
                if work is None:  # the history cannot run: its owed units are committed as skipped
                    continue
                tick(0, record.record_id, f"decoding {len(work.units) * len(spec.conditions)} rows")
                for unit, answers, scores, probes, view in process_record(walk, work, judge,
                                                                          views=order < config.view_records):
                    again = (unit.selector, unit.budget) in redo  # committed earlier: only its view is written
                    if not again:
                        store.write_unit(UnitKey(record.record_id, unit.selector, unit.budget), answers, scores, probes)
                    if view is not None:  # after the commit: a failed unit leaves no view behind (reliability suite)
                        write_view(store.run_dir, view | {"order": order})
                    if not again:
                        tick(1, record.record_id, "committed")
    walk.reuse.finish(store.run_dir, progress)


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
