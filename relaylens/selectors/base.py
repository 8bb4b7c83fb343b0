"""Shared pieces of every selector: the budget, input checks, the SnapKV window score, GQA reduction, pooling, top-k.

Axes: ``layer``, ``kv_head``, ``q_head``, ``group``, ``pos``, ``prefix``, ``window``, ``head_dim``
(:mod:`relaylens.geometry`).

Conventions (``reference/selectors.md`` §0-§1):

* ``K`` is the budget in states per (layer, kv head); every force-kept state (window, sinks, recent) counts in it.
* Softmax and accumulations run in float32.
* Ties in a top-k are broken by recency: of two equal scores the later position wins. Max-pooling copies a peak
  into its neighbours, so exact ties are common and the rule matters for reproducibility.

Example:
    >>> Budget(ratio=0.1).tokens(1000), Budget(states=2048).tokens(1000), Budget.coerce("B64").tokens(1000)
    (100, 1000, 64)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from relaylens.errors import BudgetError, RelaylensError, ShapeError, TooShortError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult

GQA_REDUCTIONS = ("mean", "max", "sum")
POOLINGS = ("max", "avg", "none")


# ---------------------------------------------------------------------------------------------------------------
# Budget
@dataclass(frozen=True)
class Budget:
    """How many states each (layer, kv head) keeps on average: ``K``.

    Exactly one of ``ratio`` (a fraction of the history, ``K = floor(ratio * L)``, default 0.10) or ``states`` (an
    absolute count, "B2048" style, clamped to ``L``) is set.

    Example:
        >>> Budget().tokens(96), Budget(0.25).tokens(96), Budget(states=24).label
        (9, 24, 'B24')
    """

    ratio: float | None = None
    states: int | None = None

    def __post_init__(self) -> None:
        if self.ratio is None and self.states is None:
            object.__setattr__(self, "ratio", 0.10)
        if self.ratio is not None and self.states is not None:
            raise BudgetError(f"give a budget as ratio or as states, not both; got ratio={self.ratio}, "
                              f"states={self.states}")
        if self.ratio is not None:
            if isinstance(self.ratio, bool) or not isinstance(self.ratio,
                                                              (int, float)) or not math.isfinite(self.ratio):
                raise BudgetError(f"budget ratio must be a number in (0, 1]; got {self.ratio!r}")
            if not 0.0 < float(self.ratio) <= 1.0:
                raise BudgetError(
                    f"budget ratio must lie in (0, 1] (a fraction of the history); got {self.ratio}. "
                    "For an absolute number of states pass an int or Budget(states=N)."
                )
            object.__setattr__(self, "ratio", float(self.ratio))
        else:
            if isinstance(self.states, bool) or not isinstance(self.states, int) or self.states <= 0:
                raise BudgetError(f"budget states must be a positive int; got {self.states!r}")

    @classmethod
    def coerce(cls, budget: Budget | float | int | str) -> Budget:
        """Accept a :class:`Budget`, a float ratio in (0, 1], an int number of states, or a string ``"0.1"`` /
        ``"B2048"``."""
        if isinstance(budget, Budget):
            return budget
        if isinstance(budget, bool):
            raise BudgetError(f"budget must be a ratio, a number of states or a Budget; got {budget!r}")
        if isinstance(budget, int):
            return cls(states=budget)
        if isinstance(budget, float):
            return cls(ratio=budget)
        if isinstance(budget, str):
            text = budget.strip()
            try:
                if text[:1] in "Bb":
                    return cls(states=int(text[1:]))
                return cls(ratio=float(text))
            except ValueError as err:
                raise BudgetError(f"cannot read budget {budget!r}; expected e.g. '0.1' or 'B2048'") from err
        raise BudgetError(f"budget must be a ratio, a number of states or a Budget; got {type(budget).__name__}")

    def tokens(self, history_length: int) -> int:
        """``K`` for a history of ``history_length`` tokens (at least 1, at most ``L``)."""
        if self.states is not None:
            return min(self.states, history_length)
        k = math.floor(self.ratio * history_length)
        if k < 1:
            raise BudgetError(
                f"budget ratio {self.ratio} of a {history_length}-token history keeps 0 states; "
                "raise the ratio or give an absolute budget"
            )
        return k

    @property
    def label(self) -> str:
        """``"0.1"`` or ``"B2048"``: the name used in result tables."""
        return f"B{self.states}" if self.states is not None else f"{self.ratio:g}"


# ---------------------------------------------------------------------------------------------------------------
# Selector base class
@dataclass(frozen=True)
class Selector:
    """Base of every selector: a frozen dataclass of hyperparameters with one method, :meth:`select`.

    Class attributes say what the selector reads, so the pipeline knows what to capture during the prefill:
    ``needs_window_queries`` (the last ``w`` post-rotary queries), ``needs_column_sums``
    (``prefill.column_sums``: ``prefill_history(..., column_sums=True)``) and
    ``needs_prompt`` (the rendered prompt's spans and question).
    """

    name: ClassVar[str] = "selector"
    needs_window_queries: ClassVar[bool] = False
    needs_column_sums: ClassVar[bool] = False
    needs_prompt: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_hyperparameters(self)  # subclasses call this first, before their range checks

    def prepare(self, model, prefill: PrefillResult, prompt=None, factors=None) -> Selector:
        """The selector to use on this record: itself, or a copy carrying what :meth:`select` needs beyond the
        prefill and the prompt (FINCH: its question pass over the full cache). The runner calls it once per record
        and selector, after the prefill."""
        return self

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        raise NotImplementedError

    def protected_request(self, source_budget: int, protected: int) -> int:
        """States to ask :meth:`select` for when ``protected`` instruction/template states are kept outside a
        ``source_budget`` (:func:`relaylens.selectors.protection.select_protected`): ``source_budget + protected``, so
        that the selector's own ranking picks the source states; a selector that never keeps a protected state returns
        ``source_budget``."""
        return source_budget + protected


_PLAIN = (bool, int, float, str)
_EXPECTED = {bool: "True or False", int: "a whole number", float: "a finite number", str: "text"}


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Per hyperparameter of a selector class, the plain types its annotation allows (``NoneType`` included for
    ``X | None``); fields of other types (captured data) are left out."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        allowed = typing.get_args(hint) if isinstance(hint,
                                                      types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        if all(t in _PLAIN or t is type(None) for t in allowed):
            out[f.name] = tuple(allowed)
    return out


def check_hyperparameters(selector: Selector) -> None:
    """Refuse a hyperparameter of the wrong type, before anything runs: ``bool`` fields take True/False, ``int``
    fields whole numbers (not bools, not ``1.5``), ``float`` fields finite numbers, ``str`` fields text; ``X | None``
    also takes None. Ranges are each selector's own ``__post_init__``.

    >>> from relaylens.selectors.random_selector import RandomSelector
    >>> RandomSelector(seed=1.5)
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: selector 'random': seed=1.5 must be a whole number (a float arrived). Fix: e.g. random:seed=0
    """  # noqa: E501 - doctest: an exception message is matched on one line
    for name, allowed in _field_types(type(selector)).items():
        value = getattr(selector, name)
        if value is None and type(None) in allowed:
            continue
        fits = any(_fits(value, kind) for kind in allowed if kind is not type(None))
        if not fits:
            default = next(f.default for f in dataclasses.fields(selector) if f.name == name)
            expected = " or ".join(_EXPECTED[k] if k is not type(None) else "None" for k in allowed)
            arrived = type(value).__name__
            raise RelaylensError(f"selector {selector.name!r}: {name}={value!r} must be {expected} "
                                 f"({'an' if arrived[0] in 'aeiou' else 'a'} {arrived} arrived). Fix: e.g. "
                                 f"{selector.name}:{name}={default}")


def _fits(value, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


def check_seed(selector: Selector, seed) -> None:
    """A generator seed: a whole number in ``0 .. 2**63 - 1`` (what ``torch.Generator.manual_seed`` takes as given)."""
    if not 0 <= seed < 2**63:
        raise RelaylensError(f"selector {selector.name!r}: seed={seed!r} must lie in 0..2**63-1. Fix: e.g. "
                             f"{selector.name}:seed=0")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise RelaylensError(f"{name} must be one of {tuple(choices)}; got {value!r}")


def check_kernel(kernel_size: int, pooling: str) -> None:
    check_choice("pooling", pooling, POOLINGS)
    if pooling != "none" and (not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0):
        raise RelaylensError("kernel_size must be a positive odd int (stride-1 pooling keeps length); got "
                             f"{kernel_size!r}")


def resolve_budget(budget: Budget | float | int | str, history_length: int, window: int = 0, what: str = "") -> int:
    """``K`` for this history, checking that the force-kept ``window`` fits inside it and leaves a prefix."""
    k = Budget.coerce(budget).tokens(history_length)
    if window:
        if history_length <= window:
            raise TooShortError(
                f"{what} needs a history longer than its observation window: L={history_length} <= w={window}; "
                "use a smaller window or a longer history"
            )
        if k < window:
            raise BudgetError(
                f"{what} budget K={k} states is smaller than the observation window w={window}, which is always kept "
                f"inside the budget; raise the budget to at least {window} states or shrink the window"
            )
    return k


# ---------------------------------------------------------------------------------------------------------------
# Top-k with a fixed tie rule, and Selection assembly
def top_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries along the last axis, ties broken by recency (larger index first),
    returned sorted ascending. ``scores: [..., n]`` -> ``[..., k]`` long."""
    n = scores.shape[-1]
    if k <= 0:
        return torch.empty((*scores.shape[:-1], 0), dtype=torch.long, device=scores.device)
    # stable descending sort of the reversed axis: among equal scores, the later position comes first
    order = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.sort(n - 1 - order, dim=-1).values


def window_fill(prefix_scores: torch.Tensor) -> torch.Tensor:
    """Score given to force-kept window states: ``1 + max`` of the head's prefix scores (kvpress convention), so
    ``score_order`` places the window nearest the question. ``[..., prefix] -> [..., 1]``."""
    if prefix_scores.shape[-1] == 0:
        return torch.ones((*prefix_scores.shape[:-1], 1), dtype=torch.float32, device=prefix_scores.device)
    return prefix_scores.amax(-1, keepdim=True).float() + 1.0


def selection_from_keep(
    keep: list[list[torch.Tensor]], scores: list[list[torch.Tensor]], history_length: int, info: dict | None = None,
    values=None
) -> Selection:
    """Pad ragged ``keep[layer][kv_head]`` (sorted long) and matching scores into a :class:`Selection`."""
    keep = [[t.detach().cpu() for t in layer] for layer in keep]
    scores = [[t.detach().cpu().float() for t in layer] for layer in scores]
    if values is not None:
        values = [[t.detach().cpu() for t in layer] for layer in values]
    return Selection.from_lists(keep, history_length, scores=scores, values=values, info=info)


def selection_with_window(
    prefix_keep: list[list[torch.Tensor]], prefix_scores: torch.Tensor, history_length: int, window: int, info: dict
) -> Selection:
    """Kept prefix positions per (layer, kv head) plus the window ``L-w..L-1``; scores are the (pooled) prefix
    scores, with the window at ``1 + max``. ``prefix_scores: [layer, kv_head, prefix]``."""
    win = torch.arange(history_length - window, history_length)
    keep, scores = [], []
    for l, layer in enumerate(prefix_keep):
        keep.append([torch.cat([p.cpu(), win]) for p in layer])
        row = []
        for h, p in enumerate(layer):
            s = prefix_scores[l, h]
            row.append(torch.cat([s[p].float().cpu(), window_fill(s).cpu().expand(window)]))
        scores.append(row)
    return selection_from_keep(keep, scores, history_length, info)


# ---------------------------------------------------------------------------------------------------------------
# GQA reduction and pooling
def reduce_gqa(scores: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Reduce per-query-head scores to the physical kv head. ``[kv_head, group, n] -> [kv_head, n]``."""
    if reduction == "mean":
        return scores.mean(1)
    if reduction == "max":
        return scores.amax(1)
    if reduction == "sum":
        return scores.sum(1)
    raise RelaylensError(f"gqa_reduction must be one of {GQA_REDUCTIONS}; got {reduction!r}")


def pool_scores(scores: torch.Tensor, kernel_size: int = 7, pooling: str = "max") -> torch.Tensor:
    """Stride-1 pooling along the last axis with padding ``k//2``: max-pool pads with ``-inf``, avg-pool with zeros
    counted in the average (the edges are damped, as in SnapKV's ``avg_pool1d``). ``[..., n] -> [..., n]``."""
    if pooling == "none" or kernel_size == 1 or scores.shape[-1] == 0:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])  # [rows, 1, n]
    if pooling == "max":
        out = F.max_pool1d(flat, kernel_size, stride=1, padding=kernel_size // 2)
    elif pooling == "avg":
        out = F.avg_pool1d(flat, kernel_size, stride=1, padding=kernel_size // 2, count_include_pad=True)
    else:
        raise RelaylensError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------------------------
# The SnapKV observation-window score (selectors.md §1)
def window_attention_sums(prefill: PrefillResult, layer: int, window: int) -> torch.Tensor:
    """Column sums of the last ``window`` history queries' attention over **all** ``L`` keys, per query head.

    ``a_q[i, j] = softmax_j(scaling * q_i . k_j + M_ij)`` with ``M_ij = -inf`` iff ``j > i`` (this bites only inside
    the window block), computed in float32 one kv head at a time (no ``repeat_kv`` copy). Returns
    ``s_q(j) = sum_{i in window} a_q[i, j]`` as ``[kv_head, group, L]`` float32 (window columns included).
    """
    if prefill.window_queries is None:
        raise ShapeError("this selector needs the window queries of the prefill; run the prefill with window "
                         "capture on")
    queries = prefill.window_queries[layer]  # [q_head, w_captured, head_dim]
    keys = prefill.keys[layer]  # [kv_head, L, head_dim]
    length = keys.shape[1]
    if queries.shape[1] < window:
        raise ShapeError(
            f"the prefill captured {queries.shape[1]} window queries but the selector's window is {window}; "
            f"prefill with window_size >= {window} or lower the selector's window"
        )
    kv_heads, group = keys.shape[0], prefill.num_key_value_groups
    if queries.shape[0] != kv_heads * group:
        raise ShapeError(f"layer {layer}: {queries.shape[0]} query heads but {kv_heads} kv heads x {group} groups")
    q = queries[:, -window:].float().reshape(kv_heads, group * window, -1)  # [kv_head, group*w, d]
    rows = torch.arange(length - window, length, device=keys.device).repeat(group)  # [group*w] query position
    causal = torch.arange(length, device=keys.device)[None, :] > rows[:, None]  # [group*w, L]
    out = torch.empty((kv_heads, group, length), dtype=torch.float32, device=keys.device)
    for h in range(kv_heads):
        logits = (q[h] @ keys[h].float().T) * prefill.scaling  # [group*w, L]
        logits.masked_fill_(causal, float("-inf"))
        probs = torch.softmax(logits, dim=-1)  # [group*w, L]
        out[h] = probs.view(group, window, length).sum(1)
    return out


@dataclass(frozen=True)
class WindowScore:
    """SnapKV's observation-window score ``ŝ_h(j)`` for ``j < L-w`` (selectors.md §1).

    Defaults: window ``w = 32``, GQA reduction ``"mean"`` before pooling (AdaKV / KVCache-Factory order),
    max-pooling with kernel 7 (SnapKV paper runs). ``pool_per_query_head=True`` pools each query head first and
    reduces afterwards (kvpress order; only matters for max-pooling).
    """

    window: int = 32
    kernel_size: int = 7
    pooling: str = "max"
    gqa_reduction: str = "mean"
    pool_per_query_head: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise RelaylensError(f"window must be a positive int; got {self.window!r}")
        check_kernel(self.kernel_size, self.pooling)
        check_choice("gqa_reduction", self.gqa_reduction, GQA_REDUCTIONS)

    def raw(self, prefill: PrefillResult, layer: int) -> torch.Tensor:
        """Unpooled GQA-reduced window sums over all keys: ``[kv_head, L]`` float32."""
        return reduce_gqa(window_attention_sums(prefill, layer, self.window), self.gqa_reduction)

    def layer_scores(self, prefill: PrefillResult, layer: int) -> torch.Tensor:
        """Pooled prefix scores ``[kv_head, L-w]`` float32 (window columns cut before pooling)."""
        sums = window_attention_sums(prefill, layer, self.window)[..., : -self.window]  # [kv_head, group, prefix]
        if self.pool_per_query_head:
            return reduce_gqa(pool_scores(sums, self.kernel_size, self.pooling), self.gqa_reduction)
        return pool_scores(reduce_gqa(sums, self.gqa_reduction), self.kernel_size, self.pooling)

    def scores(self, prefill: PrefillResult) -> torch.Tensor:
        """``[layer, kv_head, L-w]`` float32 for every layer."""
        return torch.stack([self.layer_scores(prefill, l) for l in range(prefill.num_layers)])


@dataclass(frozen=True)
class WindowSelector(Selector):
    """Base of the selectors scored by the observation window (SnapKV, PyramidKV, AdaKV, ChunkKV, CaM).

    Parameters:
        window: observation window ``w`` (32), always kept and counted inside ``K``.
        kernel_size, pooling: stride-1 pooling of the scores along positions (7, ``"max"``; ``"avg"``/``"none"``).
        gqa_reduction: ``"mean"`` (default), ``"max"`` or ``"sum"`` over the query heads of a kv head.
        pool_per_query_head: pool before the GQA reduction (kvpress order) instead of after (default).
    """

    window: int = 32
    kernel_size: int = 7
    pooling: str = "max"
    gqa_reduction: str = "mean"
    pool_per_query_head: bool = False

    needs_window_queries: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        WindowScore(self.window, self.kernel_size, self.pooling, self.gqa_reduction, self.pool_per_query_head)

    @property
    def scorer(self) -> WindowScore:
        """The SnapKV window score with this selector's settings."""
        return WindowScore(self.window, self.kernel_size, self.pooling, self.gqa_reduction, self.pool_per_query_head)


def largest_remainder(targets: torch.Tensor, total: int) -> torch.Tensor:
    """Round non-negative float ``targets [n]`` to ints summing exactly to ``total``: floor everything, then give
    the missing units to the largest fractional parts (ties to the lower index). ``[n] float -> [n] long``."""
    targets = targets.double().clamp_min(0)
    base = torch.floor(targets + 1e-9).long()
    missing = int(total - int(base.sum()))
    if missing < 0 or missing > targets.numel():
        raise BudgetError(f"cannot round {targets.tolist()} to a total of {total}; the schedule is infeasible")
    if missing:
        frac = targets - base.double()
        order = torch.sort(-frac, stable=True).indices[:missing]
        base[order] += 1
    return base
