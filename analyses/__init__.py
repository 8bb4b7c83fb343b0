"""One module per experiment of the paper: its ``SPEC`` and the figures/tables it feeds.

``relaylens run NAME`` sweeps ``analyses.NAME.SPEC``; ``relaylens figures RUN_DIR`` draws the figures named in
``SPEC.figures`` from the run's tables only.
"""
