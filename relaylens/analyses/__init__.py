"""One module per experiment of the paper: its ``SPEC``, its ``PRESETS`` and the figures/tables it feeds, gathered in
its record ``ANALYSIS`` (:class:`relaylens.experiments.analysis.Analysis`, which ``load_analysis(NAME)`` returns).

Imported only as ``relaylens.analyses`` (this folder of the package), never as a top-level ``analyses``.
``relaylens run NAME`` sweeps ``relaylens.analyses.NAME.SPEC`` (or runs the record's own ``run``); ``relaylens
figures RUN_DIR`` draws the figures named in ``SPEC.figures`` from the run's tables only.
"""
