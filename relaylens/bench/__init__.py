"""Benchmarks (not tests) and ``relaylens model check``: every ratio measured within one run.

Owns: :mod:`~relaylens.bench.geometry` (relocation against a copy of the same cache, ``relaylens bench geometry``),
:mod:`~relaylens.bench.model` (probe cost, prefill throughput, selector memory, scaling),
:mod:`~relaylens.bench.requests` (Table 3 overhead of complete requests, batched-row throughput),
:mod:`~relaylens.bench.roofline` (each stage as a fraction of this machine's limits, which
:mod:`~relaylens.bench.machine` measures: GEMM FLOP/s, copy bandwidth, CPU flags, a model's cost per token) and
:mod:`~relaylens.bench.checks` (exactness checks on a real model); :mod:`~relaylens.bench.registry` names them
(``relaylens bench NAME``).

May import: every stage (datasets, model, selectors, geometry, conditions, generation, probes, results, reporting).

The former module ``relaylens.bench`` is now :mod:`relaylens.bench.geometry`; its names are importable from here.
"""

from relaylens.bench.geometry import (LLAMA31_8B, SMOLLM2, CacheShape, bench_delta_rotation_error, bench_relocation,
                                      interleaved_medians, min_cpu_seconds, rotary_only_model, run_geometry,
                                      write_results)
from relaylens.bench.registry import BENCHMARKS

__all__ = ["BENCHMARKS", "LLAMA31_8B", "SMOLLM2", "CacheShape", "bench_delta_rotation_error", "bench_relocation",
           "interleaved_medians", "min_cpu_seconds", "rotary_only_model", "run_geometry", "write_results"]
