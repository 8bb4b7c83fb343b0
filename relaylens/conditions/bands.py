"""Early / middle / late layer bands: the thirds of a model's layers that scopes (``relay@band=late``), probes and
figures share (plain Python: no torch, no pandas).

Example:
    >>> bands(8)
    {'early': [0, 1, 2], 'middle': [3, 4, 5], 'late': [6, 7]}
    >>> bands(8, boundaries=(2, 6))["middle"], band_of(4)[3]
    ([2, 3, 4, 5], 'late')
"""

from __future__ import annotations

from relaylens.errors import RelaylensError

BANDS = ("early", "middle", "late")
"""The layer bands, in order: the thirds of a model's layers (``relay@band=late``, the band tables)."""


def bands(num_layers: int, boundaries: tuple[int, int] | None = None) -> dict[str, list[int]]:
    """Early / middle / late layer bands: thirds by default (the first ``num_layers % 3`` bands one layer longer, as
    ``numpy.array_split``), or ``boundaries=(b1, b2)`` as ``[0,b1) [b1,b2) [b2,N)``."""
    if boundaries is None:
        size, extra = divmod(num_layers, 3)
        ends = [size * (k + 1) + min(k + 1, extra) for k in range(3)]
        starts = [0] + ends[:2]
    else:
        b1, b2 = boundaries
        if not 0 < b1 < b2 < num_layers:
            raise RelaylensError(f"band boundaries must satisfy 0 < b1 < b2 < {num_layers}; got {boundaries}")
        starts, ends = [0, b1, b2], [b1, b2, num_layers]
    return {name: list(range(start, end)) for name, start, end in zip(BANDS, starts, ends)}


def band_of(num_layers: int, boundaries: tuple[int, int] | None = None) -> dict[int, str]:
    """``layer -> band name``."""
    return {layer: name for name, layers in bands(num_layers, boundaries).items() for layer in layers}
