"""The geometry family: three parameters per (layer, kv_head) place the retained states at real-valued positions,
and ``learned:RUN_DIR``, a point of it learned by ``relaylens run learned_geometry``.

Axes: ``layer``, ``kv_head``, ``slot`` (:mod:`relaylens.geometry`). A head keeps ``m`` states at source positions
``p_0 < ... < p_{m-1}`` (``p_last = p_{m-1}``); ``L`` is the history length and ``M`` the largest ``m``.

Per (layer, kv_head) the distance from the question start ``q0`` to kept state ``i`` is

    ``d_i = b + s * g_i``,   ``g_i = (1 - alpha) * (p_last - p_i) + alpha * (m - 1 - i)``,   ``p'_i = q0 - d_i``:

``b`` is the distance from the last kept key to the question, ``s`` scales every gap behind it, and ``alpha``
mixes source gaps (``alpha = 0``) with unit gaps (``alpha = 1``). ``s < 1`` (closer than consecutive) and ``b > 1``
are allowed; positions must stay finite and strictly increasing per head (``s > 0`` and ``0 <= alpha <= 1``
guarantee it), otherwise :func:`family_coordinates` refuses, naming the layer and kv head. The question runs at
``q0 .. q0 + Q - 1`` with the anchor

    ``q0 = max(ceil(max d_i), round((1 - abar) * L + abar * M))``   (``abar``: mean ``alpha`` over the heads,
    ``round(x) = floor(x + 0.5)``)

so every position is ``>= 0``, and the known maps are exact points of the family (RoPE sees distances only; the
anchor fixes the common offset so they are the very same positions):

| condition | ``b`` | ``s`` | ``alpha`` | ``q0`` |
|---|---|---|---|---|
| ``original`` | ``L - p_last`` (per head) | 1 | 0 | ``L`` |
| ``relay`` | 1 (a head with ``m < M`` ends at ``M - 1`` too) | 1 | 1 | ``M`` |
| ``key_only`` | ``L - M + 1`` | 1 | 1 | ``L`` |
| ``compaction(a)``, ``half_gap`` | ``(1 - a)(L - p_last) + a`` (per head) | 1 | ``a`` | as compaction, up to its
rounding |

``relay`` and ``key_only`` are points at every sharing level (one ``b, s, alpha`` for all heads); ``original`` and
``compaction`` need one ``b`` per head. Heads are independent, so a head keeping a single state has ``p'_0 = q0 - b``.

Worked example (the design notes' ``L = 20``, ``M = 6``; head A keeps ``2, 5, 6, 11, 17, 19``, head B ``0, 9, 18,
19``), one global ``b = 2, s = 0.5, alpha = 0.5``: head A has ``g = 11, 9, 8, 5, 1.5, 0``, so ``d = 7.5, 6.5, 6, 4.5,
2.75, 2``; head B ``g = 11, 6, 1, 0``, ``d = 7.5, 5, 2.5, 2``. ``ceil(max d) = 8`` and ``round(0.5 * 20 + 0.5 * 6) =
13``, so ``q0 = 13``:

    >>> from relaylens.geometry.selection import Selection
    >>> sel = Selection.from_lists([[[2, 5, 6, 11, 17, 19], [0, 9, 18, 19]]], history_length=20)
    >>> coords = Geometry(b=2.0, s=0.5, alpha=0.5).coordinates(sel)
    >>> coords.key_positions[0].tolist(), coords.question_start
    ([[5.5, 6.5, 7.0, 8.5, 10.25, 11.0], [5.5, 8.0, 10.5, 11.0, -1.0, -1.0]], 13)
    >>> Geometry(b=1.0, s=1.0, alpha=1.0).coordinates(sel).key_positions[0, 1].tolist()   # relay: 2..5, q0 = M
    [2.0, 3.0, 4.0, 5.0, -1.0, -1.0]

Sharing levels: ``global`` (3 parameters), ``layer`` (3 per layer), ``head`` (3 per layer and kv head);
:func:`expand` broadcasts any of them to ``[layer, kv_head]``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from relaylens.conditions.catalogue import (
    CommonShift,
    Compaction,
    Condition,
    Coordinates,
    KeyOnly,
    Original,
    Relay,
    exact_number,
    make_coordinates,
    parse_condition,
)
from relaylens.errors import NonFiniteError, PositionError, RelaylensError, ShapeError

if TYPE_CHECKING:  # importing the family imports no torch
    import torch

    from relaylens.geometry.selection import Selection

SHARING = ("global", "layer", "head")
PARAMETERS = ("b", "s", "alpha")
LEARNED_FILE = "learned_geometry.json"
"""The file in a ``learned_geometry`` run directory that ``learned:RUN_DIR`` reads."""
LEARNED_PREFIX = "learned:"
POSITION_RANGE = 2**24
"""Positions the rotary embedding's float32 phases tell apart (:data:`relaylens.model.hf.POSITION_LIMIT`, repeated
here so that parsing a condition imports no torch): ``b`` and ``s`` must stay below it."""
RANGES = {"b": "0 < b < 2**24", "s": "0 < s < 2**24", "alpha": "0 <= alpha <= 1"}
"""The allowed range of each parameter, as messages state it."""


def _format_value(value) -> str:
    """A parameter (a number or nested lists of numbers) in label syntax: ``2``, ``[1,0.5]``, ``[[1,2],[3,4]]``."""
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    return exact_number(value)


def _in_range(name: str, value: float) -> bool:
    if name == "alpha":
        return 0.0 <= value <= 1.0
    return 0.0 < value < POSITION_RANGE


def check_parameter(name: str, value, where: str, fix: str | None = None) -> None:
    """Refuse a geometry parameter that is not a finite number in its range (:data:`RANGES`), or a per-layer /
    per-head list of them (rectangular, at most two levels deep); ``where`` names the condition or file, ``fix``
    replaces the default advice.

    >>> check_parameter("s", [1.0, float("nan")], "condition geometry")
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: condition geometry: s must be a finite number with 0 < s < 2**24 (or a per-layer / per-head list of them); got nan at index [1]. Fix: give s in that range
    """  # noqa: E501 - doctest: an exception message is matched on one line
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        value = value.tolist()  # a tensor or array of parameters

    def refuse(got, at: str = "") -> None:
        raise RelaylensError(f"{where}: {name} must be a finite number with {RANGES[name]} (or a per-layer / per-head "
                             f"list of them); got {got}{at}. {fix or f'Fix: give {name} in that range'}")

    def walk(item, path: tuple, depth: int) -> None:
        at = f" at index {list(path)}" if path else ""
        if isinstance(item, (list, tuple)):
            if depth == 2 or not item:
                refuse("a list nested too deep" if item else "an empty list", at)
            widths = {len(v) if isinstance(v, (list, tuple)) else -1 for v in item}
            if len(widths) > 1:
                refuse("rows of different lengths (a [layer][kv_head] list must be rectangular)", at)
            for index, v in enumerate(item):
                walk(v, path + (index,), depth + 1)
            return
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            refuse(f"{type(item).__name__} {item!r}"[:80], at)
        if not math.isfinite(float(item)) or not _in_range(name, float(item)):
            refuse(exact_number(item) if math.isfinite(float(item)) else str(float(item)), at)

    walk(value, (), 0)


def expand(values, num_layers: int, num_kv_heads: int, name: str = "parameter") -> torch.Tensor:
    """Broadcast a global (scalar), per-layer (``[layer]``) or per-head (``[layer, kv_head]``) parameter to float64
    ``[layer, kv_head]`` (autograd kept).

    >>> expand([1.0, 2.0], 2, 3).tolist()
    [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    """
    import torch  # noqa: PLC0415 - torch-free room

    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.float64)
    tensor = tensor.to(torch.float64)
    if tensor.dim() == 0:
        return tensor.expand(num_layers, num_kv_heads)
    if tensor.dim() == 1 and tensor.shape[0] == num_layers:
        return tensor[:, None].expand(num_layers, num_kv_heads)
    if tuple(tensor.shape) == (num_layers, num_kv_heads):
        return tensor
    raise ShapeError(f"geometry {name} has shape {tuple(tensor.shape)}; the selection has {num_layers} layers x "
                     f"{num_kv_heads} kv heads. Give a scalar (global), [{num_layers}] (per layer) or "
                     f"[{num_layers}, {num_kv_heads}] (per head)")


def sharing_of(values) -> str:
    """``global`` / ``layer`` / ``head`` from a parameter's nesting depth (0 / 1 / 2)."""
    depth = 0
    while isinstance(values, (list, tuple)):
        depth, values = depth + 1, values[0] if len(values) else 0.0
    if depth > 2:
        raise ShapeError(f"geometry parameters nest {depth} deep; give a scalar, [layer] or [layer][kv_head]")
    return SHARING[depth]


def gaps(sel: Selection, alpha: torch.Tensor) -> torch.Tensor:
    """``g_i = (1 - alpha)(p_last - p_i) + alpha (m - 1 - i)`` float64 ``[layer, kv_head, slot]`` (0 in padding)."""
    import torch  # noqa: PLC0415 - torch-free room

    counts = sel.counts  # [layer, kv_head]
    last = sel.positions.gather(-1, (counts - 1).clamp_min(0)[..., None]).double()  # [layer, kv_head, 1]: p_last
    slot = torch.arange(sel.positions.shape[-1], dtype=torch.float64)
    source_gap = last - sel.positions.double()  # p_last - p_i
    unit_gap = (counts[..., None] - 1).double() - slot  # m - 1 - i
    mix = alpha[..., None]
    out = (1.0 - mix) * source_gap + mix * unit_gap
    return torch.where(sel.valid, out, torch.zeros_like(out))


def anchor(sel: Selection, distances: torch.Tensor, alpha: torch.Tensor) -> int:
    """``q0 = max(ceil(max d), round((1 - abar) L + abar M))`` (see the module docstring)."""
    import torch  # noqa: PLC0415 - torch-free room

    has = sel.counts > 0  # [layer, kv_head]
    largest = float(torch.where(sel.valid, distances.detach(), torch.full_like(distances.detach(), -math.inf)).max())
    mean_alpha = float(alpha.detach()[has].mean()) if bool(has.any()) else 1.0
    reference = math.floor((1.0 - mean_alpha) * sel.history_length + mean_alpha * sel.max_count + 0.5)
    return max(math.ceil(largest) if math.isfinite(largest) else 0, reference)


def family_coordinates(sel: Selection, b, s, alpha, label: str = "geometry") -> Coordinates:
    """Real-valued :class:`Coordinates` of the family at ``(b, s, alpha)`` (each global, per layer or per head; tensors
    keep autograd, so positions are differentiable in the parameters). Refuses non-finite or non-monotone positions."""

    shape = (sel.num_layers, sel.num_kv_heads)
    b, s, alpha = (expand(v, *shape, name) for v, name in ((b, "b"), (s, "s"), (alpha, "alpha")))
    distances = b[..., None] + s[..., None] * gaps(sel, alpha)  # [layer, kv_head, slot]
    q0 = anchor(sel, distances, alpha)
    positions = q0 - distances
    check_positions(sel, positions, label, (b, s, alpha))
    return make_coordinates(label, sel, positions, q0)


def check_positions(sel: Selection, positions: torch.Tensor, label: str, params=None) -> None:
    """Refuse non-finite or not strictly increasing positions of valid slots, naming the first (layer, kv_head)."""
    import torch  # noqa: PLC0415 - torch-free room

    values = positions.detach()
    bad = sel.valid & ~torch.isfinite(values)
    if bool(bad.any()):
        layer, head = torch.nonzero(bad)[0, :2].tolist()
        raise NonFiniteError(f"geometry {label}: layer {layer} kv_head {head} has non-finite positions"
                             f"{_params_at(params, layer, head)}. Fix: check the parameters (a learned geometry that "
                             "diverged: lower --learning-rate)")
    both = sel.valid[..., 1:] & sel.valid[..., :-1]
    bad = both & ~(values[..., 1:] > values[..., :-1])
    if bool(bad.any()):
        layer, head = torch.nonzero(bad)[0, :2].tolist()
        shown = [round(v, 3) for v in values[layer, head][sel.valid[layer, head]].tolist()[:8]]
        raise PositionError(f"geometry {label}: layer {layer} kv_head {head} positions are not strictly increasing "
                            f"(start {shown}){_params_at(params, layer, head)}. Fix: keep s > 0 and 0 <= alpha <= 1")


def _params_at(params, layer: int, head: int) -> str:
    if params is None:
        return ""
    values = ", ".join(f"{name} = {float(p[layer, head].detach()):.4g}" for name, p in zip(PARAMETERS, params))
    return f" ({values})"


def family_point(condition: Condition | str, sel: Selection) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(b, s, alpha)`` float64 ``[layer, kv_head]`` at which the family reproduces ``condition`` on ``sel``:
    ``original``, ``relay``, ``key_only``, ``compaction(a)`` / ``half_gap`` (unrounded), a :class:`Geometry`,
    ``learned:RUN_DIR``, and ``common_shift`` (original's point: a common shift changes no distance)."""
    import torch  # noqa: PLC0415 - torch-free room

    if isinstance(condition, str):
        condition = parse_family(condition) or parse_condition(condition)
    shape = (sel.num_layers, sel.num_kv_heads)
    one, zero = torch.ones(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    last = sel.positions.gather(-1, (sel.counts - 1).clamp_min(0)[..., None])[..., 0].double()  # [layer, kv_head]
    if isinstance(condition, Geometry):
        return condition.parameters(*shape)
    if isinstance(condition, Relay):
        return one, one, one
    if isinstance(condition, KeyOnly):
        return one * (sel.history_length - sel.max_count + 1), one, one
    if isinstance(condition, (Original, CommonShift)):
        return sel.history_length - last, one, zero
    if isinstance(condition, Compaction):
        a = float(condition.alpha)
        return (1.0 - a) * (sel.history_length - last) + a, one, one * a
    raise RelaylensError(f"condition {condition.label} is not a point of the geometry family (points: original, relay, "
                         "key_only, compaction(a), half_gap, common_shift, geometry and learned:RUN_DIR)")


@dataclass(frozen=True, eq=False)
class Geometry(Condition):
    """A point of the family: ``b``, ``s``, ``alpha`` each a number (global), a per-layer list or a per-head list
    of lists; real-valued key positions, an integer question start (:func:`family_coordinates`)."""

    b: object = 1.0
    s: object = 1.0
    alpha: object = 1.0
    name = "geometry"

    def __post_init__(self) -> None:
        where = f"condition {self.name}" if not isinstance(self, Learned) else f"condition {self.label}"
        for name in PARAMETERS:
            check_parameter(name, getattr(self, name), where)

    @property
    def label(self) -> str:
        """``geometry(b=..,s=..,alpha=..)`` with every parameter exact (a per-layer or per-head one as a list): it
        parses back to the same parameters, and two different points never share a label."""
        return "geometry(" + ",".join(f"{p}={_format_value(getattr(self, p))}" for p in PARAMETERS) + ")"

    def parameters(self, num_layers: int, num_kv_heads: int):
        """``(b, s, alpha)`` float64 ``[layer, kv_head]``."""
        return tuple(expand(getattr(self, p), num_layers, num_kv_heads, p) for p in PARAMETERS)

    def coordinates(self, sel: Selection) -> Coordinates:
        return family_coordinates(sel, *self.parameters(sel.num_layers, sel.num_kv_heads), label=self.label)


@dataclass(frozen=True, eq=False)
class Learned(Geometry):
    """``learned:RUN_DIR``: the parameters a ``learned_geometry`` run saved in ``RUN_DIR/learned_geometry.json``,
    with what they were learned on (model, selector, budget, train records) for the checks of the runner."""

    run_dir: str = ""
    info: dict = field(default_factory=dict, repr=False)
    display: str | None = None  # the label in result tables (default ``learned:RUN_DIR``)
    name = "learned"

    @property
    def label(self) -> str:
        return self.display or f"{LEARNED_PREFIX}{self.run_dir}"

    @property
    def sha256(self) -> str:
        """The SHA-256 of the learned file's content (canonical JSON: key order and spacing do not count): what a run
        using this condition records in its manifest and pins (resume and merge refuse another content)."""
        return content_sha256(self.info)

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, display: str | None = None) -> Learned:
        """Read ``RUN_DIR/learned_geometry.json`` (written when a ``learned_geometry`` run finishes training); every
        field it holds is checked (:func:`check_learned_info`)."""
        path = Path(run_dir) / LEARNED_FILE
        if not path.is_file():
            raise RelaylensError(f"learned:{run_dir}: no {LEARNED_FILE} in that directory. Fix: pass the --out "
                                 "directory of a finished `relaylens run learned_geometry` (it is written when "
                                 "training ends)")
        try:
            info = json.loads(path.read_text("utf-8"), parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError) as err:
            raise RelaylensError(f"learned:{run_dir}: {path} is not a learned geometry ({type(err).__name__}: {err}). "
                                 "Fix: rerun `relaylens run learned_geometry` into that directory") from None
        return cls.from_info(info, run_dir, display, where=f"learned:{run_dir}: {path}")

    @classmethod
    def from_info(cls, info: dict, run_dir: str | Path, display: str | None = None,
                  where: str | None = None) -> Learned:
        """The condition of a learned file's parsed content ``info`` (checked by :func:`check_learned_info`)."""
        check_learned_info(info, where or f"learned:{run_dir}")
        params = {p: info["parameters"][p] for p in PARAMETERS}
        return cls(**{p: _frozen(v) for p, v in params.items()}, run_dir=str(run_dir), info=info, display=display)

    def bind(self, model_or_config) -> Learned:
        """Check that the geometry was learned on a model of this shape (layers, kv heads); returns ``self``."""
        config = getattr(model_or_config, "config", model_or_config)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        shape = (int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None)
                                                     or config.num_attention_heads))
        learned = (self.info.get("num_layers"), self.info.get("num_kv_heads"))
        if tuple(learned) != shape:
            model = (self.info.get("model") or {}).get("spec", "?")
            raise RelaylensError(f"condition {self.label} was learned on {model} ({learned[0]} layers x {learned[1]} "
                                 f"kv heads); this model has {shape[0]} x {shape[1]}. Fix: learn a geometry for this "
                                 "model (relaylens run learned_geometry --model ...) and pass that run directory")
        return self


def content_sha256(info: dict) -> str:
    """SHA-256 of ``info`` as canonical JSON (sorted keys, no spacing)."""
    text = json.dumps(info, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _no_constant(name: str):
    raise RelaylensError(f"{name} is not a number JSON allows")  # a fragment: read() names the file and the fix


#: the optional fields of a learned file and the types they must have when present
_LEARNED_FIELDS = {"num_layers": int, "num_kv_heads": int, "selector": str, "budget": (int, float), "sharing": str,
                   "prompt_mode": str, "train_records": list, "test_records": list, "model": dict, "fit": dict,
                   "seed": int, "options": dict}


def check_learned_info(info, where: str) -> None:
    """Refuse a learned file whose fields have the wrong type or range, naming ``where`` (the condition and file),
    the field and what it must be: ``parameters`` (``b``, ``s``, ``alpha``, each :func:`check_parameter`), and when
    present ``num_layers`` / ``num_kv_heads`` (whole numbers >= 1, matching the parameters' shape), ``selector``,
    ``budget``, ``sharing``, ``prompt_mode``, ``train_records`` / ``test_records`` (lists of record ids), ``model``,
    ``fit``, ``seed``, ``options``."""
    fix = "Fix: rerun `relaylens run learned_geometry` into that directory (the file is written when training ends)"
    if not isinstance(info, dict):
        raise RelaylensError(f"{where}: expected a JSON object; got {type(info).__name__}. {fix}")
    params = info.get("parameters")
    if not isinstance(params, dict) or any(p not in params for p in PARAMETERS):
        raise RelaylensError(f"{where}: field 'parameters' must be an object with b, s and alpha; got "
                             f"{sorted(params) if isinstance(params, dict) else type(params).__name__}. {fix}")
    for name in PARAMETERS:
        check_parameter(name, params[name], f"{where}: field 'parameters'", fix)
    for name, kind in _LEARNED_FIELDS.items():
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            wanted = {int: "a whole number", str: "a string", list: "a list", dict: "an object"}.get(kind, "a number")
            raise RelaylensError(f"{where}: field {name!r} must be {wanted}; got {type(value).__name__} "
                                 f"{str(value)[:60]!r}. {fix}")
    for name in ("num_layers", "num_kv_heads"):
        if info.get(name) is not None and info[name] < 1:
            raise RelaylensError(f"{where}: field {name!r} must be >= 1; got {info[name]}. {fix}")
    if info.get("budget") is not None and not (math.isfinite(info["budget"]) and info["budget"] > 0):
        raise RelaylensError(f"{where}: field 'budget' must be a ratio in (0, 1] or a number of states; got "
                             f"{info['budget']}. {fix}")
    for name in ("train_records", "test_records"):
        if info.get(name) is not None and not all(isinstance(r, str) for r in info[name]):
            raise RelaylensError(f"{where}: field {name!r} must list record ids (strings). {fix}")
    _check_learned_shape(params, info, where, fix)


def _check_learned_shape(params: dict, info: dict, where: str, fix: str) -> None:
    """The parameters' shape agrees with ``num_layers`` x ``num_kv_heads`` (where the file gives them)."""
    layers, heads = info.get("num_layers"), info.get("num_kv_heads")
    for name in PARAMETERS:
        value = params[name]
        shape = (len(value), len(value[0]) if isinstance(value[0], list) else None) if isinstance(value, list) else ()
        wrong = (len(shape) >= 1 and layers is not None and shape[0] != layers) or \
                (len(shape) == 2 and shape[1] is not None and heads is not None and shape[1] != heads)
        if wrong:
            raise RelaylensError(f"{where}: field 'parameters' {name} has shape {[d for d in shape if d is not None]}; "
                                 f"the file's model has {layers} layers x {heads} kv heads. {fix}")


def _frozen(values):
    return tuple(_frozen(v) for v in values) if isinstance(values, (list, tuple)) else float(values)


_GEOMETRY = re.compile(r"^\s*geometry\s*\((.*)\)\s*$")


def parse_family(spec: str) -> Geometry | None:
    """``learned:RUN_DIR`` or ``geometry(b=B,s=S,alpha=A)`` as a condition (omitted parameters are relay's 1; each a
    number, or a per-layer ``[..]`` / per-head ``[[..],..]`` list, as :attr:`Geometry.label` writes them); None for
    any other spec. Every parameter is checked here (:func:`check_parameter`).

    >>> parse_family("geometry(s=0.5)").label, parse_family("relay") is None
    ('geometry(b=1,s=0.5,alpha=1)', True)
    >>> parse_family("geometry(b=[1,2.5])").label
    'geometry(b=[1,2.5],s=1,alpha=1)'
    """
    text = str(spec).strip()
    if text.startswith(LEARNED_PREFIX):
        return parse_learned(text)
    match = _GEOMETRY.match(text)
    if not match:
        return None
    values: dict = {}
    for part in filter(None, (p.strip() for p in _top_level_parts(match.group(1)))):
        key, eq, raw = (t.strip() for t in part.partition("="))
        if not eq or key not in PARAMETERS or key in values:
            raise RelaylensError(f"condition {spec!r}: expected geometry(b=B,s=S,alpha=A) with each of b, s, alpha at "
                                 f"most once; got {part!r}. Fix: e.g. geometry(b=2,s=0.5,alpha=0.5)")
        values[key] = _parse_value(raw, key, spec)
    return Geometry(**values)


def _top_level_parts(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return parts + [text[start:]]


def _parse_value(raw: str, key: str, spec: str):
    """A number or a bracketed list of numbers (tuples inside, so the condition stays hashable-friendly)."""
    try:
        value = ast.literal_eval(raw) if raw.startswith("[") else float(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise RelaylensError(f"condition {spec!r}: {key} must be a number (or a [per-layer] list of numbers); got "
                             f"{raw[:60]!r}. Fix: e.g. geometry(b=2,s=0.5,alpha=0.5), or b=[1,2] with one value "
                             "per layer") from None
    check_parameter(key, value, f"condition {spec!r}")
    return _frozen(value) if isinstance(value, list) else value


def parse_learned(spec: str) -> Learned:
    """``learned:RUN_DIR`` -> :class:`Learned` (the directory must hold a finished run's ``learned_geometry.json``)."""
    run_dir = spec.strip()[len(LEARNED_PREFIX):].strip()
    if not run_dir:
        raise RelaylensError("condition 'learned:' names no run directory. Fix: learned:RUN_DIR, the --out of a "
                             "`relaylens run learned_geometry`")
    return Learned.from_run_dir(run_dir)
