"""Every paper figure and table as a function of the result tables only: ``(tables) -> Figure`` or ``DataFrame``.

``tables`` is the dict of :func:`relaylens.results.store.load_tables` (``answers``, ``scores``, ``probes``; columns of
:mod:`relaylens.results.tables`). Nothing here imports torch, transformers or a model: figures are regenerated from a
run directory on any machine (``relaylens figures RUN_DIR``). The metric is the paper's where the run has it (judge or
choice accuracy), else ``contains`` with ``f1`` alongside (``--metric`` chooses; ``tables["metrics"]``); intervals are
95% paired cluster-bootstrap intervals (:mod:`relaylens.reporting.bootstrap`, through
:mod:`relaylens.reporting.summaries`).

One file per figure, named after its analysis; :mod:`relaylens.reporting.figures.registry` holds the registry
(:data:`REGISTRY`, by name; ``SPEC.figures`` of each analysis names its entries),
:mod:`~relaylens.reporting.figures.writer` the run-directory writer.

====================== ====== ====================== ==================================================================
name                   kind   file                   what
====================== ====== ====================== ==================================================================
table1                 table  main_table             accuracy per selector and condition, paired difference vs original
table2                 table  infinitebench          InfiniteBench per task: official metric, original vs relay, paired
                                                     delta
table6                 table  question_types         accuracy per question type
table7                 table  finch_comparison       FINCH (own coordinates) vs selectors + relay, paired differences
                                                     to FINCH
table8                 table  paired_settings        paired RoPERelay - original difference per setting, sign counts
relay_gain             figure paired_settings        Table 8 drawn: relay - original per setting (e.g. per press),
                                                     sorted
table10                table  summarization          HelloEval quality / factuality / coverage, length, EOS rate per
                                                     setting
table11                table  summarization          the same checklist scores per source category
cross_judge            table  cross_judge            gain under each judge, agreement and Cohen's kappa
judge_agreement        table  judge_agreement        each judge vs contains per condition: accuracies, agreement,
                                                     kappa, 2x2
longmemeval_metrics    table  longmemeval_metrics    LongMemEval's own metrics (judge_lme): per type, task-averaged,
                                                     overall, abstention
layer_bands            table  evidence_reading       evidence reading by early / middle / late band (deltas vs
                                                     original)
evidence_bands         table  evidence_bands         Figure 6 per band: paired share differences vs original,
                                                     intervals, win:loss
table3                 table  overhead               complete-request time per condition and overhead over original
answering              table  answering              empty answers, first-token end-of-answer probability, accuracy
                                                     over non-empty
figure3                figure budget_curves          accuracy vs budget, one panel per selector, original vs relay
figure4                figure coordinate_ablation    per-condition means and paired differences vs original, band
                                                     deltas
figure5                figure ordering               source / score / reverse / RandomMean and the seed spread
ordering_table         table  ordering               Figure 5's numbers: means, paired differences vs original and vs
                                                     relay
figure6                figure evidence_reading       evidence reading per layer + the compaction(alpha) curve
figure6_attribution    figure evidence_attribution   Figure 6's companion: attribution of the answer to the evidence
alignment              figure alignment              relay (right-aligned) vs rank_sync (left-aligned)
layer_scope            figure layer_scope            relay per band / layer type vs original; per-layer causal sweep
                                                     curves
learned_geometry       figure learned_geometry       learned b, s, alpha per layer vs relay; train/test curves; learned
                                                     vs relay
learned_table          table  learned_geometry       learned vs relay and original on the test records, paired
                                                     intervals
positional_sensitivity figure positional_sensitivity d log p / d b and d / d s per layer x kv head, per condition
history_length         figure history_length         relay - original accuracy and evidence share vs history length
                                                     (runs)
history_length_table   table  history_length         the same numbers with win:loss counts
framing                figure framing                accuracy, empty answers, first-token EOS per framing cell,
                                                     original vs relay
framing_table          table  framing                the same per cell and condition with hit-limit rate, paired vs
                                                     original / none
====================== ====== ====================== ==================================================================

Example:
    >>> sorted(REGISTRY)  # doctest: +NORMALIZE_WHITESPACE
    ['alignment', 'answering', 'cross_judge', 'evidence_bands', 'figure3', 'figure4', 'figure5', 'figure6',
     'figure6_attribution', 'framing', 'framing_table', 'history_length', 'history_length_table', 'judge_agreement',
     'layer_bands', 'layer_scope', 'learned_geometry', 'learned_table', 'longmemeval_metrics', 'ordering_table',
     'positional_sensitivity', 'relay_gain', 'table1', 'table10', 'table11', 'table2', 'table3', 'table6', 'table7',
     'table8']
"""

from __future__ import annotations

from relaylens.reporting.figures import (  # noqa: F401 - importing a figure file registers its entries
    alignment,
    answering,
    budget_curves,
    coordinate_ablation,
    cross_judge,
    evidence_attribution,
    evidence_bands,
    evidence_reading,
    finch_comparison,
    framing,
    history_length,
    infinitebench,
    judge_agreement,
    layer_scope,
    learned_geometry,
    longmemeval_metrics,
    main_table,
    ordering,
    overhead,
    paired_settings,
    positional_sensitivity,
    question_types,
    summarization,
)
from relaylens.reporting.figures.registry import (
    COMPANIONS,
    ORDER,
    REGISTRY,
    FigureEntry,
    FigureError,
    build,
    names,
    select_figures,
    supported,
)
from relaylens.reporting.figures.writer import write_entry, write_figures

REGISTRY.reorder(ORDER)  # iteration order = drawing order (ORDER first, then registration order, then plugins)

__all__ = ["REGISTRY", "ORDER", "COMPANIONS", "FigureEntry", "FigureError", "build", "names", "select_figures",
           "supported", "write_entry", "write_figures"]
