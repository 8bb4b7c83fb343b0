"""The probe registry: every per-unit probe kind the runner runs after a unit's rows are decoded, in one ordered table.

The runner (:mod:`relaylens.experiments.runner`) builds one :class:`~relaylens.probes.unit.UnitContext` per
(record, selector, budget), asks each kind of :data:`PROBES` whether the run's spec enables it, and appends what
:func:`run_probes` returns to the unit's tables. Order matters: the kinds run, and their rows land in the tables, in
the order listed here (committed runs redraw byte for byte only if it never changes).

* ``replay`` (``spec.probes`` and ``spec.replay_conditions``): phase-replay probe rows, ``source = "replay"``;
* ``sensitivity`` (``spec.sensitivity``): positional sensitivity probe rows;
* ``layer_sweep`` (``spec.sweep == "layers"``): ``first_answer_logprob`` scores and ``source = "sweep"`` probe rows;
* ``token_view`` (``spec.probes``): the token view of the first ``config.view_records`` records.

A new kind is one file in ``relaylens/probes/`` (an object with ``name``, ``enabled(spec, config)`` and
``run(unit) -> ProbeTables``: the :class:`~relaylens.probes.unit.Probe` protocol) plus its line in :data:`PROBES`;
``docs/how-to/extend.md`` walks through one. For a kind that lives outside the package (a notebook, a test),
:func:`registered` adds it for the duration of a ``with`` block.

Example:
    >>> [probe.name for probe in PROBES]
    ['replay', 'sensitivity', 'layer_sweep', 'token_view']
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from relaylens.errors import RelaylensError
from relaylens.probes.layer_sweep import LAYER_SWEEP
from relaylens.probes.readouts import REPLAY
from relaylens.probes.sensitivity import SENSITIVITY
from relaylens.probes.token_view import TOKEN_VIEW
from relaylens.probes.unit import Probe, ProbeTables, UnitContext, check_tables

__all__ = ["PROBES", "Probe", "ProbeTables", "UnitContext", "enabled_probes", "registered", "run_probes"]

PROBES: list[Probe] = [REPLAY, SENSITIVITY, LAYER_SWEEP, TOKEN_VIEW]
"""Every per-unit probe kind, in the order its rows land in the tables (append a new kind at the end)."""


def enabled_probes(spec, config) -> list[Probe]:
    """The kinds of :data:`PROBES` that ``spec`` (under ``config``) enables, in registry order."""
    return [probe for probe in PROBES if probe.enabled(spec, config)]


def run_probes(unit: UnitContext, probes: list[Probe] | None = None) -> list[ProbeTables]:
    """The tables of every kind of ``probes`` (default: the kinds ``unit.spec`` enables) on one unit, in order; what
    each kind returns is checked (:func:`~relaylens.probes.unit.check_tables`): a malformed row fails here, naming
    the kind and the field, not in the store after the unit's decoding."""
    kinds = enabled_probes(unit.spec, unit.config) if probes is None else probes
    out = []
    for probe in kinds:
        tables = probe.run(unit)
        if not isinstance(tables, ProbeTables):
            raise RelaylensError(f"probe kind {probe.name!r} returned {type(tables).__name__}, expected ProbeTables. "
                                 "Fix: return relaylens.probes.unit.ProbeTables(probes=..., scores=..., view=...)")
        out.append(check_tables(probe.name, tables))  # columns and value kinds: a bad row names the kind and field
    return out


@contextmanager
def registered(*probes: Probe) -> Iterator[list[Probe]]:
    """Add ``probes`` at the end of :data:`PROBES` inside the ``with`` block (a run started there runs them) and
    remove them on the way out, also on an error. Names must be new.

    >>> from relaylens.probes.unit import ProbeTables
    >>> class Nothing:
    ...     name = "nothing"
    ...     def enabled(self, spec, config): return True
    ...     def run(self, unit): return ProbeTables()
    >>> with registered(Nothing()):
    ...     [p.name for p in PROBES][-1]
    'nothing'
    >>> [p.name for p in PROBES][-1]
    'token_view'
    """
    taken = {probe.name for probe in PROBES}
    for probe in probes:
        if not isinstance(probe, Probe):
            raise RelaylensError(f"{probe!r} is not a probe kind: it needs a name, enabled(spec, config) and "
                                 "run(unit). Fix: follow relaylens.probes.unit.Probe")
        if probe.name in taken:
            raise RelaylensError(f"a probe kind named {probe.name!r} is already registered. Fix: pick another name")
        taken.add(probe.name)
    PROBES.extend(probes)
    try:
        yield PROBES
    finally:
        PROBES[:] = [p for p in PROBES if all(p is not q for q in probes)]
