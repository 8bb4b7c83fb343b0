"""Stored token views of a run: ``RUN_DIR/views/<unit hash>.json``, one per (record, selector, budget), written as the
run commits units (capture: :mod:`relaylens.probes.token_view`; rendering: :mod:`relaylens.reporting.token_view`).

A view is named by its unit's key hash (:class:`relaylens.results.store.UnitKey`), like the unit file, so any record
id (long, or differing only in punctuation) gets a file of its own; it is written atomically, and a resumed run
writes the views that are missing (:func:`has_view`). Reading checks each view's shape: a damaged file is skipped
with a warning naming it, never an error (views written before the hash names load too).

Example:
    >>> import tempfile
    >>> run = tempfile.mkdtemp()
    >>> view = {"record_id": "q 1", "selector": "bm25", "budget": 0.1, "order": 0, "tokens": ["a", "b"], "gold": [1],
    ...         "kept": [[0, 1]], "attention": {"original": [[0.5, 0.5]]}}
    >>> write_view(run, view).name == UnitKey("q 1", "bm25", 0.1).hash + ".json", has_view(run, ("q?1", "bm25", 0.1))
    (True, False)
    >>> [v["record_id"] for v in load_views(run)]
    ['q 1']
"""

from __future__ import annotations

import json
import numbers
import warnings
from pathlib import Path

from relaylens.errors import RelaylensError
from relaylens.fileio import safe_subdir
from relaylens.results.atomic import write_atomic
from relaylens.results.store import UnitKey

__all__ = ["VIEWS", "view_path", "write_view", "read_view", "has_view", "view_files", "load_views"]

VIEWS = "views"


def _key(view: dict) -> UnitKey:
    return UnitKey(view["record_id"], view["selector"], view["budget"])


def view_path(run_dir: str | Path, key: dict | tuple) -> Path:
    """``RUN_DIR/views/<unit hash>.json`` of a unit key (a tuple, or a dict with its three fields)."""
    key = _key(key) if isinstance(key, dict) else UnitKey(*key)
    return Path(run_dir) / VIEWS / f"{key.hash}.json"


def write_view(run_dir: str | Path, view: dict) -> Path:
    """Write one view atomically (:func:`relaylens.results.atomic.write_atomic`)."""
    path = view_path(run_dir, view)
    safe_subdir(run_dir, VIEWS)  # a linked views/ is refused, never written through
    return write_atomic(path, json.dumps(view, separators=(",", ":")))


def _problem(view) -> str | None:
    """What is wrong with a parsed view, or None."""
    if not isinstance(view, dict):
        return f"expected a JSON object, got {type(view).__name__}"
    kinds = {"record_id": str, "selector": str, "tokens": list, "gold": list, "kept": list, "attention": dict}
    for field, kind in kinds.items():
        if not isinstance(view.get(field), kind):
            return f"field {field!r} should be a {kind.__name__}, got {type(view.get(field)).__name__}"
    if not isinstance(view.get("budget"), numbers.Real) or isinstance(view.get("budget"), bool):
        return f"field 'budget' should be a number, got {view.get('budget')!r}"
    if not isinstance(view.get("order", 0), int):
        return f"field 'order' should be an integer, got {view.get('order')!r}"
    n, kept = len(view["tokens"]), view["kept"]
    if not all(isinstance(t, str) for t in view["tokens"]) \
            or not all(isinstance(i, int) and 0 <= i < n for i in view["gold"]) \
            or not all(isinstance(ps, list) and all(isinstance(p, int) and 0 <= p < n for p in ps) for ps in kept):
        return "tokens, gold and kept positions do not fit together"
    for condition, layers in view["attention"].items():
        if not isinstance(layers, list) or len(layers) != len(kept) or not all(
                isinstance(row, list) and len(row) == len(ps) and all(isinstance(a, numbers.Real) for a in row)
                for row, ps in zip(layers, kept)):
            return f"attention of {condition!r} does not have one weight per kept position and layer"
    return None


def read_view(path: Path) -> dict:
    """One stored view; :class:`~relaylens.errors.RelaylensError` (a ``ValueError``) naming the file and what is wrong
    when it is damaged (:func:`view_files` adds the fix: the file is written again)."""
    try:
        view = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise RelaylensError(f"token view {path} is damaged ({type(exc).__name__}: {exc})") from None
    problem = _problem(view)
    if problem:
        raise RelaylensError(f"token view {path} is damaged ({problem})")
    return view


def has_view(run_dir: str | Path, key: tuple) -> bool:
    """True when the unit ``key`` has a readable view of its own (a missing or damaged one is written again)."""
    path = view_path(run_dir, key)
    try:
        return path.exists() and _key(read_view(path)) == UnitKey(*key).normalised()
    except ValueError:
        return False


def view_files(run_dir: str | Path) -> list[tuple[Path, dict]]:
    """``(path, view)`` of every readable stored view, one per unit (the hash-named file first); a damaged file is
    skipped with a warning naming it."""
    folder = Path(run_dir) / VIEWS
    if not folder.is_dir():
        return []
    out: dict[UnitKey, tuple[Path, dict]] = {}
    for path in sorted(folder.glob("*.json"), key=lambda p: (len(p.stem) != 24, p.name)):  # hash names first
        try:
            view = read_view(path)
        except ValueError as err:
            warnings.warn(f"{err}; it is left out. Fix: delete it and re-run the same command to write it again",
                          stacklevel=3)
            continue
        out.setdefault(_key(view).normalised(), (path, view))
    return list(out.values())


def load_views(run_dir: str | Path, records: int | None = 3) -> list[dict]:
    """Stored views of the first ``records`` records (in the order the run processed them), each unit in order."""
    views = [view for _, view in view_files(run_dir)]
    views.sort(key=lambda v: (v.get("order", 0), v["record_id"], v["selector"], float(v["budget"])))
    chosen: list[str] = []
    for v in views:
        if v["record_id"] not in chosen:
            chosen.append(v["record_id"])
    keep = set(chosen if records is None else chosen[:records])
    return [v for v in views if v["record_id"] in keep]
