"""Coordinate conditions: where each kept key sits in rotary-position space, and where the question starts.

Every condition maps one :class:`~relaylens.geometry.selection.Selection` (kept source positions ``p`` per layer and kv
head, ``m = m[l, h]`` of them, ``M = max m``) and the history length ``L`` to

* ``key_positions`` ``[layer, kv_head, slot]`` long: the target position of every kept key (``-1`` in padding);
* ``question_start``: the position of the first question token. Question tokens take ``question_start + j``;
  generation continues consecutively after the last question token.

Real-valued coordinates: a condition may place keys (and the question) at floating-point positions
(``key_positions`` float64, e.g. the geometry family of :mod:`relaylens.conditions.family`); relocation and the
question pass then use the real-valued phases of :mod:`relaylens.geometry.real`. Every condition of this table is
integer-valued and takes the integer path unchanged.

Values, selection and counts are never changed; only the phases keys carry move.

| name | key positions | question starts at |
|---|---|---|
| ``original`` | ``p_i`` | ``L`` |
| ``relay`` | ``M - m + i`` (right-aligned at ``M - 1``) | ``M`` |
| ``rank_sync`` | ``i`` (left-aligned) | ``M`` |
| ``key_only`` | ``M - m + i`` | ``L`` |
| ``key_only(k)`` | ``M - m + i`` | ``k L - (k - 1) M``: where ``dilation(k)`` puts it (``k >= 1``) |
| ``query_only(shift)`` | ``p_i`` | ``L + shift`` |
| ``common_shift(shift)`` | ``p_i + shift`` | ``L + shift`` |
| ``compaction(alpha)`` | ``floor((1-alpha) p_i + alpha (M-m+i) + 0.5)`` | ``floor((1-alpha) L + alpha M + 0.5)`` |
| ``half_gap`` | ``compaction(0.5)`` | as above |
| ``dilation(k)`` | ``compaction(1 - k)`` plus one common shift to 0 (``k >= 1``) | as compaction, plus the shift |
| ``score_order`` | relay slots filled by ascending score (ties: source order) | ``M`` |
| ``reverse_order`` | relay slots in reversed source order | ``M`` |
| ``random_order(seed)`` | relay slots by a seeded permutation per head | ``M`` |

Example (the worked example of the design notes, head B of ``L = 20``, ``M = 6``):
    >>> from relaylens.geometry.selection import Selection
    >>> sel = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]], history_length=20)
    >>> coords = parse_condition("half_gap").coordinates(sel)
    >>> coords.key_positions[0, 1, :4].tolist(), coords.question_start
    ([1, 6, 11, 12], 13)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaylens.errors import NonFiniteError, PositionError, RelaylensError
from relaylens.registry import Registry

if TYPE_CHECKING:  # importing the catalogue imports no torch; coordinates are computed on torch selections
    import torch

    from relaylens.geometry.selection import Selection


@dataclass(frozen=True)
class Coordinates:
    """Target coordinates of one condition on one selection.

    ``key_positions`` is long for integer conditions, float64 for real-valued ones (it may then carry autograd:
    gradients w.r.t. positions); ``question_start`` an int, a float, or a 0-d float64 tensor (autograd).
    ``at_question``: a kept key may sit at the question start itself (the ``move=`` clause; see
    :func:`check_coordinates`), so every later check of these coordinates allows it too.
    """

    condition: str
    key_positions: torch.Tensor  # [layer, kv_head, slot] long (or float64), -1 in padded slots
    question_start: int | float | torch.Tensor
    at_question: bool = False

    @property
    def real(self) -> bool:
        """Whether any position is real-valued (floating point)."""
        import torch  # noqa: PLC0415 - torch-free room

        return self.key_positions.is_floating_point() or not isinstance(self.question_start, int) \
            and (isinstance(self.question_start, torch.Tensor) or not float(self.question_start).is_integer())

    def question_positions(self, num_question_tokens: int) -> torch.Tensor:
        """``[Q]`` positions of the question tokens (long; float64 for a real-valued question start)."""
        import torch  # noqa: PLC0415 - torch-free room

        if isinstance(self.question_start, int):
            return torch.arange(self.question_start, self.question_start + num_question_tokens)
        return self.question_start + torch.arange(num_question_tokens, dtype=torch.float64)


def _slot_index(sel: Selection) -> torch.Tensor:
    import torch  # noqa: PLC0415 - torch-free room

    return torch.arange(sel.positions.shape[-1]).expand_as(sel.positions)  # [layer, kv_head, slot]


def _compact(sel: Selection) -> torch.Tensor:
    """``M - m + i``: relay slots, right-aligned so every head ends at ``M - 1``."""
    counts = sel.counts[..., None]  # [layer, kv_head, 1]
    return sel.max_count - counts + _slot_index(sel)


def make_coordinates(name: str, sel: Selection, key_positions: torch.Tensor, question_start, *,
                     at_question: bool = False) -> Coordinates:
    """:class:`Coordinates` named ``name``: ``key_positions`` ``[layer, kv_head, slot]`` where the selection is valid,
    ``-1`` in its padded slots; checked by :func:`check_coordinates` (``at_question``: see there). Floating-point
    positions stay real-valued (float64, autograd kept); a question start with an integer value becomes an int."""
    import torch  # noqa: PLC0415 - torch-free room

    from relaylens.geometry.selection import PAD_POSITION  # noqa: PLC0415 - torch-free room

    check_coordinates(name, key_positions, sel.valid, question_start, at_question=at_question)
    if not _real_coordinates(key_positions, question_start):  # the integer path, as every catalogue condition takes
        key_positions = torch.where(sel.valid, key_positions.long(),
                                    torch.full_like(key_positions, PAD_POSITION, dtype=torch.long))
        return Coordinates(name, key_positions, int(question_start), at_question)
    if key_positions.is_floating_point():
        key_positions = torch.where(sel.valid, key_positions.double(),
                                    torch.full_like(key_positions, PAD_POSITION, dtype=torch.float64))
    else:
        key_positions = torch.where(sel.valid, key_positions.long(),
                                    torch.full_like(key_positions, PAD_POSITION, dtype=torch.long))
    if not isinstance(question_start, torch.Tensor) and float(question_start).is_integer():
        question_start = int(question_start)
    return Coordinates(name, key_positions, question_start, at_question)


def _real_coordinates(key_positions: torch.Tensor, question_start) -> bool:
    """Whether coordinates are real-valued: floating-point key positions, a floating-point tensor question start, or
    a question start that is a float with a fraction (an integer-valued float is a whole position)."""
    import torch  # noqa: PLC0415 - torch-free room

    if key_positions.is_floating_point():
        return True
    if isinstance(question_start, bool):
        return False
    if isinstance(question_start, torch.Tensor):
        return question_start.is_floating_point()
    return isinstance(question_start, float) and not question_start.is_integer()


def check_coordinates(name: str, key_positions: torch.Tensor, valid: torch.Tensor, question_start, *,
                      at_question: bool = False) -> None:
    """Refuse coordinates no model can read as intended: every kept key and the question start obey the position
    rule (:func:`relaylens.geometry.positions.check_positions`: integers in ``0 .. 2**24 - 1``), and the question
    starts after every kept key (a question at or before a kept key would read history from its own future).

    Real-valued coordinates (floating-point key positions or question start, :func:`_real_coordinates`) are checked
    by the same rule without being made integers (:func:`_check_real_coordinates`): float32 or float64 (float16 and
    bfloat16 would merge neighbouring positions), finite, ``>= 0``, at most ``2**24 - 1``, and the question start past
    every kept key.

    ``at_question``: a kept key may also sit *at* the question start (query-key distance 0, the distance of the first
    question token to itself), never after it. Only the ``move=`` clause of a scoped condition asks for it: its
    finite shifts move a head's nearest key from distance 1 to 0
    (:func:`relaylens.probes.sensitivity.finite_shift_slopes`).

    >>> import torch
    >>> check_coordinates("query_only(-5)", torch.tensor([[[2, 9]]]), torch.ones(1, 1, 2, dtype=torch.bool), 5)
    Traceback (most recent call last):
    ...
    relaylens.errors.PositionError: condition query_only(-5): the question starts at position 5, but layer 0, kv_head 0, slot 1 keeps a key at position 9; the question must start after every kept key. Fix: start the question after the last kept key (query_only and common_shift take a shift >= 0)
    """  # noqa: E501 - doctest: an exception message is matched on one line
    import torch  # noqa: PLC0415 - torch-free room

    from relaylens.geometry.positions import check_positions  # noqa: PLC0415 - torch-free room

    if _real_coordinates(key_positions, question_start):
        _check_real_coordinates(name, key_positions, valid, question_start, at_question)
        return
    axes = ("layer", "kv_head", "slot")
    kept = torch.where(valid, key_positions, torch.zeros((), dtype=key_positions.dtype))  # padded slots hold no key
    keys, _ = check_positions(kept, f"condition {name}: key positions", axes=axes)
    keys = keys.masked_fill(~valid, -1)  # [layer, kv_head, slot] int64
    if isinstance(question_start, bool) or int(question_start) != question_start:
        raise PositionError(f"condition {name}: the question start must be a whole position; got {question_start!r}")
    check_positions([int(question_start)], f"condition {name}: question positions")
    last = int(keys.max()) if keys.numel() else -1
    if int(question_start) < last or int(question_start) == last and not at_question:
        where = ", ".join(f"{a} {i}" for a, i in zip(axes, torch.nonzero(keys == last)[0].tolist()))
        raise PositionError(f"condition {name}: the question starts at position {int(question_start)}, but {where} "
                            f"keeps a key at position {last}; the question must start after every kept key. Fix: start "
                            "the question after the last kept key (query_only and common_shift take a shift >= 0)")


def _check_real_coordinates(name: str, key_positions: torch.Tensor, valid: torch.Tensor, question_start,
                            at_question: bool = False) -> None:
    """:func:`check_coordinates` for real-valued coordinates: every kept key and the question start are finite, in
    ``0 .. 2**24 - 1`` (:data:`~relaylens.model.hf.POSITION_LIMIT`; the model's own range is checked when its rotary
    moves them, :meth:`~relaylens.geometry.rotary.RotaryFactors.check_real_positions`), and the question starts after
    every kept key. Reads values only (``detach``): autograd is untouched."""
    import torch  # noqa: PLC0415 - torch-free room

    from relaylens.geometry.positions import POSITION_LIMIT, check_real_dtype  # noqa: PLC0415 - torch-free room

    check_real_dtype(key_positions, f"condition {name}: key positions")  # float16 / bfloat16 merge neighbours
    if isinstance(question_start, torch.Tensor):
        check_real_dtype(question_start, f"condition {name}: the question start")
    axes = ("layer", "kv_head", "slot")
    keys = key_positions.detach().to(torch.float64)  # [layer, kv_head, slot]
    kept = torch.where(valid, keys, torch.zeros((), dtype=torch.float64))  # padded slots hold no key

    def where(bad: torch.Tensor) -> str:  # "layer 0, kv_head 1, slot 5": the first True of bad
        return ", ".join(f"{a} {i}" for a, i in zip(axes, torch.nonzero(bad)[0].tolist())) if bad.dim() == 3 else ""

    def at(bad: torch.Tensor) -> str:
        return f" (at {where(bad)})" if bad.dim() == 3 else ""

    if not bool(torch.isfinite(kept).all()):
        raise NonFiniteError(f"condition {name}: key positions contain NaN or inf{at(~torch.isfinite(kept))}; a kept "
                             "key needs a finite position. Fix: check the geometry's parameters (a learned geometry "
                             "that diverged: lower the learning rate)")
    if kept.numel() and float(kept.min()) < 0:
        raise PositionError(f"condition {name}: key positions contain a negative position ({float(kept.min()):g})"
                            f"{at(kept < 0)}; positions start at 0. Fix: give positions >= 0")
    if kept.numel() and float(kept.max()) > POSITION_LIMIT - 1:
        raise PositionError(f"condition {name}: key positions reach position {float(kept.max()):g}"
                            f"{at(kept > POSITION_LIMIT - 1)}, past 2**24 - 1: the rotary embedding computes phases "
                            "from float32 positions, which cannot tell positions apart from there on. Fix: use a "
                            "smaller shift or a shorter history, or a model with a longer context")
    if isinstance(question_start, bool):
        raise PositionError(f"condition {name}: the question start must be a position; got {question_start!r}")
    start = question_start.detach() if isinstance(question_start, torch.Tensor) else question_start
    try:
        start = float(start)
    except (TypeError, ValueError, RuntimeError):  # not a number, or a tensor of more than one value
        raise PositionError(f"condition {name}: the question start must be one position; "
                            f"got {question_start!r}") from None
    if not math.isfinite(start):
        raise NonFiniteError(f"condition {name}: the question start is {start}; it needs a finite position")
    if start < 0 or start > POSITION_LIMIT - 1:
        raise PositionError(f"condition {name}: the question starts at position {start:g}, outside 0 .. 2**24 - 1 (the "
                            "positions the rotary embedding's float32 positions tell apart). Fix: start the question "
                            "at a position >= 0 and below 2**24")
    masked = torch.where(valid, keys, torch.full_like(keys, -math.inf))
    last = float(masked.max()) if bool(valid.any()) else -math.inf
    if start < last or start == last and not at_question:
        raise PositionError(f"condition {name}: the question starts at position {start:g}, but "
                            f"{where(masked == last) or 'a head'} keeps a key at position {last:g}; the question must "
                            "start after every kept key. Fix: start the question after the last kept key")


class Condition:
    """Base of all conditions: a frozen dataclass with a ``label`` and ``coordinates(selection)``.

    ``name`` is its name in :data:`CONDITIONS`; ``parameter`` the ``(field, type)`` that ``NAME(value)`` sets (e.g.
    ``("shift", int)`` for ``query_only(2048)``), or None for a condition that takes no parameter."""

    name: str = ""
    parameter: tuple[str, type] | None = None

    @property
    def label(self) -> str:
        return self.name

    def coordinates(self, sel: Selection) -> Coordinates:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Original(Condition):
    """Kept keys stay at their source positions; the question starts at ``L``."""

    name = "original"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, sel.positions, sel.history_length)


@dataclass(frozen=True)
class Relay(Condition):
    """RoPERelay: keys at compact right-aligned slots ``M - m + i``; the question starts at ``M``."""

    name = "relay"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, _compact(sel), sel.max_count)


@dataclass(frozen=True)
class RankSync(Condition):
    """Left-aligned compact slots ``i``; the question starts at ``M`` (shorter heads leave a gap)."""

    name = "rank_sync"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, _slot_index(sel), sel.max_count)


@dataclass(frozen=True)
class KeyOnly(Condition):
    """Keys compacted as in ``relay``, the question left at ``L``; ``key_only(k)`` (``k >= 1``) leaves it where
    ``dilation(k)`` puts it, ``k L - (k - 1) M``: key-only compaction inside a history ``k`` times longer.

    >>> from relaylens.geometry.selection import Selection
    >>> sel = Selection.from_lists([[[2, 5, 6]]], history_length=10)
    >>> KeyOnly().coordinates(sel).question_start, KeyOnly(3).coordinates(sel).question_start, KeyOnly(3).label
    (10, 24, 'key_only(3)')
    """

    k: float = 1.0
    name = "key_only"
    parameter = ("k", float)

    def __post_init__(self) -> None:
        _check_stretch(self, "key_only(4) leaves the question where dilation(4) puts it")

    @property
    def label(self) -> str:
        return "key_only" if float(self.k) == 1.0 else f"key_only({exact_number(self.k)})"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, _compact(sel), _round_half_up(_stretched_start(sel, self.k)))


def _check_stretch(condition: Condition, fix: str) -> None:
    """``k`` of a condition that stretches the history (``dilation``, ``key_only``): a finite number >= 1."""
    if not (math.isfinite(float(condition.k)) and float(condition.k) >= 1.0):
        raise RelaylensError(f"{condition.name} k must be a finite number >= 1 (how many times longer the history "
                             f"is); got {condition.k}. Fix: {fix}")


def _stretched_start(sel: Selection, k: float) -> float:
    """``k L - (k - 1) M``: the question start of a history ``k`` times longer (``L`` at ``k = 1``), before rounding."""
    k = float(k)
    return k * sel.history_length + (1.0 - k) * sel.max_count


def _check_shift(condition: Condition) -> None:
    """A shift is a whole number of positions >= 0: it moves the question (and, for ``common_shift``, the keys) past
    the history. A negative one would put the question at or before kept keys (the last history token is kept by every
    windowed selector) or keys before position 0."""
    shift = condition.shift
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise RelaylensError(f"condition {condition.name}({shift!r}): the shift must be a whole number of positions >= "
                             f"0 (it moves the question past the history); got {shift!r}. Fix: e.g. "
                             f"{condition.name}(2048)")


@dataclass(frozen=True)
class QueryOnly(Condition):
    """Keys at their source positions, the question moved to ``L + shift`` (``shift >= 0``)."""

    shift: int = 2048
    name = "query_only"
    parameter = ("shift", int)

    def __post_init__(self) -> None:
        _check_shift(self)

    @property
    def label(self) -> str:
        return f"query_only({self.shift})"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, sel.positions, sel.history_length + self.shift)


@dataclass(frozen=True)
class CommonShift(Condition):
    """Keys and question both shifted by ``shift >= 0``: relative positions unchanged (a RoPE invariance control)."""

    shift: int = 2048
    name = "common_shift"
    parameter = ("shift", int)

    def __post_init__(self) -> None:
        _check_shift(self)

    @property
    def label(self) -> str:
        return f"common_shift({self.shift})"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, sel.positions + self.shift, sel.history_length + self.shift)


def exact_number(value) -> str:
    """``value`` as the shortest text that parses back to the very same float: ``%g`` where it is exact (``0.5``,
    ``1``), else ``repr`` (``0.12345678``); labels built from it never merge two conditions.

    >>> exact_number(1.0), exact_number(0.1234567), exact_number(0.12345678), exact_number(2e-9)
    ('1', '0.1234567', '0.12345678', '2e-09')
    """
    value = float(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _round_half_up(x: torch.Tensor | float):
    import torch  # noqa: PLC0415 - torch-free room

    if isinstance(x, torch.Tensor):
        return torch.floor(x + 0.5).long()
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class Compaction(Condition):
    """Every gap scaled by ``1 - alpha``: ``alpha = 0`` is ``original``, ``alpha = 1`` is ``relay``."""

    alpha: float = 0.5
    name = "compaction"
    parameter = ("alpha", float)

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise RelaylensError(f"compaction alpha must lie in [0, 1]; got {self.alpha}")

    @property
    def label(self) -> str:
        return f"compaction({exact_number(self.alpha)})"

    def coordinates(self, sel: Selection) -> Coordinates:
        alpha = float(self.alpha)
        mixed = (1.0 - alpha) * sel.positions.double() + alpha * _compact(sel).double()
        start = (1.0 - alpha) * sel.history_length + alpha * sel.max_count
        return make_coordinates(self.label, sel, _round_half_up(mixed), _round_half_up(start))


@dataclass(frozen=True)
class HalfGap(Compaction):
    """``compaction(0.5)``: every gap halved."""

    alpha: float = 0.5
    name = "half_gap"
    parameter = None  # compaction(0.5) by name: half_gap(...) takes no parameter

    @property
    def label(self) -> str:
        return "half_gap"


@dataclass(frozen=True)
class Dilation(Condition):
    """The kept keys where they would sit in a history ``k`` times longer: every gap's room beyond adjacency scaled by
    ``k >= 1`` (``compaction(1 - k)``: adjacent kept states stay adjacent), the question after them at the scaled gap,
    then every position shifted by one common amount so the smallest is 0 (RoPE sees relative positions only).
    ``dilation(1)`` is ``original``. What it stands in for: relative distance alone; the kept states were still
    computed in the shorter context.

    >>> from relaylens.geometry.selection import Selection
    >>> coords = Dilation(3).coordinates(Selection.from_lists([[[2, 5, 6]]], history_length=10))
    >>> coords.key_positions[0, 0].tolist(), coords.question_start
    ([6, 13, 14], 24)
    """

    k: float = 4.0
    name = "dilation"
    parameter = ("k", float)

    def __post_init__(self) -> None:
        _check_stretch(self, "dilation(4) places the kept keys as in a history 4 times longer")

    @property
    def label(self) -> str:
        return f"dilation({exact_number(self.k)})"

    def coordinates(self, sel: Selection) -> Coordinates:
        import torch  # noqa: PLC0415 - torch-free room

        k = float(self.k)
        spread = k * sel.positions.double() + (1.0 - k) * _compact(sel).double()  # [layer, kv_head, slot]
        keys, question = _round_half_up(spread), _round_half_up(_stretched_start(sel, k))
        valid = keys[sel.valid]
        lowest = int(valid.min()) if valid.numel() else 0
        shift = max(0, -lowest)  # one common shift: every query-key distance is unchanged
        return make_coordinates(self.label, sel, torch.where(sel.valid, keys + shift, keys), question + shift)


def _fill_relay_slots(sel: Selection, order_key: torch.Tensor, name: str) -> Coordinates:
    """Give the state with the r-th smallest ``order_key`` (padding last) relay slot ``M - m + r``."""
    import torch  # noqa: PLC0415 - torch-free room

    key = order_key.double().masked_fill(~sel.valid, math.inf)  # [layer, kv_head, slot]
    order = torch.sort(key, dim=-1, stable=True).indices  # slot indices by ascending key
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, _slot_index(sel).contiguous())  # rank[state] = its place in the order
    return make_coordinates(name, sel, sel.max_count - sel.counts[..., None] + rank, sel.max_count)


@dataclass(frozen=True)
class ScoreOrder(Condition):
    """Relay slots filled by ascending selection score: the highest score sits next to the question."""

    name = "score_order"

    def coordinates(self, sel: Selection) -> Coordinates:
        if sel.scores is None:
            raise RelaylensError("score_order needs per-state selection scores; this selection carries none")
        return _fill_relay_slots(sel, sel.scores, self.label)


@dataclass(frozen=True)
class ReverseOrder(Condition):
    """Relay slots filled in reversed source order (the earliest state sits next to the question)."""

    name = "reverse_order"

    def coordinates(self, sel: Selection) -> Coordinates:
        return _fill_relay_slots(sel, -_slot_index(sel).double(), self.label)


@dataclass(frozen=True)
class RandomOrder(Condition):
    """Relay slots filled by a seeded random permutation per (layer, kv_head). ``RandomMean`` averages seeds."""

    seed: int = 0
    name = "random_order"
    parameter = ("seed", int)

    @property
    def label(self) -> str:
        return f"random_order({self.seed})"

    def coordinates(self, sel: Selection) -> Coordinates:
        import torch  # noqa: PLC0415 - torch-free room

        generator = torch.Generator().manual_seed(int(self.seed))
        noise = torch.rand(sel.positions.shape, generator=generator, dtype=torch.float64)
        return _fill_relay_slots(sel, noise, self.label)


_NAME = re.compile(r"^[a-z_]+$")
ENTRY_POINT_GROUP = "relaylens.conditions"
"""The entry-point group of condition plugins: ``[project.entry-points."relaylens.conditions"] NAME =
"pkg.mod:Class"`` in a distribution's ``pyproject.toml`` makes ``Class`` the condition ``NAME`` (``--condition
NAME``, ``NAME(value)`` when it declares a ``parameter``, and every scope clause)."""


def check_condition_class(name: str, cls) -> None:
    """Refuse what cannot be the condition ``name``: no :class:`Condition` subclass, a name the spec grammar cannot
    read (lower-case letters and underscores), a class whose own ``name`` differs (labels must parse back), or a
    ``parameter`` that is not ``(field, int | float)``."""
    if not (isinstance(cls, type) and issubclass(cls, Condition)):
        raise RelaylensError(f"condition {name!r} is {cls!r}, not a Condition class. Fix: point it at a frozen "
                             "dataclass subclassing relaylens.conditions.Condition")
    if not _NAME.match(name) or cls.name != name:
        raise RelaylensError(f"condition {name!r}: a condition name is lower-case letters and underscores, and the "
                             f"class's own name ({cls.name!r}) must be it (labels parse back to the condition). Fix: "
                             f"register {cls.__name__} under its name, or set name = {name!r} on it")
    parameter = cls.parameter
    if parameter is not None and not (isinstance(parameter, tuple) and len(parameter) == 2
                                      and isinstance(parameter[0], str) and parameter[1] in (int, float)):
        raise RelaylensError(f"condition {name!r}: parameter must be None or (field name, int or float); got "
                             f"{parameter!r}")


CONDITIONS: Registry[type[Condition]] = Registry("condition", entry_point_group=ENTRY_POINT_GROUP,
                                                 check=check_condition_class)
"""Every coordinate condition class by name (the catalogue ``get_condition`` and ``--condition`` parse from), then
the conditions of installed plugins (entry-point group :data:`ENTRY_POINT_GROUP`). A
:class:`~relaylens.registry.Registry`: a read-mostly mapping of name -> class."""
for _cls in (Original, Relay, RankSync, KeyOnly, QueryOnly, CommonShift, Compaction, HalfGap, Dilation, ScoreOrder,
             ReverseOrder, RandomOrder):
    CONDITIONS.register(_cls.name, _cls)
del _cls
_SPEC = re.compile(r"^\s*([a-z_]+)\s*(?:\(\s*(?:([a-z_]+)\s*=\s*)?([-+0-9.eE]+)\s*\))?\s*$")


def parse_condition(spec: str | Condition) -> Condition:
    """Parse an unscoped condition name such as ``"relay"``, ``"query_only(2048)"`` or ``"compaction(alpha=0.25)"``
    (a :class:`Condition` passes through). Scoped specs (``"relay@layers=0-9"``) are parsed by
    :func:`relaylens.conditions.scoped.get_condition`, the parser of the whole spec grammar.

    >>> parse_condition("random_order(3)").label
    'random_order(3)'
    """
    if isinstance(spec, Condition):
        return spec
    match = _SPEC.match(str(spec))
    if not match or match.group(1) not in CONDITIONS:
        raise RelaylensError(f"unknown condition {spec!r}; known: {', '.join(CONDITIONS)} (parameters like "
                             "query_only(2048); "
                            "scopes like relay@layers=0-9)")
    name, keyword, raw = match.groups()
    cls = CONDITIONS[name]
    if raw is None:
        return cls()
    if cls.parameter is None:
        raise RelaylensError(f"condition {name!r} takes no parameter; got {spec!r}")
    parameter, cast = cls.parameter
    if keyword is not None and keyword != parameter:
        raise RelaylensError(f"condition {name!r} takes {parameter}=...; got {keyword}=")
    try:
        value = cast(raw)
    except ValueError as err:
        raise RelaylensError(f"condition {spec!r}: {parameter} must be {cast.__name__}; got {raw!r}") from err
    return cls(**{parameter: value})
