"""Every benchmark of ``relaylens bench`` by name: ``name -> Benchmark`` (callable: ``run(**options) -> rows``).

Each :class:`Benchmark` says which of the command's options it takes: ``geometry`` and ``selectors`` need no model;
the others load one (:data:`MODEL_OPTIONS`: ``model_spec``, ``load_kwargs``, ``records``, ``new_tokens``); ``overhead``
also takes ``schedule``, ``prefill_chunk``, ``selectors``, ``budgets`` and ``data`` and draws its own progress bar;
``roofline`` also takes ``quick`` and ``lengths`` and writes its own outputs beside the CSV; ``regime`` also takes
``dtype`` (the command's ``--dtype``, passed only when given, since ``load_kwargs`` always holds a resolved one).
Options a benchmark does not take, and options left at None, are dropped, so that each benchmark keeps its own
defaults. A new benchmark is one entry here; one in another distribution is an entry point
(``[project.entry-points."relaylens.benchmarks"] NAME = "pkg.mod:BENCHMARK"``, a :class:`Benchmark`).

Example:
    >>> sorted(BENCHMARKS)
    ['dtype', 'geometry', 'overhead', 'prefill', 'probes', 'regime', 'roofline', 'scaling', 'selectors', 'throughput']
    >>> sorted(BENCHMARKS["overhead"].arguments(dict(schedule="back-to-back", quick=True, records=None, repeats=2)))
    ['repeats', 'schedule']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relaylens.bench.dtype import run_dtype
from relaylens.bench.geometry import run_geometry
from relaylens.bench.model import run_prefill, run_probes, run_scaling, run_selectors
from relaylens.bench.regime import run_regime
from relaylens.bench.requests import run_overhead, run_throughput
from relaylens.bench.roofline import run_roofline, table, write_outputs
from relaylens.errors import RelaylensError
from relaylens.registry import Registry

MODEL_OPTIONS = ("model_spec", "load_kwargs", "records", "new_tokens")
"""The options of every benchmark that loads a model."""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of ``relaylens bench``.

    Attributes:
        run: ``run(**options) -> rows`` (one dict per table row).
        options: the keyword options of the command it takes besides ``repeats`` (others are never passed).
        own_progress: it draws its own progress bar (the command shows no spinner beside it).
        write: writes its own outputs, ``write(rows, out_dir) -> paths``, which replace the Markdown table named in
            the command's last line (the CSV is written for every benchmark).
        view: a rich renderable of the rows, printed instead of the Markdown table.
    """

    run: Callable[..., list[dict]]
    options: tuple[str, ...] = ()
    own_progress: bool = False
    write: Callable[[list[dict], Path], tuple[Path, ...]] | None = None
    view: Callable[[list[dict]], object] | None = None

    def arguments(self, values: dict) -> dict:
        """The keyword arguments of this benchmark among the command's option ``values`` (None values dropped)."""
        return {k: v for k, v in values.items() if k in ("repeats", *self.options) and v is not None}

    def __call__(self, **options) -> list[dict]:
        """Run with the options it takes (:meth:`arguments`)."""
        return self.run(**self.arguments(options))


ENTRY_POINT_GROUP = "relaylens.benchmarks"
"""The entry-point group of benchmark plugins (each a :class:`Benchmark`, run by ``relaylens bench NAME``)."""


def check_benchmark(name: str, benchmark) -> None:
    """Refuse what cannot be the benchmark ``name``: anything but a :class:`Benchmark`."""
    if not isinstance(benchmark, Benchmark):
        raise RelaylensError(f"benchmark {name!r} is {benchmark!r}, not a Benchmark. Fix: point it at "
                             "relaylens.bench.registry.Benchmark(run, options=(...))")


BENCHMARKS: Registry[Benchmark] = Registry("benchmark", entry_point_group=ENTRY_POINT_GROUP, check=check_benchmark)
"""Every benchmark of ``relaylens bench`` by name (``all`` runs each), then those of installed plugins (entry-point
group :data:`ENTRY_POINT_GROUP`); a :class:`~relaylens.registry.Registry`."""
for _name, _benchmark in {
    "geometry": Benchmark(run_geometry, options=("include_large",)),
    "overhead": Benchmark(run_overhead, options=(*MODEL_OPTIONS, "schedule", "prefill_chunk", "selectors", "budgets",
                                                 "data"), own_progress=True),
    "throughput": Benchmark(run_throughput, options=MODEL_OPTIONS),
    "probes": Benchmark(run_probes, options=MODEL_OPTIONS),
    "prefill": Benchmark(run_prefill, options=MODEL_OPTIONS),
    "selectors": Benchmark(run_selectors),
    "scaling": Benchmark(run_scaling, options=MODEL_OPTIONS),
    "dtype": Benchmark(run_dtype, options=MODEL_OPTIONS),
    "regime": Benchmark(run_regime, options=(*MODEL_OPTIONS, "dtype", "data")),
    "roofline": Benchmark(run_roofline, options=(*MODEL_OPTIONS, "quick", "lengths"), write=write_outputs, view=table),
}.items():
    BENCHMARKS.register(_name, _benchmark, owner=f"relaylens.bench.registry ({_benchmark.run.__module__})")
del _name, _benchmark
