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

May import: :mod:`relaylens.errors`, :mod:`relaylens.registry`, :mod:`relaylens.results`, :mod:`relaylens.scoring`
(agreement statistics) and :mod:`relaylens.conditions` (labels, bands). Importing this package imports no torch.

Exports the stage contract, each name loaded on first use (importing this package imports no matplotlib either):
:func:`build` (one registered figure or table by name from a run's tables), :func:`write_figures` (every figure of a
run into its directory), :func:`render_report` and :func:`write_report` (the HTML report), :func:`show_view` (the
token view in a notebook), :func:`accuracy_table` and :func:`layer_table` (the summaries figures are drawn from).

Example:
    >>> from relaylens.reporting import build
    >>> build.__module__
    'relaylens.reporting.figures.registry'
"""

import importlib

_HOMES = {
    "figures": ("build", "write_figures"),
    "report": ("render_report", "write_report"),
    "token_view": ("show_view",),
    "summaries": ("accuracy_table", "layer_table"),
}
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _HOMES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
