"""The probe registry: every per-unit probe kind the runner runs after a unit's rows are decoded, in one ordered table.

The runner (:mod:`relaylens.experiments.runner`) builds one :class:`~relaylens.probes.unit.UnitContext` per
(record, selector, budget), asks each kind of :data:`PROBES` whether the run's spec enables it, and appends what
:func:`run_probes` returns to the unit's tables. Order matters: the kinds run, and their rows land in the tables, in
the order registered here (committed runs redraw byte for byte only if it never changes), then the kinds of
installed plugins (entry-point group :data:`ENTRY_POINT_GROUP`).

* ``replay`` (``spec.probes`` and ``spec.replay_conditions``): phase-replay probe rows, ``source = "replay"``;
* ``sensitivity`` (``spec.sensitivity``): positional sensitivity probe rows;
* ``layer_sweep`` (``spec.sweep == "layers"``): ``first_answer_logprob`` scores and ``source = "sweep"`` probe rows;
* ``token_view`` (``spec.probes``): the token view of the first ``config.view_records`` records.

A new kind is one file in ``relaylens/probes/`` (an object with ``name``, ``enabled(spec, config)`` and
``run(unit) -> ProbeTables``: the :class:`~relaylens.probes.unit.Probe` protocol) plus its place in
:data:`PROBE_KINDS`; a kind with its own switch reads ``self.name in spec.probe_kinds`` (``relaylens run --probe
NAME``), so it adds no spec field and no CLI option; ``docs/how-to/extend.md`` walks through one. A kind that
lives in another distribution is an entry point (``[project.entry-points."relaylens.probes"] NAME =
"pkg.mod:OBJECT"``); for one in a notebook or a test, :func:`registered` adds it for the duration of a ``with``
block.

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
from relaylens.registry import Registry

__all__ = ["PROBES", "PROBE_KINDS", "ENTRY_POINT_GROUP", "Probe", "ProbeTables", "UnitContext", "check_probe",
           "enabled_probes", "registered", "run_probes"]

ENTRY_POINT_GROUP = "relaylens.probes"
"""The entry-point group of probe-kind plugins: ``[project.entry-points."relaylens.probes"] NAME = "pkg.mod:OBJECT"``
in a distribution's ``pyproject.toml`` adds ``OBJECT`` (a :class:`~relaylens.probes.unit.Probe` named ``NAME``) after
the built-in kinds; it runs in every run whose spec it enables."""


def check_probe(name: str, probe) -> None:
    """Refuse what cannot be the probe kind ``name``: an object without the :class:`~relaylens.probes.unit.Probe`
    protocol (a class is not one: register an instance), or one named otherwise."""
    if isinstance(probe, type) or not isinstance(probe, Probe):
        raise RelaylensError(f"{probe!r} is not a probe kind: it needs a name, enabled(spec, config) and "
                             "run(unit). Fix: follow relaylens.probes.unit.Probe (register an instance, not a class)")
    if probe.name != name:
        raise RelaylensError(f"probe kind {name!r} is an object named {probe.name!r}; its rows would carry the other "
                             f"name. Fix: register it as {probe.name!r}, or name it {name!r}")


PROBE_KINDS: Registry[Probe] = Registry("probe kind", entry_point_group=ENTRY_POINT_GROUP, check=check_probe)
"""Every per-unit probe kind by name (a :class:`~relaylens.registry.Registry`), in the order its rows land in the
tables: the built-in kinds (register a new one at the end), then the kinds of installed plugins."""
for _probe in (REPLAY, SENSITIVITY, LAYER_SWEEP, TOKEN_VIEW):
    PROBE_KINDS.register(_probe.name, _probe)
del _probe
PROBES = PROBE_KINDS.values()
"""Every per-unit probe kind, in table order: a live view of :data:`PROBE_KINDS`'s objects (iterate it)."""


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
def registered(*probes: Probe) -> Iterator:
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
    for probe in probes:
        if isinstance(probe, type) or not isinstance(probe, Probe):
            raise RelaylensError(f"{probe!r} is not a probe kind: it needs a name, enabled(spec, config) and "
                                 "run(unit). Fix: follow relaylens.probes.unit.Probe")
    with PROBE_KINDS.frozen():
        for probe in probes:
            PROBE_KINDS.register(probe.name, probe)
        yield PROBES
