"""One module per experiment of the paper: its ``SPEC`` and the figures/tables it feeds.

Imported only as ``relaylens.analyses`` (this folder of the package), never as a top-level ``analyses``.
``relaylens run NAME`` sweeps ``relaylens.analyses.NAME.SPEC``; ``relaylens figures RUN_DIR`` draws the figures named in
``SPEC.figures`` from the run's tables only.
"""
