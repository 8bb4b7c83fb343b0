"""Experiments: which selectors, budgets and conditions an analysis sweeps (specs and presets), and the machinery
that runs it: the runner, launcher-aware sharding, Ray sweeps and the demo.

Owns: :mod:`~relaylens.experiments.specs` (:class:`ExperimentSpec`, the analyses in ``relaylens/analyses/``),
:mod:`~relaylens.experiments.presets` (``--preset paper``), :mod:`~relaylens.experiments.runner` (records x
selectors x budgets x conditions, paired and resumable), :mod:`~relaylens.experiments.launch` (which shard this
process runs under torchrun / accelerate / SLURM), :mod:`~relaylens.experiments.sweep` (shards as Ray tasks),
:mod:`~relaylens.experiments.ray_connect` (a loopback-only local Ray, or a cluster joined within a bounded time) and
:mod:`~relaylens.experiments.demo`; :mod:`~relaylens.experiments.analysis` (the record an analysis module declares:
:class:`Analysis`, its own command-line flags :class:`CliOption`), :mod:`~relaylens.experiments.run_setup` (the one
way every runner opens a run), :mod:`~relaylens.experiments.walk` (the one walk over a run's records: prompt, skips,
prefill, selection, conditions parsed once), :mod:`~relaylens.experiments.record_rows` (one record's rows decoded and
tabulated) and :mod:`~relaylens.experiments.units` (a record's units of work);
:mod:`~relaylens.experiments.learned` and :mod:`~relaylens.experiments.learned_run`
(``learned_geometry``: fit the geometry family on train records, evaluate it on test records).

In: an analysis name, a model, a dataset and run options. Out: a run directory (:mod:`relaylens.results`) with
figures and a report (:mod:`relaylens.reporting`).

May import: :mod:`relaylens.errors`, :mod:`relaylens.progress`, :mod:`relaylens.registry` (the analyses'
registry) and every stage below it, :mod:`relaylens.datasets`,
:mod:`relaylens.model`, :mod:`relaylens.selectors`, :mod:`relaylens.geometry`, :mod:`relaylens.conditions`,
:mod:`relaylens.generation`, :mod:`relaylens.probes`, :mod:`relaylens.scoring`, :mod:`relaylens.results` and
:mod:`relaylens.reporting`. Only :mod:`relaylens.bench` and :mod:`relaylens.cli` sit above.

Exports the stage contract: :class:`ExperimentSpec`, :class:`Analysis`, :class:`CliOption`, :func:`load_analysis` and
:func:`available_analyses` (the runner,
which imports transformers, loads from :mod:`relaylens.experiments.runner` or as ``relaylens.run_analysis``). The other
names of the former module ``relaylens.experiments`` (now :mod:`relaylens.experiments.specs`) still resolve here,
with a warning, until relaylens 0.3.0 (:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.experiments.analysis import Analysis, CliOption
from relaylens.experiments.specs import ExperimentSpec, available_analyses, load_analysis

__all__ = ["Analysis", "CliOption", "ExperimentSpec", "available_analyses", "load_analysis"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
