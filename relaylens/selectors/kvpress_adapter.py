"""Every kvpress scorer press as a relaylens selector: ``kvpress:<PressName>[:key=value,...]``.

kvpress (NVIDIA/kvpress) presses score the history inside a forward hook and keep the top states per kv head. This
adapter runs the press's own ``score()`` on the arguments kvpress's hook would hand it (the layer's attention module,
its input hidden states, the cached post-rotary keys and values, the attention weights where the press reads them,
and the hook's keyword arguments; :func:`relaylens.model.press_inputs.press_layer_pass`), keeps what kvpress's
``ScorerPress.compress`` keeps, and returns a sorted :class:`~relaylens.geometry.selection.Selection`, so every
condition, probe and table works unchanged. Only the press classes are used: kvpress's pipeline, hooks and cache
surgery never run in relaylens, which is why kvpress's ``transformers<5.3`` pin does not apply (install it with
``pip install --no-deps kvpress==0.5.5``; see the README). ``tests/selectors/test_kvpress_adapter_equality.py``
checks the kept states against kvpress's own pipeline in an environment with kvpress's pinned dependencies.

Budget (kvpress's compression-ratio semantics): at a ratio budget ``ρ`` the press runs with
``compression_ratio = 1 - ρ`` and every (layer, kv head) keeps kvpress's ``compute_n_kept(L, 1 - ρ)`` states, i.e.
``max(1, int(L * (1 - (1 - ρ))))`` in floating point, which can be one state fewer than relaylens's ``floor(ρ L)``
(``L = 1000, ρ = 0.1`` keeps 99). An absolute budget of ``B`` states keeps exactly ``B`` (the press sees the
largest ratio with ``int(L * (1 - ratio)) = B``). PyramidKV keeps its own per-layer counts (``get_layer_budget``).
Ties are broken as kvpress breaks them: ``torch.topk`` on the press's own scores.

Which presses work (kvpress 0.5.5): the scorers in :data:`SCORERS`; :data:`REFUSED` names every other export with
the reason. A press class of a newer kvpress that is a plain ``ScorerPress`` (default ``compress``) works too.

Axes: ``layer``, ``kv_head``, ``pos`` (:mod:`relaylens.geometry`).

Example (kvpress installed; the runner calls ``prepare`` once per record):
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.model.prefill import prefill_history
    >>> model, ids = tiny_model("llama"), torch.arange(3, 103)
    >>> prefill = prefill_history(model, ids, window_size=8)
    >>> press = KvPress.create("kvpress:SnapKVPress", window_size=16).prepare(model, prefill)  # doctest: +SKIP
    >>> press.select(prefill, None, 0.25).counts.tolist()  # doctest: +SKIP
    [[25, 25], [25, 25]]
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from relaylens.errors import TooShortError
from relaylens.geometry.selection import Selection
from relaylens.model.hf import preserved_attention_functions
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector
from relaylens.selectors.kvpress_pass import PressError, PressScorer, memo_key, score_presses
from relaylens.selectors.kvpress_ranges import check_argument, history_problem

PREFIX = "kvpress:"
#: the kvpress release the catalogue below and the equality test cover
KVPRESS_VERSION = "0.5.5"
INSTALL_HINT = "pip install 'relaylens[kvpress]' && pip install --no-deps kvpress==0.5.5"

#: scorer presses of kvpress 0.5.5 that work as selectors (the first six are checked against kvpress's pipeline in CI,
#: with the others the equality test covers)
SCORERS = ("SnapKVPress", "KnormPress", "ExpectedAttentionPress", "StreamingLLMPress", "TOVAPress", "KeyDiffPress",
           "RandomPress", "ObservedAttentionPress", "PyramidKVPress", "LagKVPress", "NonCausalAttnPress",
           "LeverageScorePress", "CompactorPress", "CURPress", "CapPress", "CriticalKVPress")
#: scorers that take an inner scorer press (``press=SnapKVPress``, its arguments as ``press.window_size=32``)
WRAPS_A_SCORER = ("CriticalKVPress",)
#: scorers that read the attention weights: their pass runs the eager kernel (kvpress requires eager for them)
NEEDS_ATTENTIONS = ("ObservedAttentionPress",)

_HUB = "loads trained per-model artefacts from the Hugging Face Hub in post_init_from_model"
_DECODING = "compresses during decoding (query-aware, as tokens are generated); relaylens selects once from the history"
_RELAYLENS_HAS = "is a wrapper with its own selection rule; relaylens's native '{}' selector implements it"
#: every other export of kvpress 0.5.5, with why it is refused: each reason completes "kvpress:<Press> cannot be a
#: relaylens selector: it ..." (a verb in the third person comes first)
REFUSED = {
    "BasePress": "is the abstract base class of all presses, not a press",
    "ScorerPress": "is the abstract base class of scorer presses (no score()); name a concrete press",
    "QFilterPress": f"{_HUB} (Q-filters, nthngdy/<model>_qfilt)",
    "KVzapPress": f"{_HUB} (the KVzap scorer model, nvidia/KVzap-*)",
    "ExpectedAttentionStatsPress": f"{_HUB} (query statistics, or a Hub dataset to compute them)",
    "FastKVzipPress": f"{_HUB} (trained gates)",
    "RestoreKVPress": f"{_HUB} (restore embeddings) and rebuilds the context by re-running the model",
    "LUKVPress": "downloads per-model budget curves over the network in post_init_from_model",
    "DuoAttentionPress": "needs per-head streaming patterns from outside (downloaded or scored on a Hub dataset) and "
                         "masks whole heads instead of selecting states",
    "KVzipPress": "scores by re-running the model on a context-reconstruction prompt after the prefill (several "
                  "extra forward passes), not by a per-layer score()",
    "KVgradPress": "scores from gradients of a context-reconstruction pass after the prefill, not by a per-layer "
                   "score()",
    "KVComposePress": "aligns composite tokens across heads and layers after the whole prefill from the attention "
                      "weights of every layer, not by a per-layer score()",
    "SimLayerKVPress": "decides per layer between the full cache and a sink+recent window by a threshold: it has no "
                       "budget (compression_ratio) to set",
    "ThinKPress": "prunes key channels (head_dim), not states: a Selection keeps whole states",
    "FinchPress": "is query-aware: it needs the question inside the context behind a delimiter token; relaylens's "
                  "native 'finch' selector runs FINCH's question window",
    "DecodingPress": _DECODING,
    "CompressionRatioDecodingPress": _DECODING,
    "PrefillDecodingPress": _DECODING,
    "CAMPress": _DECODING + "; relaylens's native 'cam' selector merges at selection time",
    "DMSPress": "evicts by a score threshold (no budget) and can compress during decoding",
    "MergingPress": "merges evicted values into kept states instead of only selecting them",
    "ComposedPress": "chains presses over an already-compressed cache (a list of presses is not key=value)",
    "PerLayerCompressionPress": "takes a list of per-layer compression ratios (not key=value) around a press",
    "KeyRerotationPress": "re-rotates the kept keys to compact positions, which is relaylens's job: select with the "
                          "inner press (kvpress:<Press>) and use the 'rank_sync' condition (KeyRerotationPress's "
                          "left-aligned positions) or 'relay'",
    "AdaKVPress": _RELAYLENS_HAS.format("adakv") + " (head-wise budgets by decode-time key masking)",
    "CriticalAdaKVPress": "sets head-wise budgets by decode-time key masking around CriticalKV; use "
                          "kvpress:CriticalKVPress or relaylens's 'adakv'",
    "ChunkKVPress": _RELAYLENS_HAS.format("chunkkv") + " (whole chunks shared by all heads)",
    "EntropyGatedChunkKVPress": _RELAYLENS_HAS.format("chunkkv") + " (entropy-gated chunk lengths)",
    "ChunkPress": "compresses each chunk of the context separately with chunk-local scores (its own prefill "
                  "schedule); not adapted",
    "BlockPress": "compresses block by block over a growing cache (its own prefill schedule); not adapted",
}


# ---------------------------------------------------------------------------------------------------------------
# Names (no kvpress import needed)
def known_presses() -> tuple[str, ...]:
    """Every export of kvpress 0.5.5 that is a press class, supported or refused, sorted."""
    return tuple(sorted(SCORERS + tuple(REFUSED)))


def is_press_selector(name: str) -> bool:
    """True for a ``kvpress:<PressName>`` selector name (any case)."""
    return isinstance(name, str) and name.strip().lower().startswith(PREFIX)


def canonical_name(name: str) -> str:
    """``kvpress:<PressName>`` with the press's own spelling when it is known (``kvpress:snapkvpress`` ->
    ``kvpress:SnapKVPress``); an unknown press keeps its spelling (the installed kvpress decides later).

    >>> canonical_name("KVPRESS:snapkvpress"), canonical_name("kvpress:MyNewPress")
    ('kvpress:SnapKVPress', 'kvpress:MyNewPress')
    """
    press = name.strip()[len(PREFIX):].strip()
    lookup = {n.lower(): n for n in known_presses()}
    return PREFIX + lookup.get(press.lower(), press)


def import_kvpress(what: str = "kvpress"):
    """The ``kvpress`` module, imported without its global attention-function patch (kvpress wraps every attention
    kernel at import for AdaKV's decode-time masking; relaylens only uses press classes, so the patch is undone)."""
    try:
        with preserved_attention_functions():
            import kvpress  # noqa: PLC0415 - optional/platform: imported inside try/except ImportError
    except ImportError as err:
        raise PressError(f"{what} needs the kvpress package, which cannot be imported ({err}). Fix: {INSTALL_HINT} "
                         "(kvpress pins transformers<5.3, so install it without its dependencies)") from err
    return kvpress


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _resolve_class(press: str, kvpress, what: str):
    by_lower = {n.lower(): n for n in dir(kvpress) if isinstance(getattr(kvpress, n), type)}
    real = by_lower.get(press.lower())
    if press in REFUSED or (real is not None and real in REFUSED):
        name = real or press
        raise PressError(f"{PREFIX}{name} cannot be a relaylens selector: it {REFUSED[name]}. Supported presses: "
                         f"{', '.join(SCORERS)}")
    if real is None or not issubclass(getattr(kvpress, real), kvpress.BasePress):
        usable = [n for n in by_lower.values() if n not in REFUSED and _is_scorer(getattr(kvpress, n), kvpress)]
        raise PressError(f"unknown kvpress press {press!r} in {what!r}{_suggest(press, usable)}; supported presses: "
                         f"{', '.join(SCORERS)}")
    cls = getattr(kvpress, real)
    if not _is_scorer(cls, kvpress):
        raise PressError(f"{PREFIX}{real} cannot be a relaylens selector: it is not a scorer press (a ScorerPress "
                         "whose selection is score() + top-k); relaylens adapts scorer presses only")
    return cls


def _is_scorer(cls, kvpress) -> bool:
    """A press class relaylens adapts: a ``ScorerPress`` that keeps kvpress's ``compress`` (or PyramidKV's budget);
    "did you mean" suggests only these, never a refused press."""
    scorer = kvpress.ScorerPress
    return (isinstance(cls, type) and issubclass(cls, scorer) and cls is not scorer
            and (cls.compress is scorer.compress or hasattr(cls, "get_layer_budget")))


def _parameters(cls) -> dict[str, inspect.Parameter]:
    """The press's constructor arguments a user may set (not the budget, not private fields)."""
    params = inspect.signature(cls).parameters
    return {n: p for n, p in params.items() if not n.startswith("_") and n != "compression_ratio"
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _check_value(what: str, key: str, value, param: inspect.Parameter) -> None:
    """Reject a value whose type the press's annotation (or default) rules out; unknown annotations pass."""
    annotation = param.annotation
    if isinstance(annotation, str) or annotation is inspect.Parameter.empty:
        annotation = type(param.default) if param.default not in (inspect.Parameter.empty, None) else None
    if annotation is None:
        return
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if union else (annotation,)
    allowed = []
    for option in options:
        if option is type(None):
            if value is None:
                return
            allowed.append("None")
        elif typing.get_origin(option) is typing.Literal:
            choices = typing.get_args(option)
            if value in choices:
                return
            allowed.append(" | ".join(repr(c) for c in choices))
        elif option is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return
            allowed.append("float")
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return
            allowed.append("int")
        elif isinstance(option, type) and option in (bool, str):
            if isinstance(value, option):
                return
            allowed.append(option.__name__)
        else:
            return  # a type relaylens does not check
    raise PressError(f"{what}: argument {key}={value!r} is not {' or '.join(allowed)}. Fix: give {key} as "
                     f"{allowed[0]} (e.g. {what}:{key}=...)")


# ---------------------------------------------------------------------------------------------------------------
# The selector
@dataclass(frozen=True)
class KvPress(Selector):
    """A kvpress scorer press as a selector. Build it with :meth:`create` (``make_selector("kvpress:SnapKVPress",
    window_size=64)``); the runner calls :meth:`prepare` (which binds the model) before :meth:`select`.

    Parameters:
        press: the press class name (``"SnapKVPress"``).
        options: the press's constructor arguments as sorted ``(key, value)`` pairs (``press`` names the inner
            scorer of ``CriticalKVPress``; ``press.<key>`` its arguments). ``compression_ratio`` is not an option:
            the budget sets it.
        seed: seeds torch's generator for the scoring pass (``LeverageScorePress``/``CompactorPress`` sketches) and
            the press's own ``seed`` argument where it has one (``RandomPress``); None leaves both as kvpress would.
    """

    press: str = "SnapKVPress"
    options: tuple = ()
    seed: int | None = None
    model: object = field(default=None, compare=False, repr=False)
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    name: ClassVar[str] = "kvpress"

    # ---- construction and validation
    @classmethod
    def create(cls, name: str, **options) -> KvPress:
        """``KvPress`` for ``kvpress:<PressName>`` with press arguments (and ``seed``), validated against the
        installed kvpress."""
        seed = options.pop("seed", None)
        press = canonical_name(name)[len(PREFIX):]
        if not press:
            raise PressError(f"selector {name!r} names no press; form: kvpress:<PressName>[:key=value,...], e.g. "
                             "kvpress:SnapKVPress:window_size=64")
        out = cls(press=press, options=tuple(sorted(options.items())), seed=seed)
        out.build(0.5)  # resolves the class, checks every argument, constructs it once
        return out

    @property
    def label(self) -> str:
        """The selector name in result tables: ``kvpress:<PressName>``."""
        return PREFIX + self.press

    def __post_init__(self) -> None:
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise PressError(f"{self.label}: seed must be an int or None; got {self.seed!r}")

    def build(self, compression_ratio: float):
        """A fresh press instance with this selector's arguments at ``compression_ratio``."""
        kvpress = import_kvpress(self.label)
        cls = _resolve_class(self.press, kvpress, self.label)
        options = dict(self.options)
        inner_options = {k[len("press."):]: options.pop(k) for k in list(options) if k.startswith("press.")}
        if "compression_ratio" in options or "compression_ratio" in inner_options:
            raise PressError(f"{self.label}: compression_ratio is set by the budget (compression_ratio = 1 - budget); "
                             "remove it and pass --budget (e.g. --budget 0.1 runs the press at compression_ratio 0.9)")
        params = _parameters(cls)
        if self.seed is not None and "seed" in params:
            options.setdefault("seed", self.seed)
        if self.press in WRAPS_A_SCORER or "press" in params:
            inner = options.pop("press", None)
            if not isinstance(inner, str):
                raise PressError(f"{self.label} wraps a scorer press: name it, e.g. {self.label}:press=SnapKVPress "
                                 "(its arguments as press.<key>=value)")
            inner_selector = KvPress(press=canonical_name(PREFIX + inner)[len(PREFIX):],
                                     options=tuple(sorted(inner_options.items())), seed=self.seed)
            options["press"] = inner_selector.build(compression_ratio)
        elif inner_options:
            raise PressError(f"{self.label} wraps no press; arguments {sorted('press.' + k for k in inner_options)} "
                             f"do not apply. It takes: {', '.join(sorted(params)) or 'no arguments'}")
        for key, value in options.items():
            if key not in params:
                raise PressError(f"{self.label} has no argument {key!r}{_suggest(key, params)}; it takes: "
                                 f"{', '.join(sorted(params)) or 'no arguments'} (the budget sets compression_ratio)")
            if key != "press":
                _check_value(self.label, key, value, params[key])
                check_argument(self.label, key, value, params[key].default)  # its range, before any model loads
        try:
            press = cls(**options)
            press.compression_ratio = compression_ratio
        except (AssertionError, TypeError, ValueError) as err:
            raise PressError(f"{self.label} rejected its arguments {dict(self.options)}: {err}") from err
        return press

    # ---- the per-record pass
    def prepare(self, model, prefill: PrefillResult, prompt=None, factors=None) -> KvPress:
        """A copy bound to ``model``: :meth:`select` then runs the press on this record's history."""
        return replace(self, model=model, memo={})

    def compression(self, budget: Budget | float | int | str, length: int) -> tuple[float, int]:
        """``(compression_ratio, n_kept)`` for a budget over ``length`` history states (module docstring)."""
        b = Budget.coerce(budget)
        if b.ratio is not None:
            ratio = 1.0 - b.ratio
            kept = length if ratio <= 0 else max(1, int(length * (1 - ratio)))  # kvpress.utils.compute_n_kept
            return max(ratio, 0.0), kept
        kept = min(b.states, length)
        ratio = 1.0 - kept / length
        while ratio > 0 and int(length * (1 - ratio)) < kept:  # float rounding: the largest ratio keeping `kept`
            ratio = math.nextafter(ratio, 0.0)
        return ratio, kept

    def select(self, prefill: PrefillResult, prompt=None, budget: Budget | float | int | str = 0.10) -> Selection:
        length = prefill.history_length
        ratio, kept = self.compression(budget, length)
        info = {"selector": self.label, "press_options": dict(self.options), "compression_ratio": ratio,
                "budget_rule": "kvpress", "kvpress": KVPRESS_VERSION}
        if ratio == 0.0:  # kvpress's compress returns the cache unchanged
            full = Selection.full(length, prefill.num_layers, prefill.num_kv_heads)
            ones = torch.ones(full.positions.shape)
            return Selection(full.positions, full.valid, length, ones, info=info | {"budget": length})
        if self.model is None:
            raise PressError(f"{self.label} has no model to run the press with; select with the copy returned by "
                             "prepare(model, prefill, prompt) (the runner does this)")
        key = memo_key(prefill, ratio, kept)
        if key not in self.memo:  # the runner fills it for every press of a record at once (share_press_passes)
            score_presses([(self, ratio, kept)], prefill)
        positions, scores = self.memo[key]  # per layer [kv_head, n_l] long (sorted), float32
        counts = [int(p.shape[1]) for p in positions]
        info["budget"] = counts[0] if len(set(counts)) == 1 else counts
        return Selection.from_lists([list(p) for p in positions], length, scores=[list(s) for s in scores], info=info)

    def scorer(self, prefill: PrefillResult, ratio: float, kept: int) -> PressScorer:
        """This press at ``compression_ratio = ratio`` ready to score the layers of ``prefill``'s history."""
        press = self.build(ratio)
        length = prefill.history_length
        problem = history_problem(press, length)  # windows and sinks against this record's history
        if problem:
            raise TooShortError(f"{self.label} {problem}; got L={length}. Fix: lower it ({self.label}:<argument>=...) "
                                "or use longer histories")
        press.post_init_from_model(self.model)
        return PressScorer(self, press, prefill, ratio, kept, eager=self.press in NEEDS_ATTENTIONS)

