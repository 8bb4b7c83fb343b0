"""Every benchmark of ``relaylens bench`` by name: ``name -> run(**options) -> rows``.

``geometry`` and ``selectors`` need no model; the others load one (``model_spec``, ``load_kwargs``; ``roofline``
also takes ``quick`` and ``lengths``). Options a benchmark does not take, and options left at None, are dropped so
that each benchmark keeps its own defaults.

Example:
    >>> sorted(BENCHMARKS)
    ['dtype', 'geometry', 'overhead', 'prefill', 'probes', 'roofline', 'scaling', 'selectors', 'throughput']
"""

from __future__ import annotations

from collections.abc import Callable

from relaylens.bench.dtype import run_dtype
from relaylens.bench.geometry import run_geometry
from relaylens.bench.model import run_prefill, run_probes, run_scaling, run_selectors
from relaylens.bench.requests import run_overhead, run_throughput
from relaylens.bench.roofline import run_roofline


def _model_benchmark(run: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
    """``run`` behind the common call: ``include_large`` (geometry's option) and None-valued options dropped."""

    def call(**kwargs) -> list[dict]:
        kwargs.pop("include_large", None)
        return run(**{k: v for k, v in kwargs.items() if v is not None})

    call.__doc__ = run.__doc__
    return call


BENCHMARKS: dict[str, Callable[..., list[dict]]] = {
    "geometry": run_geometry,
    "overhead": _model_benchmark(run_overhead),
    "throughput": _model_benchmark(run_throughput),
    "probes": _model_benchmark(run_probes),
    "prefill": _model_benchmark(run_prefill),
    "selectors": _model_benchmark(run_selectors),
    "scaling": _model_benchmark(run_scaling),
    "dtype": _model_benchmark(run_dtype),
    "roofline": _model_benchmark(run_roofline),
}
"""Every benchmark of ``relaylens bench`` by name: ``name -> run(**options) -> rows`` (``all`` runs each)."""
