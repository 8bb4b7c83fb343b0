"""What kvpress press arguments may be, and what a press needs of the history (kvpress 0.5.5).

kvpress's presses check almost none of their arguments: ``SnapKVPress(window_size=0)`` scores with no observation
window, an even ``kernel_size`` changes the length of the pooled scores, ``LagKVPress`` on a history shorter than
two partitions silently keeps only the most recent states. relaylens checks them in two places:

* when the selector is built (:func:`check_argument`, from :meth:`~relaylens.selectors.kvpress_adapter.KvPress.build`,
  so ``--selector kvpress:SnapKVPress:window_size=0`` fails when parsed, before the model loads): each argument in
  :data:`RANGES` against its range (sizes at least 1, sink counts at least 0, ratios in [0, 1], finite numbers);
* when a record is selected (:func:`history_problem`): the windows and sinks against the record's history length,
  which only the record knows. The runner records such a unit as skipped (``too_short``), naming record and press.

Example:
    >>> check_argument("kvpress:SnapKVPress", "window_size", 16, 64)
    >>> check_argument("kvpress:SnapKVPress", "kernel_size", 4, 5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    relaylens.selectors.kvpress_pass.PressError: kvpress:SnapKVPress: kernel_size=4 is out of range: ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relaylens.selectors.kvpress_pass import PressError

__all__ = ["Bound", "RANGES", "check_argument", "history_problem"]


@dataclass(frozen=True)
class Bound:
    """The values one press argument may take: at least ``low`` (above it when ``low_open``), at most ``high``,
    odd when ``odd``; always finite. ``why`` says what the argument is."""

    low: float
    high: float = math.inf
    low_open: bool = False
    odd: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:
        """Whether ``value`` is inside the bound."""
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high and (not self.odd or int(value) % 2 == 1)

    def describe(self) -> str:
        """The bound in words: ``"a whole number >= 1"``, ``"a number in [0, 1]"``, ``"a number > 0"``."""
        if self.high != math.inf:
            return f"a number in [{self.low:g}, {self.high:g}]"
        if self.low_open:
            return f"a number > {self.low:g}"
        return f"{'an odd' if self.odd else 'a'} whole number >= {self.low:g}"


_SINKS = "states at the start always kept"
#: every numeric argument of the supported scorer presses (kvpress 0.5.5) with its range
RANGES: dict[str, Bound] = {
    "window_size": Bound(1, why="the observation window: the last window_size queries score the history"),
    "kernel_size": Bound(1, odd=True, why="the pooling kernel; an even one changes the length of the pooled scores"),
    "beta": Bound(1, why="the pyramid's steepness; kvpress requires beta >= 1"),
    "n_future_positions": Bound(1, why="the future query positions averaged over"),
    "n_sink": Bound(0, why=_SINKS),
    "num_sinks": Bound(0, why=_SINKS),
    "sink_size_start": Bound(0, why=_SINKS),
    "sink_size_end": Bound(0, why="states at the end always kept"),
    "lag_size": Bound(1, why="the partition length"),
    "chunk_size": Bound(1, why="the attention chunk length"),
    "sketch_dimension": Bound(1, why="the sketch's width"),
    "local_window_size": Bound(1, why="the local normalisation window"),
    "epsilon": Bound(0, why="added to the scores before rescaling"),
    "tau": Bound(0, low_open=True, why="the softmax temperature of the query weights"),
    "blending": Bound(0, 1, why="the weight of the attention scores against the leverage scores"),
    "first_stage_ratio": Bound(0, 1, why="the share of the budget the first stage selects"),
}


def check_argument(label: str, key: str, value, default=None) -> None:
    """Raise :class:`~relaylens.selectors.kvpress_pass.PressError` (one line naming ``label``, the argument, the value,
    its range and the fix) when ``value`` is outside ``RANGES[key]``; ``None`` (an optional argument) and
    arguments without a range pass. ``default`` is the press's own default, quoted in the fix."""
    bound = RANGES.get(key)
    if bound is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if bound.holds(value):
        return
    example = default if isinstance(default, (int, float)) and not isinstance(default, bool) else None
    fix = (f"e.g. {label}:{key}={example} (kvpress's default)" if example is not None and bound.holds(example)
           else f"give {key} as {bound.describe()}")
    raise PressError(f"{label}: {key}={value!r} is out of range: it must be {bound.describe()} ({bound.why}). "
                     f"Fix: {fix}")


def _whole(press, attr: str) -> int | None:
    value = getattr(press, attr, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def history_problem(press, length: int) -> str | None:
    """Why the built kvpress ``press`` cannot score a ``length``-token history (a window or sink count that reaches
    past it), or None. An inner press (``CriticalKVPress(press=...)``) is checked too."""
    for attr in ("window_size", "n_sink", "num_sinks"):
        value = _whole(press, attr)
        if value is not None and value >= length:
            return f"needs a history longer than its {attr}={value}"
    start, end = _whole(press, "sink_size_start"), _whole(press, "sink_size_end")
    if start is not None and end is not None and start + end >= length:
        return (f"keeps sink_size_start + sink_size_end = {start + end} states outside its selection, which needs a "
                "history longer than that")
    lag = _whole(press, "lag_size")
    if lag is not None and (_whole(press, "n_sink") or 0) + 2 * lag > length:
        need = (_whole(press, "n_sink") or 0) + 2 * lag
        return (f"needs n_sink + 2 x lag_size = {need} history tokens (it scores each lag_size partition against the "
                "next one; with fewer it would only keep the most recent states)")
    inner = getattr(press, "press", None)
    return history_problem(inner, length) if inner is not None and not isinstance(inner, str) else None
