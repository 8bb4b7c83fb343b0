"""Helpers shared by tests/probes/test_transformer_lens.py and its model tier (not a test module)."""

from __future__ import annotations

import numpy as np

KEYS = ["probe_point", "layer", "head", "metric"]


def disagreement(a, b) -> float:
    """Max |a - b| over matching readout rows; the row sets and NaN positions (no gold kept) must be identical."""
    assert len(a) == len(b) and len(a) > 0
    merged = a.merge(b, on=KEYS, suffixes=("_a", "_b"), validate="one_to_one")
    assert len(merged) == len(a), "the backends produced different readout rows"
    x, y = merged.value_a.to_numpy(), merged.value_b.to_numpy()
    assert np.array_equal(np.isnan(x), np.isnan(y))
    keep = ~np.isnan(x)
    return float(np.abs(x[keep] - y[keep]).max())
