"""Pytest set-up shared by the package's docstring examples (``relaylens/``) and the tests (``tests/``)."""

import os

# `make test` runs two workers on two cores, and the tests' tensors are small: one torch thread per process avoids
# oversubscription, under which small tensor operations were measured to slow down by two orders of magnitude.
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the CLI subprocesses some tests start
