"""Benchmarks (not tests) and ``relaylens model check``: every ratio measured within one run.

Owns: :mod:`~relaylens.bench.geometry` (relocation against a copy of the same cache, ``relaylens bench geometry``),
:mod:`~relaylens.bench.model` (probe cost, prefill throughput, selector memory, scaling),
:mod:`~relaylens.bench.requests` (Table 3 overhead of complete requests, batched-row throughput),
:mod:`~relaylens.bench.roofline` (each stage as a fraction of this machine's limits, which
:mod:`~relaylens.bench.machine` measures: GEMM FLOP/s, copy bandwidth, CPU flags, a model's cost per token) and
:mod:`~relaylens.bench.checks` (exactness checks on a real model); :mod:`~relaylens.bench.registry` names them
(``relaylens bench NAME``).

May import: :mod:`relaylens.errors`, :mod:`relaylens.progress`, :mod:`relaylens.registry` and every stage below it,
:mod:`relaylens.datasets`, :mod:`relaylens.model`, :mod:`relaylens.selectors`, :mod:`relaylens.geometry`,
:mod:`relaylens.conditions`, :mod:`relaylens.generation`, :mod:`relaylens.probes`, :mod:`relaylens.scoring`,
:mod:`relaylens.results`, :mod:`relaylens.reporting` and :mod:`relaylens.experiments` (``bench dtype`` times records
through the runner itself).

Exports the stage contract: :data:`BENCHMARKS` (every benchmark by name). The names of the former module
``relaylens.bench`` (now :mod:`relaylens.bench.geometry`) still resolve here, with a warning, until relaylens 0.3.0
(:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.bench.registry import BENCHMARKS

__all__ = ["BENCHMARKS"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
