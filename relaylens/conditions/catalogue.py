"""Coordinate conditions: where each kept key sits in rotary-position space, and where the question starts.

Every condition maps one :class:`~relaylens.geometry.selection.Selection` (kept source positions ``p`` per layer and kv head,
``m = m[l, h]`` of them, ``M = max m``) and the history length ``L`` to

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
| ``query_only(shift)`` | ``p_i`` | ``L + shift`` |
| ``common_shift(shift)`` | ``p_i + shift`` | ``L + shift`` |
| ``compaction(alpha)`` | ``floor((1-alpha) p_i + alpha (M-m+i) + 0.5)`` | ``floor((1-alpha) L + alpha M + 0.5)`` |
| ``half_gap`` | ``compaction(0.5)`` | as above |
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

from relaylens.errors import RelaylensError

if TYPE_CHECKING:  # importing the catalogue imports no torch; coordinates are computed on torch selections
    import torch

    from relaylens.geometry.selection import Selection


@dataclass(frozen=True)
class Coordinates:
    """Target coordinates of one condition on one selection.

    ``key_positions`` is long for integer conditions, float64 for real-valued ones (it may then carry autograd:
    gradients w.r.t. positions); ``question_start`` an int, a float, or a 0-d float64 tensor (autograd).
    """

    condition: str
    key_positions: torch.Tensor  # [layer, kv_head, slot] long (or float64), -1 in padded slots
    question_start: int | float | torch.Tensor

    @property
    def real(self) -> bool:
        """Whether any position is real-valued (floating point)."""
        import torch

        return self.key_positions.is_floating_point() or not isinstance(self.question_start, int) \
            and (isinstance(self.question_start, torch.Tensor) or not float(self.question_start).is_integer())

    def question_positions(self, num_question_tokens: int) -> torch.Tensor:
        """``[Q]`` positions of the question tokens (long; float64 for a real-valued question start)."""
        import torch

        if isinstance(self.question_start, int):
            return torch.arange(self.question_start, self.question_start + num_question_tokens)
        return self.question_start + torch.arange(num_question_tokens, dtype=torch.float64)


def _slot_index(sel: Selection) -> torch.Tensor:
    import torch

    return torch.arange(sel.positions.shape[-1]).expand_as(sel.positions)  # [layer, kv_head, slot]


def _compact(sel: Selection) -> torch.Tensor:
    """``M - m + i``: relay slots, right-aligned so every head ends at ``M - 1``."""
    counts = sel.counts[..., None]  # [layer, kv_head, 1]
    return sel.max_count - counts + _slot_index(sel)


def make_coordinates(name: str, sel: Selection, key_positions: torch.Tensor, question_start) -> Coordinates:
    """:class:`Coordinates` named ``name``: ``key_positions`` ``[layer, kv_head, slot]`` where the selection is valid,
    ``-1`` in its padded slots. Floating-point positions stay real-valued (float64, autograd kept); a question start
    with an integer value becomes an int."""
    import torch

    from relaylens.geometry.selection import PAD_POSITION

    if key_positions.is_floating_point():
        key_positions = torch.where(sel.valid, key_positions.double(), torch.full_like(key_positions, PAD_POSITION, dtype=torch.float64))
    else:
        key_positions = torch.where(sel.valid, key_positions.long(), torch.full_like(key_positions, PAD_POSITION, dtype=torch.long))
    if not isinstance(question_start, torch.Tensor) and float(question_start).is_integer():
        question_start = int(question_start)
    return Coordinates(name, key_positions, question_start)


class Condition:
    """Base of all conditions: a frozen dataclass with a ``label`` and ``coordinates(selection)``."""

    name: str = ""

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
    """Keys compacted as in ``relay``, the question left at ``L``."""

    name = "key_only"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, _compact(sel), sel.history_length)


@dataclass(frozen=True)
class QueryOnly(Condition):
    """Keys at their source positions, the question moved to ``L + shift``."""

    shift: int = 2048
    name = "query_only"

    @property
    def label(self) -> str:
        return f"query_only({self.shift})"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, sel.positions, sel.history_length + self.shift)


@dataclass(frozen=True)
class CommonShift(Condition):
    """Keys and question both shifted by ``shift``: relative positions unchanged (a RoPE invariance control)."""

    shift: int = 2048
    name = "common_shift"

    @property
    def label(self) -> str:
        return f"common_shift({self.shift})"

    def coordinates(self, sel: Selection) -> Coordinates:
        return make_coordinates(self.label, sel, sel.positions + self.shift, sel.history_length + self.shift)


def _round_half_up(x: torch.Tensor | float):
    import torch

    if isinstance(x, torch.Tensor):
        return torch.floor(x + 0.5).long()
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class Compaction(Condition):
    """Every gap scaled by ``1 - alpha``: ``alpha = 0`` is ``original``, ``alpha = 1`` is ``relay``."""

    alpha: float = 0.5
    name = "compaction"

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise RelaylensError(f"compaction alpha must lie in [0, 1]; got {self.alpha}")

    @property
    def label(self) -> str:
        return f"compaction({self.alpha:g})"

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

    @property
    def label(self) -> str:
        return "half_gap"


def _fill_relay_slots(sel: Selection, order_key: torch.Tensor, name: str) -> Coordinates:
    """Give the state with the r-th smallest ``order_key`` (padding last) relay slot ``M - m + r``."""
    import torch

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

    @property
    def label(self) -> str:
        return f"random_order({self.seed})"

    def coordinates(self, sel: Selection) -> Coordinates:
        import torch

        generator = torch.Generator().manual_seed(int(self.seed))
        noise = torch.rand(sel.positions.shape, generator=generator, dtype=torch.float64)
        return _fill_relay_slots(sel, noise, self.label)


CONDITIONS: dict[str, type[Condition]] = {
    "original": Original,
    "relay": Relay,
    "rank_sync": RankSync,
    "key_only": KeyOnly,
    "query_only": QueryOnly,
    "common_shift": CommonShift,
    "compaction": Compaction,
    "half_gap": HalfGap,
    "score_order": ScoreOrder,
    "reverse_order": ReverseOrder,
    "random_order": RandomOrder,
}
_PARAMETER = {"query_only": ("shift", int), "common_shift": ("shift", int), "compaction": ("alpha", float), "random_order": ("seed", int)}
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
        raise RelaylensError(f"unknown condition {spec!r}; known: {', '.join(CONDITIONS)} (parameters like query_only(2048); "
                            "scopes like relay@layers=0-9)")
    name, keyword, raw = match.groups()
    cls = CONDITIONS[name]
    if raw is None:
        return cls()
    if name not in _PARAMETER:
        raise RelaylensError(f"condition {name!r} takes no parameter; got {spec!r}")
    parameter, cast = _PARAMETER[name]
    if keyword is not None and keyword != parameter:
        raise RelaylensError(f"condition {name!r} takes {parameter}=...; got {keyword}=")
    try:
        value = cast(raw)
    except ValueError as err:
        raise RelaylensError(f"condition {spec!r}: {parameter} must be {cast.__name__}; got {raw!r}") from err
    return cls(**{parameter: value})
