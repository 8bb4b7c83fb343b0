"""Error types raised by relaylens.

Every error derives from :class:`RelaylensError` *and* from :class:`ValueError`, so callers that only know
``ValueError`` still catch them. Messages say what was expected, what arrived and how to fix it.

Example:
    >>> issubclass(ShapeError, RelaylensError), issubclass(RelaylensError, ValueError)
    (True, True)
"""

from __future__ import annotations


class RelaylensError(ValueError):
    """Base class of every relaylens input error."""


class PositionError(RelaylensError):
    """Positions that are unsorted, duplicated, negative or past the rotary range."""


class ShapeError(RelaylensError):
    """Tensors, masks or selections whose shapes disagree."""


class RopeError(RelaylensError):
    """A rotary embedding type or layout relaylens cannot relocate exactly."""


class TooShortError(ShapeError):
    """A history not longer than a selector's observation window: the record cannot run under that selector (a run
    records it as skipped, ``too_short``)."""


class BudgetError(RelaylensError):
    """A budget outside (0, 1] as a ratio, or not a positive number of states."""


class RecordError(RelaylensError):
    """A malformed dataset record; the message names the file, the record and the field."""


class NonFiniteError(RelaylensError):
    """A cache (keys or values) holding NaN or inf, or a relocation whose result would overflow the cache dtype."""


class ModelError(RelaylensError):
    """A model spec that names nothing loadable: unknown embedded name, missing path, unpulled model offline, a
    damaged cached copy."""
