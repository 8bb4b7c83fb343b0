"""The GPU test tier (``make test-gpu``): exactness on an accelerator in float32, bfloat16 and float16.

Every test here is skipped, with the reason, where CUDA is absent, so ``make test`` is unchanged on a CPU machine.
``RELAYLENS_GPU_TIER_DEVICE=cpu`` runs the tier on the CPU instead (a dry run of the tests themselves, float32 and
bfloat16 only)."""

from __future__ import annotations

import os

import pytest
import torch

FORCED = os.environ.get("RELAYLENS_GPU_TIER_DEVICE")
DEVICE = FORCED or "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def pytest_collection_modifyitems(config, items):
    if FORCED or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU tier: no CUDA device (torch.cuda.is_available() is False); run it with "
                                   "`make test-gpu` on a GPU machine, or RELAYLENS_GPU_TIER_DEVICE=cpu for a dry run")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def dtype(request):
    if DEVICE == "cpu" and request.param == torch.float16:
        pytest.skip("float16 matrix products are not what a CPU dry run checks")
    return request.param


@pytest.fixture
def device():
    return DEVICE
