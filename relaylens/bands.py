"""Early / middle / late layer bands and band aggregates (torch-free: figures and probes share it).

Example:
    >>> bands(9)
    {'early': [0, 1, 2], 'middle': [3, 4, 5], 'late': [6, 7, 8]}
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relaylens.errors import RelaylensError

#: metrics that are probability shares: their band deltas are reported in percentage points
SHARE_METRICS = ("evidence_share", "history_share", "replay_gold_share", "evidence_grad_x_input_share")


def bands(num_layers: int, boundaries: tuple[int, int] | None = None) -> dict[str, list[int]]:
    """Early / middle / late layer bands: thirds by default, or ``boundaries=(b1, b2)`` as ``[0,b1) [b1,b2) [b2,N)``.

    """
    if boundaries is None:
        parts = np.array_split(np.arange(num_layers), 3)
    else:
        b1, b2 = boundaries
        if not 0 < b1 < b2 < num_layers:
            raise RelaylensError(f"band boundaries must satisfy 0 < b1 < b2 < {num_layers}; got {boundaries}")
        parts = [np.arange(0, b1), np.arange(b1, b2), np.arange(b2, num_layers)]
    return {name: [int(i) for i in part] for name, part in zip(("early", "middle", "late"), parts)}


def band_of(num_layers: int, boundaries: tuple[int, int] | None = None) -> dict[int, str]:
    """``layer -> band name``."""
    return {layer: name for name, layers in bands(num_layers, boundaries).items() for layer in layers}


def band_table(frame: pd.DataFrame, num_layers: int, keys: list[str], boundaries: tuple[int, int] | None = None,
               reference: str = "original") -> pd.DataFrame:
    """Mean of each metric per band (layers, then heads pooled) and its difference against ``reference``.

    ``frame`` has columns ``keys + ["condition", "layer", "head", "metric", "value"]``; ``delta`` is in the
    metric's units, ``delta_pp`` = 100 x delta for share metrics (NaN otherwise).
    """
    data = frame.assign(band=frame["layer"].map(band_of(num_layers, boundaries)))
    per_layer = data.groupby(keys + ["condition", "metric", "band", "layer"], dropna=False)["value"].mean().reset_index()
    table = per_layer.groupby(keys + ["condition", "metric", "band"], dropna=False)["value"].mean().reset_index()
    base = table[table["condition"] == reference].drop(columns="condition").rename(columns={"value": "reference_value"})
    table = table.merge(base, on=keys + ["metric", "band"], how="left")
    table["delta"] = table["value"] - table["reference_value"]
    table["delta_pp"] = np.where(table["metric"].isin(SHARE_METRICS), 100.0 * table["delta"], np.nan)
    return table
