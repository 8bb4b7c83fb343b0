"""KV-cache selectors on one interface: ``selector.select(prefill, prompt, budget) -> Selection``.

Each selector is a small frozen dataclass of hyperparameters (defaults documented on the class). Only BM25 and
FINCH read ``prompt`` (BM25 the question text; FINCH the question tokens, run once over the full cache by
:meth:`Selector.prepare`); the attention-based selectors read the prefill's window queries (SnapKV, PyramidKV,
AdaKV, ChunkKV, CaM, Scissorhands) or its captured column sums (H2O, see
:func:`relaylens.model.attention_stats.capture_column_sums`). The specification is ``reference/selectors.md``.

Owns: one file per selector (``bm25.py``, ``snapkv.py``, ...; the shared scoring in ``base.py``), the
:data:`REGISTRY` and :func:`make_selector`, :mod:`~relaylens.selectors.protection` (instruction and template
states kept outside the budget), and :mod:`~relaylens.selectors.kvpress_adapter` (every kvpress scorer press as the
selector ``kvpress:<PressName>``; its arguments' ranges in :mod:`~relaylens.selectors.kvpress_ranges`). In: a
:class:`~relaylens.model.prefill.PrefillResult`, the rendered prompt and a budget. Out: a sorted
:class:`~relaylens.geometry.selection.Selection` (per-state scores, replacement values for merging selectors).

May import: :mod:`relaylens.errors`, :mod:`relaylens.registry`, :mod:`relaylens.datasets`, :mod:`relaylens.model`,
:mod:`relaylens.geometry`; never conditions, generation or probes (one declared exception: FINCH's question pass, see
:mod:`~relaylens.selectors.finch`).

Writing a selector of your own takes :class:`Selector`, :class:`Budget` and :func:`resolve_budget` (a budget as a
kept count); :func:`random_prefill` is a synthetic prefill to try one on without a model.

Example:
    >>> from relaylens.selectors.synthetic import random_prefill
    >>> sel = make_selector("snapkv", window=8).select(random_prefill(length=96), None, 0.25)
    >>> sel.counts.tolist()
    [[24, 24], [24, 24]]
    >>> sorted(REGISTRY)
    ['adakv', 'bm25', 'cam', 'chunkkv', 'finch', 'full', 'h2o', 'pyramidkv', 'random', 'scissorhands', 'snapkv', 'streaming']
"""  # noqa: E501 - doctest: the expected output stays on one line

from __future__ import annotations

import dataclasses

from relaylens.errors import RelaylensError
from relaylens.registry import Registry, RegistryError
from relaylens.selectors.adakv import AdaKV
from relaylens.selectors.base import Budget, Selector, WindowScore, resolve_budget
from relaylens.selectors.bm25 import BM25
from relaylens.selectors.cam import CaM
from relaylens.selectors.chunkkv import ChunkKV
from relaylens.selectors.finch import Finch
from relaylens.selectors.full import FullKV
from relaylens.selectors.h2o import H2O
from relaylens.selectors.kvpress_adapter import KvPress, PressError, is_press_selector
from relaylens.selectors.pyramidkv import PyramidKV
from relaylens.selectors.random_selector import RandomSelector
from relaylens.selectors.scissorhands import Scissorhands
from relaylens.selectors.snapkv import SnapKV
from relaylens.selectors.streaming import StreamingLLM
from relaylens.selectors.synthetic import random_prefill

ENTRY_POINT_GROUP = "relaylens.selectors"
"""The entry-point group of selector plugins: ``[project.entry-points."relaylens.selectors"] NAME = "pkg.mod:Class"``
in a distribution's ``pyproject.toml`` makes ``Class`` the selector ``NAME`` (``--selector NAME``)."""


def check_selector_class(name: str, cls) -> None:
    """Refuse what cannot be the selector ``name``: a class that is no frozen-dataclass :class:`Selector`, or a name
    that is not lower case (names are matched in lower case) or that kvpress's prefix claims."""
    if not (isinstance(cls, type) and issubclass(cls, Selector) and dataclasses.is_dataclass(cls)):
        raise RegistryError(f"selector {name!r} is {cls!r}, not a Selector class. Fix: point it at a frozen dataclass "
                            "subclassing relaylens.selectors.Selector")
    if name != name.strip().lower() or is_press_selector(name):
        raise RegistryError(f"selector name {name!r} must be lower case, without surrounding spaces, and not start "
                            f"with kvpress: (selector names are matched that way). Fix: register it as "
                            f"{name.strip().lower().replace('kvpress:', '')!r}")


REGISTRY: Registry[type[Selector]] = Registry("selector", entry_point_group=ENTRY_POINT_GROUP,
                                              check=check_selector_class)
"""Every selector by name (``make_selector(name)``, ``--selector NAME``): one class per file of this package, then
the selectors of installed plugins (entry-point group :data:`ENTRY_POINT_GROUP`). A
:class:`~relaylens.registry.Registry`: a read-mostly mapping of name -> class."""
for _cls in (BM25, SnapKV, H2O, PyramidKV, AdaKV, ChunkKV, CaM, Scissorhands, Finch, StreamingLLM, RandomSelector,
             FullKV):
    REGISTRY.register(_cls.name, _cls)
del _cls


def is_selector_name(name: str) -> bool:
    """True for a registered selector name or a ``kvpress:<PressName>`` selector (checked when built)."""
    return name in REGISTRY or is_press_selector(name)


def selector_class(name: str) -> type[Selector]:
    """The class a selector name builds (:class:`KvPress` for ``kvpress:<PressName>``)."""
    if is_press_selector(name):
        return KvPress
    key = name.strip().lower()
    if key not in REGISTRY:
        raise RelaylensError(f"unknown selector {name!r}; choose one of {sorted(REGISTRY)} or kvpress:<PressName>")
    return REGISTRY[key]


def make_selector(name: str, **kwargs) -> Selector:
    """Build a registered selector by name with hyperparameter overrides, e.g. ``make_selector("adakv",
    floor_alpha=0.5)``, or a kvpress press, ``make_selector("kvpress:SnapKVPress", window_size=64)``
    (:mod:`~relaylens.selectors.kvpress_adapter`)."""
    if is_press_selector(name):
        return KvPress.create(name, **kwargs)
    key = name.strip().lower()
    if key not in REGISTRY:
        raise RelaylensError(f"unknown selector {name!r}; choose one of {sorted(REGISTRY)} or kvpress:<PressName>")
    cls = REGISTRY[key]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise RelaylensError(f"selector {key!r} has no hyperparameter(s) {unknown}; it takes {sorted(fields)}")
    return cls(**kwargs)


__all__ = [
    "REGISTRY",
    "ENTRY_POINT_GROUP",
    "check_selector_class",
    "make_selector",
    "is_selector_name",
    "selector_class",
    "KvPress",
    "PressError",
    "Budget",
    "Selector",
    "resolve_budget",
    "random_prefill",
    "WindowScore",
    "BM25",
    "SnapKV",
    "H2O",
    "PyramidKV",
    "AdaKV",
    "ChunkKV",
    "CaM",
    "Scissorhands",
    "Finch",
    "StreamingLLM",
    "RandomSelector",
    "FullKV",
]
