"""Every paper figure and table as a function of the result tables only: ``(tables) -> Figure`` or ``DataFrame``.

``tables`` is the dict of :func:`relaylens.results.load_tables` (``answers``, ``scores``, ``probes``; columns of
:mod:`relaylens.tables`). Nothing here imports torch, transformers or a model: figures are regenerated from a run
directory on any machine (``relaylens figures RUN_DIR``). The metric is the paper's where the run has it (judge or
choice accuracy), else ``contains`` with ``f1`` alongside (``--metric`` chooses; ``tables["metrics"]``); intervals
are 95% paired cluster-bootstrap intervals (:mod:`relaylens.bootstrap`, through :mod:`relaylens.summaries`).

One file per figure, named after its analysis; :mod:`relaylens.figures.registry` holds the registry
(:data:`REGISTRY`, by name; ``SPEC.figures`` of each analysis names its entries) and the run-directory writer.

=========== ======= =================== ====================================================================="""

from __future__ import annotations

from relaylens.figures import (  # noqa: F401 - importing a figure file registers its entries
    alignment, budget_curves, coordinate_ablation, cross_judge, evidence_attribution, evidence_reading, finch_comparison,
    infinitebench, layer_scope, main_table, ordering, overhead, paired_settings, question_types)
from relaylens.figures.registry import (COMPANIONS, ORDER, REGISTRY, FigureEntry, FigureError, build, names,
                                        select_figures, supported, write_entry, write_figures)
REGISTRY.update({name: REGISTRY.pop(name) for name in names()})  # iteration order = drawing order (ORDER first)
# statistics that callers of the one-file figures module used from here; their home is relaylens.summaries
from relaylens.summaries import (METRICS, accuracy_table, alpha_of, layer_table, paired_deltas,  # noqa: F401
                                 table_markdown, with_random_mean)

__all__ = ["REGISTRY", "ORDER", "COMPANIONS", "FigureEntry", "FigureError", "build", "names", "select_figures",
           "supported", "write_entry", "write_figures"]
