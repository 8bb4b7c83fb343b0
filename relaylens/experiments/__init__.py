"""Experiments: which selectors, budgets and conditions an analysis sweeps (specs and presets), and the machinery
that runs it: the runner, launcher-aware sharding, Ray sweeps and the demo.

Owns: :mod:`~relaylens.experiments.specs` (:class:`ExperimentSpec`, the analyses in ``relaylens/analyses/``),
:mod:`~relaylens.experiments.presets` (``--preset paper``), :mod:`~relaylens.experiments.runner` (records x
selectors x budgets x conditions, paired and resumable), :mod:`~relaylens.experiments.launch` (which shard this
process runs under torchrun / accelerate / SLURM), :mod:`~relaylens.experiments.sweep` (shards as Ray tasks),
:mod:`~relaylens.experiments.ray_connect` (a loopback-only local Ray, or a cluster joined within a bounded time) and
:mod:`~relaylens.experiments.demo`; :mod:`~relaylens.experiments.learned` and :mod:`~relaylens.experiments.learned_run`
(``learned_geometry``: fit the geometry family on train records, evaluate it on test records).

In: an analysis name, a model, a dataset and run options. Out: a run directory (:mod:`relaylens.results`) with
figures and a report (:mod:`relaylens.reporting`).

May import: every stage below it (datasets, model, selectors, geometry, conditions, generation, probes, scoring,
results, reporting). Only :mod:`relaylens.bench` and :mod:`relaylens.cli` sit above.

The former module ``relaylens.experiments`` is now :mod:`relaylens.experiments.specs`; its names are importable from
here.
"""

from relaylens.experiments.specs import (ALPHA_CURVE, ANALYSES_PACKAGE, PROMPT_MODES, STOPS, ExperimentSpec,
                                         apply_overrides, available_analyses, load_analysis, parse_selector_arg)

__all__ = ["ALPHA_CURVE", "ANALYSES_PACKAGE", "PROMPT_MODES", "STOPS", "ExperimentSpec", "apply_overrides",
           "available_analyses", "load_analysis", "parse_selector_arg"]
