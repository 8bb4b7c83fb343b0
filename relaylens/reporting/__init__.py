"""The reporting stage: every statistic of the result tables, plots, the paper's figures and tables (one file per
analysis in :mod:`~relaylens.reporting.figures`) and the self-contained per-layer HTML report. No torch.

Owns, bottom to top (a staircase: each imports only those before it): :mod:`~relaylens.reporting.bootstrap` (paired
cluster bootstrap), :mod:`~relaylens.reporting.retention` (did the selection keep the evidence?),
:mod:`~relaylens.reporting.crossrun` (several runs as one grid; the metric each table reads),
:mod:`~relaylens.reporting.overhead` (Table 3 from run tables), :mod:`~relaylens.reporting.summaries` (means,
paired differences, band tables), :mod:`~relaylens.reporting.htmlsafe`, :mod:`~relaylens.reporting.plots`,
:mod:`~relaylens.reporting.figures`, :mod:`~relaylens.reporting.token_view` and :mod:`~relaylens.reporting.report`
(one Jinja2 template in ``templates/``).

In: the tables of a run directory (:func:`relaylens.results.store.load_tables`) and its manifest. Out: figures
(PDF / PNG / SVG, byte-stable), Markdown/CSV tables, ``report.html``.

May import: :mod:`relaylens.errors`, :mod:`relaylens.results`, :mod:`relaylens.scoring` (agreement statistics) and
:mod:`relaylens.conditions` (labels, bands). Importing this package imports no torch.
"""
