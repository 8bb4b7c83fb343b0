"""One history pass that scores many kvpress presses: how the runner runs several ``kvpress:`` selectors on a record.

A kvpress press scores a layer from what kvpress's forward hook hands it (the layer's input hidden states, its cached
keys and values, the attention weights, the hook's keyword arguments), and scoring changes nothing in the forward
(kvpress compresses the cache after the layer has run). So one forward of the history can feed every press and every
budget of a record. :func:`score_presses` runs one ``sdpa`` pass for the presses that do not read attention weights
and one ``eager`` pass for those that do (``NEEDS_ATTENTIONS``): the kernels each press runs with alone, so the kept
states equal separate passes bit for bit (``tests/selectors/test_kvpress_adapter.py``). Each press draws random numbers
from its own stream (seeded by its ``seed``), so a seeded press keeps the same states alone or beside others.

Cost: a record with ``P`` presses at ``K`` budgets takes one or two history forwards instead of ``P x K``.

Axes: ``layer``, ``kv_head``, ``pos`` (:mod:`relaylens.geometry`).

Example (kvpress installed):
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.model.prefill import prefill_history
    >>> from relaylens.selectors import make_selector
    >>> model = tiny_model("llama")
    >>> prefill = prefill_history(model, torch.arange(3, 103), window_size=8)
    >>> prepared = {n: make_selector(n).prepare(model, prefill) for n in ("kvpress:KnormPress", "kvpress:TOVAPress")}
    >>> share_press_passes(prepared, prefill, [(n, 0.25) for n in prepared])  # doctest: +SKIP
    1
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from relaylens.errors import BudgetError, RelaylensError, TooShortError
from relaylens.model.press_inputs import press_layer_pass

if TYPE_CHECKING:
    from relaylens.model.prefill import PrefillResult


class PressError(RelaylensError):
    """A kvpress press that cannot run as a selector: unknown name, wrong arguments, refused press, kvpress not
    installed, or scores of the wrong shape / non-finite values. The message names the press and the fix."""


def memo_key(prefill: PrefillResult, ratio: float, kept: int) -> tuple:
    """The key of one record's selection at one budget in a prepared press's memo."""
    return (ratio, kept, tuple(prefill.history_ids.tolist()))


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@dataclass
class PressScorer:
    """One press at one budget scoring the layers of one history; :meth:`__call__` is a
    :data:`relaylens.model.press_inputs.LayerFunction` that records the kept positions of each layer."""

    selector: object  # the prepared kvpress selector (relaylens.selectors.kvpress_adapter.KvPress)
    press: object  # the kvpress press instance at this budget's compression_ratio
    prefill: PrefillResult
    ratio: float  # the compression ratio of this budget (the memo key)
    kept: int
    eager: bool  # reads the attention weights: needs the eager kernel's pass
    rng: tuple | None = None  # this press's random stream between layers
    positions: dict = field(default_factory=dict)  # layer -> [kv_head, n_l] long, sorted
    scores: dict = field(default_factory=dict)  # layer -> [kv_head, n_l] float32

    def __call__(self, layer, module, hidden_states, keys, values, attentions, kwargs) -> None:
        label, length, heads = self.selector.label, self.prefill.history_length, self.prefill.num_kv_heads
        try:
            scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)  # [1, kv_head, L]
        except (AssertionError, ValueError, RuntimeError, NotImplementedError, KeyError, AttributeError, TypeError,
                IndexError) as err:
            raise PressError(f"{label} failed to score layer {layer} of a {length}-token history: "
                             f"{type(err).__name__}: {err}") from err
        if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (1, heads, length):
            shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise PressError(f"{label} returned scores of shape {shape} at layer {layer}; expected "
                             f"(1, {heads}, {length}) = (batch, kv_head, history). The press's score() is "
                             "not a per-state scorer on this model: fix the press or pick another")
        bad = ~torch.isfinite(scores)
        if bool(bad.any()):
            raise PressError(f"{label} returned {int(bad.sum())} non-finite scores (NaN or inf) at layer "
                             f"{layer}; a selection needs finite scores. Check the press's arguments "
                             f"{dict(self.selector.options)} and the model's dtype")
        layer_budget = getattr(self.press, "get_layer_budget", None)  # PyramidKV: its own per-layer counts
        n = layer_budget(module, length) if layer_budget is not None else self.kept
        if not 0 <= n <= length:
            raise BudgetError(f"{label} asks layer {layer} to keep {n} of {length} states")
        top = scores.topk(n, dim=-1).indices[0]  # [kv_head, n], kvpress's own top-k (ties included)
        top = top.sort(dim=-1).values
        self.positions[layer] = top.cpu()
        self.scores[layer] = scores[0].gather(-1, top).float().cpu()

    def result(self) -> tuple[list, list]:
        """``(positions, scores)`` per layer, as the press's memo holds them."""
        layers = sorted(self.positions)
        return [self.positions[i] for i in layers], [self.scores[i] for i in layers]


def score_presses(requests: Iterable[tuple[object, float, int]], prefill: PrefillResult) -> int:
    """Fill each prepared press's memo for ``(press, compression_ratio, kept)`` with as few history passes as the
    kernels allow (module docstring). Requests already in a memo are not scored again. Returns the passes run.

    Raises :class:`~relaylens.errors.TooShortError` / ``PressError`` of the first request that cannot be built,
    naming the press; :func:`share_press_passes` leaves such requests to their own ``select`` call instead.
    """
    return run_scorers([selector.scorer(prefill, ratio, kept) for selector, ratio, kept in requests], prefill)


def run_scorers(scorers: Iterable[PressScorer], prefill: PrefillResult) -> int:
    """Run built scorers in one pass per kernel and store each result in its press's memo; returns the passes run."""
    todo: dict[tuple, PressScorer] = {}
    for scorer in scorers:
        key = memo_key(prefill, scorer.ratio, scorer.kept)
        if key not in scorer.selector.memo:
            todo.setdefault((id(scorer.selector), key), scorer)
    passes = 0
    for eager in (False, True):
        group = [s for s in todo.values() if s.eager == eager]
        if not group:
            continue
        model = group[0].selector.model
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            start = _rng_state(device)
            for scorer in group:  # every press's own stream: its seed, else the stream at the pass's start
                scorer.rng = start
                if scorer.selector.seed is not None:
                    torch.manual_seed(scorer.selector.seed)
                    scorer.rng = _rng_state(device)
                    _set_rng_state(start, device)

            def score_all(layer, module, hidden_states, keys, values, attentions, kwargs):
                for scorer in group:
                    _set_rng_state(scorer.rng, device)
                    scorer(layer, module, hidden_states, keys, values, attentions, kwargs)
                    scorer.rng = _rng_state(device)

            press_layer_pass(model, prefill.history_ids, score_all,
                             attn_implementation="eager" if eager else "sdpa")
        passes += 1
    for (_, key), scorer in todo.items():
        memo = scorer.selector.memo
        for other in [k for k in memo if k[2] != key[2]]:
            del memo[other]  # a prepared press holds one history's selections at a time
        memo[key] = scorer.result()
    return passes


def share_press_passes(prepared: Mapping[str, object], prefill: PrefillResult,
                       units: Iterable[tuple[str, object]]) -> tuple[int, float, set[str]]:
    """Score every ``kvpress:`` unit of a record (``(selector name, budget)`` over ``prepared``) in shared passes.

    Units whose press cannot run on this record (history too short for its window, a budget it refuses) are left
    out: their own ``select`` raises the error and the runner records it. Returns ``(passes, seconds, names)``: the
    passes run, their wall time and the selector names they served (the runner spreads the time over those units).
    """
    scorers, names = [], set()
    started = time.perf_counter()
    for name, budget in units:
        selector = prepared.get(name)
        if not callable(getattr(selector, "scorer", None)) or getattr(selector, "model", None) is None:
            continue  # not a prepared kvpress selector
        ratio, kept = selector.compression(budget, prefill.history_length)
        if ratio == 0.0:
            continue  # keeps the whole cache: no pass
        try:
            scorers.append(selector.scorer(prefill, ratio, kept))
        except (TooShortError, BudgetError):
            continue  # its own select raises the same error, which the runner records
        names.add(name)
    if not scorers:
        return 0, 0.0, set()
    passes = run_scorers(scorers, prefill)
    return passes, time.perf_counter() - started, names
