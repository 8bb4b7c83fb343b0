"""A record's units of work: prefill its history once, then select once per pending (selector, budget).

A unit is one (record, selector, budget); every condition of a unit shares its selection (the comparison is paired).
Every runner prepares units this way, through the one walk (:class:`relaylens.experiments.walk.RunWalk`, used by
:mod:`relaylens.experiments.runner` for analyses and :mod:`relaylens.experiments.learned_run` for
``learned_geometry``); the names also import from the runner, with a warning, until relaylens 0.3.0.

Example:
    >>> query_window(RunConfig(window_size=32), [], history_length=900)
    32
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from relaylens.errors import BudgetError, TooShortError
from relaylens.experiments.config import RunConfig
from relaylens.experiments.specs import ExperimentSpec
from relaylens.model.prefill import prefill_history
from relaylens.results.tables import split_unit_label
from relaylens.selectors import make_selector, selector_class
from relaylens.selectors.kvpress_pass import share_press_passes
from relaylens.selectors.protection import framing_mask, select_protected

__all__ = ["UnitWork", "prefill_record", "query_window", "select_units", "selector_objects"]


def selector_objects(spec: ExperimentSpec, seed: int) -> dict:
    """Selector name -> its object with the spec's options (the run's ``seed`` for seeded selectors)."""
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


def prefill_record(model, prompt, config: RunConfig, selectors):
    """The history prefill of one rendered prompt, capturing what ``selectors`` need (window queries, column sums)."""
    needs_columns = any(getattr(s, "needs_column_sums", False) for s in selectors)
    window = query_window(config, selectors, prompt.history_length)
    return prefill_history(model, prompt.history_ids, window_size=window,
                           chunk_size=config.chunk_size, attn_implementation=config.attn_implementation,
                           column_sums=needs_columns)


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
    shared_s, served = 0.0, set()
    cells = any(split_unit_label(name)[1] is not None for name, _ in pending)
    if not protect and not cells:  # every kvpress unit of the record scored in one history pass per kernel
        _, shared_s, served = share_press_passes(selectors, prefill, pending)
    share = shared_s / max(1, sum(name in served for name, _ in pending))
    units, too_short = [], []
    for name, budget in pending:
        started = time.perf_counter()
        base, cell = split_unit_label(name)
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
