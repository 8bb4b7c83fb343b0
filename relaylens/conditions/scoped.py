"""Scoped conditions: one coordinate condition in some layers (or kv heads) only, a base condition everywhere else;
and :func:`get_condition`, the parser of every condition spec (unscoped names go to
:func:`relaylens.conditions.catalogue.parse_condition`, scoped ones to :func:`parse_scoped`).

Spec syntax::

    CONDITION@CLAUSE[@CLAUSE...]        e.g. relay@layers=0-9   relay@band=early   key_only@layers=20-29
                                             relay@layer_type=sliding_attention    relay@heads=3.0,3.1
                                             relay@band=late@base=key_only

* ``layers=`` layer indices and ranges (``0-9``, ``0,4,7-9``, ``all``, ``none``);
* ``band=`` ``early`` / ``middle`` / ``late`` (thirds of the layers, :func:`relaylens.conditions.bands.bands`);
* ``layer_type=`` a layer type of the model (``config.layer_types``; ``full_attention`` for models without them),
  or ``*``: the family "one scope per layer type", expanded by :func:`expand_conditions` (nothing when the model
  has a single layer type);
* ``heads=`` ``layer.kv_head`` pairs (``3.0,3.1``): physical kv heads, so every query head of the group follows;
* ``move=`` an integer: inside the scope the scoped condition's keys move that many positions towards the question
  (negative: away from it); ``relay@heads=3.0@move=1@base=relay`` is relay with kv head 0 of layer 3 one position
  closer (the finite shifts that check :mod:`relaylens.probes.sensitivity`). When a key would land below 0, every
  position shifts up by the same amount (distances unchanged). A move may bring a key to the question start itself
  (distance 0; relay's and original's nearest key is at distance 1), never past it
  (:func:`~relaylens.conditions.catalogue.check_coordinates` with ``at_question``);
* ``base=`` the condition of everything outside the scope (default ``original``); it is written last in labels.

Several scope clauses intersect (``relay@band=late@layer_type=full_attention``). The label is the canonical spec
(clauses in the order layers, band, layer_type, heads, base; ``base=original`` omitted), so it parses back to the
same condition and names the scope unambiguously in result tables.

**Construction.** All layers share one position per question token, so a scope is built from relative geometry.
Each (layer ``l``, kv head ``h``) uses one condition ``c`` (the scoped one inside the scope, the base outside) with
question start ``q_c`` and key positions ``k_{c,l,h,i}``. With the anchor ``S = max q_c`` over the conditions that
some (layer, head) uses, the kept keys go to ``S - (q_c - k_{c,l,h,i})`` and the question runs at ``S .. S+Q-1``
(generation continues at ``S+Q``). Every head then sees exactly its own condition's query-key distances, which is
all RoPE depends on; a sliding window measured on condition coordinates (the default ``window_mode``) is a distance
too. A scope covering everything has ``S = q_inner`` and reproduces the scoped condition's coordinates exactly; an
empty scope reproduces the base's exactly. Mixed scopes shift the minority condition by ``S - q_c`` (a common
shift: identical distances, logits equal up to RoPE's float rounding at the shifted angles). ``S`` never exceeds the
largest question start of the conditions involved, so a scope reaches no position its unscoped parts do not; the
runtime refuses positions past the model's rotary range (``max_position_embeddings``) with the scope's label.

Worked example (the design notes' ``L = 20``, ``M = 6``, ``relay@layers=0`` on two layers of one kv head; layer 0
keeps ``p = [2, 5, 6, 11, 17, 19]``, layer 1 keeps ``[0, 9, 18, 19]``). Layer 0 (relay): keys ``M - m + i = 0..5``,
``q_0 = 6``. Layer 1 (original): keys ``p_i``, ``q_1 = 20``. ``S = 20``: layer 0's keys go to
``20 - (6 - (M - m + i)) = 14..19``, layer 1's stay at ``p_i``, and the question starts at 20. In layer 0 the first
question token is 6 positions after the first kept key and 1 after the last, exactly as under unscoped relay.

    >>> from relaylens.geometry.selection import Selection
    >>> sel = Selection.from_lists([[[2, 5, 6, 11, 17, 19]], [[0, 9, 18, 19]]], history_length=20)
    >>> coords = get_condition("relay@layers=0").coordinates(sel)
    >>> coords.key_positions[:, 0].tolist(), coords.question_start
    ([[14, 15, 16, 17, 18, 19], [0, 9, 18, 19, -1, -1]], 20)
    >>> get_condition("relay @ band=late @ base=key_only").label
    'relay@band=late@base=key_only'
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

from relaylens.conditions.bands import BANDS, bands
from relaylens.conditions.catalogue import Condition, Coordinates, Original, make_coordinates, parse_condition
from relaylens.conditions.family import POSITION_RANGE, Learned, parse_family
from relaylens.errors import PositionError, RelaylensError

if TYPE_CHECKING:  # importing scoped conditions imports no torch; masks are built on torch selections
    import torch

    from relaylens.geometry.selection import Selection

ALL_LAYER_TYPES = "*"
"""``relay@layer_type=*``: one scoped condition per layer type of the model (Gemma-3's sliding and full layers)."""
_CLAUSES = ("layers", "band", "layer_type", "heads", "move", "base")


@dataclass(frozen=True)
class Scoped(Condition):
    """``inner`` inside the scope, ``base`` outside it; every scope field that is set restricts the scope.

    Attributes:
        inner: the condition applied inside the scope.
        layers: layer indices (``None``: no restriction; ``()``: the empty scope).
        band: ``early`` / ``middle`` / ``late`` (thirds of the selection's layers).
        layer_type: a layer type (needs the model's ``layer_types``: :meth:`bind`), or ``*`` (a family).
        heads: ``(layer, kv_head)`` pairs.
        move: positions the scoped condition's keys move towards the question inside the scope (0: none).
        base: the condition outside the scope.
        layer_types: per layer, the model's layer types (filled by :meth:`bind`; not part of the label).

    >>> from relaylens.conditions.catalogue import Relay
    >>> Scoped(Relay(), layers=(0, 1, 2, 5)).label
    'relay@layers=0-2,5'
    """

    inner: Condition
    layers: tuple[int, ...] | None = None
    band: str | None = None
    layer_type: str | None = None
    heads: tuple[tuple[int, int], ...] | None = None
    move: int = 0
    base: Condition = field(default_factory=Original)
    layer_types: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    name = "scoped"

    def __post_init__(self) -> None:
        for part, what in ((self.inner, "scoped"), (self.base, "base")):
            if isinstance(part, Scoped):
                raise RelaylensError(f"{what} condition {part.label!r} is itself scoped; scopes do not nest "
                                     "(intersect clauses instead: relay@band=late@layer_type=full_attention)")
        if self.band is not None and self.band not in BANDS:
            raise RelaylensError(f"band must be one of {BANDS}; got {self.band!r}")
        if self.layers is not None and any(int(l) < 0 for l in self.layers):
            raise RelaylensError(f"layers must be >= 0; got {list(self.layers)}")
        if isinstance(self.move, bool) or not isinstance(self.move, int) or abs(self.move) >= POSITION_RANGE:
            raise RelaylensError(f"condition {self.inner.label}@move={self.move!r}: move must be a whole number of "
                                 f"positions with |move| < 2**24 (the rotary range); got {self.move!r}. Fix: e.g. "
                                 "move=1 or move=-1")

    @property
    def label(self) -> str:
        parts = [self.inner.label]
        if self.layers is not None:
            parts.append(f"layers={format_layers(self.layers)}")
        if self.band is not None:
            parts.append(f"band={self.band}")
        if self.layer_type is not None:
            parts.append(f"layer_type={self.layer_type}")
        if self.heads is not None:
            parts.append("heads=" + (",".join(f"{l}.{h}" for l, h in sorted(set(self.heads))) or "none"))
        if self.move:
            parts.append(f"move={int(self.move):+d}")
        if self.base.label != "original":
            parts.append(f"base={self.base.label}")
        return "@".join(parts)

    @property
    def shift(self) -> int:
        """The largest position shift past the history of the two parts (the anchor never exceeds it by more than
        a negative ``move``)."""
        return max(int(getattr(self.inner, "shift", 0)), int(getattr(self.base, "shift", 0))) + max(0, -int(self.move))

    def bind(self, model_or_config) -> Scoped:
        """A copy that knows the model's layer types (needed by ``layer_type=`` scopes), checked against the model:
        a layer, kv head or layer type it does not have is refused here, before any record runs
        (:meth:`check_model`); a ``learned:`` part is bound too."""
        parts = {name: part.bind(model_or_config) for name, part in (("inner", self.inner), ("base", self.base))
                 if isinstance(part, Learned)}
        bound = dataclasses.replace(self, layer_types=model_layer_types(model_or_config), **parts)
        if bound.layer_type != ALL_LAYER_TYPES:
            bound.check_model(model_or_config)
        return bound

    def check_model(self, model_or_config) -> None:
        """Refuse a scope naming a layer, kv head or layer type the model lacks (the message names the condition,
        the clause and the model's range)."""
        config = getattr(model_or_config, "config", model_or_config)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = int(config.num_hidden_layers)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.scope_mask(SimpleNamespace(num_layers=layers, num_kv_heads=heads))  # raises naming what is missing

    def scope_mask(self, sel: Selection) -> torch.Tensor:
        """``[layer, kv_head]`` bool: True where the scoped condition applies."""
        import torch  # noqa: PLC0415 - torch-free room

        num_layers, num_heads = sel.num_layers, sel.num_kv_heads
        mask = torch.ones(num_layers, num_heads, dtype=torch.bool)
        if self.layers is not None:
            mask &= _layer_mask(self.layers, num_layers, self.label)[:, None]
        if self.band is not None:
            mask &= _layer_mask(bands(num_layers)[self.band], num_layers, self.label)[:, None]
        if self.layer_type is not None:
            mask &= self._type_mask(num_layers)[:, None]
        if self.heads is not None:
            chosen = torch.zeros(num_layers, num_heads, dtype=torch.bool)
            for layer, head in self.heads:
                if not (0 <= layer < num_layers and 0 <= head < num_heads):
                    raise RelaylensError(f"condition {self.label}: head {layer}.{head} does not exist; the model has "
                                         f"{num_layers} layers x {num_heads} kv heads (layer.kv_head from 0.0)")
                chosen[layer, head] = True
            mask &= chosen
        return mask

    def _type_mask(self, num_layers: int) -> torch.Tensor:
        import torch  # noqa: PLC0415 - torch-free room

        if self.layer_type == ALL_LAYER_TYPES:
            raise RelaylensError(f"condition {self.label} is a family (one scope per layer type); expand it for a "
                                 "model with relaylens.conditions.scoped.expand_conditions(specs, model)")
        if self.layer_types is None:
            raise RelaylensError(f"condition {self.label}: layer types come from the model; parse it with "
                                 "get_condition(spec, model=model) (the runner does this)")
        if len(self.layer_types) != num_layers:
            raise RelaylensError(f"condition {self.label}: bound to a model with {len(self.layer_types)} layers, "
                                 f"the selection has {num_layers}; bind it to the model that produced the selection")
        if self.layer_type not in self.layer_types:
            raise RelaylensError(f"condition {self.label}: the model has no {self.layer_type!r} layers; its layer "
                                 f"types are {sorted(set(self.layer_types))}")
        return torch.tensor([t == self.layer_type for t in self.layer_types])

    def coordinates(self, sel: Selection) -> Coordinates:
        import torch  # noqa: PLC0415 - torch-free room

        mask = self.scope_mask(sel)[..., None]  # [layer, kv_head, 1]
        inner, base = self.inner.coordinates(sel), self.base.coordinates(sel)
        used = (([inner.question_start] if bool(mask.any()) else [])
                + ([base.question_start] if bool((~mask).any()) else []))
        anchor = max(used)  # S
        keys = torch.where(mask, anchor - inner.question_start + inner.key_positions + int(self.move),
                           anchor - base.question_start + base.key_positions)  # [layer, kv_head, slot]
        low = keys[sel.valid].min()
        if bool(low < 0):  # a negative move pushed a key below 0: shift everything up (distances unchanged)
            keys, anchor = keys - low, anchor - low
        # a move towards the question may bring a head's nearest key to the question start itself (distance 0: the
        # finite shifts of the sensitivity readout at b = 1), never past it
        return make_coordinates(self.label, sel, keys, anchor, at_question=int(self.move) > 0)


def _layer_mask(layers, num_layers: int, label: str) -> torch.Tensor:
    import torch  # noqa: PLC0415 - torch-free room

    mask = torch.zeros(num_layers, dtype=torch.bool)
    for layer in layers:
        if not 0 <= int(layer) < num_layers:
            raise RelaylensError(f"condition {label}: layer {layer} does not exist; the model has {num_layers} "
                                 f"layers (0-{num_layers - 1})")
        mask[int(layer)] = True
    return mask


def format_layers(layers) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``; ``()`` -> ``"none"``."""
    values = sorted(set(int(l) for l in layers))
    if not values:
        return "none"
    runs, start = [], values[0]
    for prev, cur in zip(values, values[1:] + [None]):
        if cur is None or cur != prev + 1:  # a run ends at prev
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(runs)


def model_layer_types(model_or_config) -> tuple[str, ...]:
    """Per layer, ``config.layer_types`` (``sliding_attention`` / ``full_attention`` ...), or ``full_attention``
    for every layer of models whose config has none (``sliding_attention`` when it sets a ``sliding_window``)."""
    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(str(t) for t in types)
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    return ("sliding_attention" if window else "full_attention",) * int(config.num_hidden_layers)


_LAYERS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_HEADS = re.compile(r"^\d+\.\d+(,\d+\.\d+)*$")


def _parse_layers(raw: str, spec: str) -> tuple[int, ...] | None:
    if raw == "all":
        return None
    if raw == "none":
        return ()
    if not _LAYERS.match(raw):
        raise RelaylensError(f"condition {spec!r}: layers={raw!r} is not a list like 0-9 or 0,4,7-9 (or all / none)")
    out: list[int] = []
    for part in raw.split(","):
        low, _, high = part.partition("-")
        low_i, high_i = int(low), int(high or low)
        if high_i < low_i:
            raise RelaylensError(f"condition {spec!r}: range {part} runs backwards; write {high_i}-{low_i}")
        out.extend(range(low_i, high_i + 1))
    return tuple(sorted(set(out)))


def _parse_heads(raw: str, spec: str) -> tuple[tuple[int, int], ...]:
    if raw == "none":
        return ()
    if not _HEADS.match(raw):
        raise RelaylensError(f"condition {spec!r}: heads={raw!r} is not a list of layer.kv_head pairs like 3.0,3.1")
    return tuple(sorted({(int(l), int(h)) for l, h in (p.split(".") for p in raw.split(","))}))


def get_condition(spec: str | Condition, model=None) -> Condition:
    """Parse a condition name such as ``"relay"``, ``"query_only(2048)"``, ``"compaction(alpha=0.25)"``, or a scoped
    condition such as ``"relay@layers=0-9"`` (a :class:`~relaylens.conditions.catalogue.Condition` passes through).
    ``model`` (or its config) gives scoped conditions the layer types that ``layer_type=`` scopes need.

    >>> get_condition("random_order(3)").label
    'random_order(3)'
    >>> get_condition("relay@heads=3.1,3.0").label
    'relay@heads=3.0,3.1'
    """
    if isinstance(spec, Condition) or "@" in str(spec):
        condition = spec if isinstance(spec, Condition) else parse_scoped(str(spec))
    else:
        condition = parse_one(spec)
    if model is not None and isinstance(condition, (Scoped, Learned)):
        condition = condition.bind(model)
    return condition


def parse_one(spec: str) -> Condition:
    """One unscoped condition: the catalogue's (:func:`~relaylens.conditions.catalogue.parse_condition`) or the
    family's (``geometry(...)``, ``learned:RUN_DIR``: :func:`~relaylens.conditions.family.parse_family`)."""
    return parse_family(spec) or parse_condition(spec)


def parse_scoped(spec: str) -> Scoped:
    """Parse ``CONDITION@CLAUSE[@CLAUSE...]`` (see the module docstring)."""
    inner_spec, *clauses = [part.strip() for part in str(spec).split("@")]
    if not clauses or not all(clauses):
        raise RelaylensError(f"condition {spec!r}: expected CONDITION@CLAUSE, e.g. relay@layers=0-9")
    fields: dict = {"inner": parse_one(inner_spec)}
    for clause in clauses:
        key, sep, raw = (s.strip() for s in clause.partition("="))
        if not sep or key not in _CLAUSES:
            raise RelaylensError(f"condition {spec!r}: unknown scope clause {clause!r}; use one of "
                                 + ", ".join(f"{c}=" for c in _CLAUSES))
        if key in fields:
            raise RelaylensError(f"condition {spec!r}: clause {key}= given twice")
        if key == "layers":
            fields[key] = _parse_layers(raw, spec)
        elif key == "move":
            if not re.match(r"^[-+]?\d+$", raw):
                raise RelaylensError(f"condition {spec!r}: move={raw!r} is not a whole number of positions "
                                     "like 1 or -1")
            fields[key] = int(raw)
        elif key == "heads":
            fields[key] = _parse_heads(raw, spec)
        elif key == "base":
            fields[key] = parse_one(raw)
        elif key == "band" and raw not in BANDS:
            raise RelaylensError(f"condition {spec!r}: band must be one of {', '.join(BANDS)}; got {raw!r}")
        else:
            if not re.match(r"^(\*|[A-Za-z_][A-Za-z0-9_]*)$", raw):
                raise RelaylensError(f"condition {spec!r}: {key}={raw!r} is not a name")
            fields[key] = raw
    return Scoped(**fields)


def expand_conditions(specs, model) -> list[Condition]:
    """Parse ``specs`` for ``model``: scoped conditions learn its layer types, and ``layer_type=*`` families become
    one condition per layer type (none when the model has a single layer type, where it would repeat the
    unscoped condition).

    >>> from relaylens.testing import tiny_model
    >>> [c.label for c in expand_conditions(["original", "relay@layer_type=*"], tiny_model("gemma3"))]
    ['original', 'relay@layer_type=sliding_attention', 'relay@layer_type=full_attention']
    >>> [c.label for c in expand_conditions(["relay@layer_type=*"], tiny_model("llama"))]
    []
    """
    types = model_layer_types(model)
    out: list[Condition] = []
    for spec in specs:
        condition = get_condition(spec, model=model)  # scopes checked against the model, learned maps bound
        if isinstance(condition, Scoped) and condition.layer_type == ALL_LAYER_TYPES:
            distinct = list(dict.fromkeys(types))
            if len(distinct) > 1:
                family = [dataclasses.replace(condition, layer_type=t, layer_types=types) for t in distinct]
                for member in family:
                    member.check_model(model)
                out.extend(family)
        else:
            out.append(condition)
    return out


def unit_position_problem(conditions, selection: Selection, tail: int, limit: int) -> tuple[str, str] | None:
    """``(reason, detail)`` when some condition cannot place this selection, else None: its coordinates are refused
    (``position``: e.g. a ``move=`` that takes a key past the question), or its question start plus ``tail`` (question,
    teacher token and new tokens) passes ``limit``, the model's rotary range (``too_long``). The runner skips such a
    unit and records why, the way it skips a ``query_only`` shift past the range before the prefill: every position
    problem of one record is a skip, never an abort.

    >>> from relaylens.geometry.selection import Selection
    >>> sel = Selection.from_lists([[[2, 5, 6, 11, 17, 19]]], history_length=20)
    >>> unit_position_problem([get_condition("geometry(b=500)")], sel, tail=10, limit=512)[0]
    'too_long'
    >>> unit_position_problem([get_condition("relay@move=2")], sel, tail=10, limit=512)[0]
    'position'
    """
    for condition in conditions:
        condition = get_condition(condition)
        try:
            coords = condition.coordinates(selection)
        except PositionError as err:
            return "position", f"condition {condition.label} cannot place this selection: {err}"
        reach = float(coords.question_start.detach() if hasattr(coords.question_start, "detach")
                      else coords.question_start) + tail
        if reach > limit:
            return "too_long", (f"condition {condition.label} starts the question at {float(coords.question_start):g}, "
                                f"so it needs positions up to {reach - 1:g}, past the model's rotary range ({limit} "
                                "positions)")
    return None
