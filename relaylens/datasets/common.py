"""Shared reading helpers for the dataset readers: JSON / JSONL objects and uniform :class:`RecordError` messages."""

from __future__ import annotations

import gzip
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from relaylens.errors import RecordError

#: LongMemEval's date format, e.g. ``2023/05/30 (Tue) 23:40``.
LME_DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"


def record_error(path: Path | str, where: str, field: str, expected: str, got: Any, fix: str) -> RecordError:
    """A :class:`RecordError` naming the file, the record (id or line), the field, and the fix."""
    shown = repr(got)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return RecordError(f"{path}: {where}: field {field!r}: expected {expected}, got {shown}. Fix: {fix}")


def type_name(value: Any) -> str:
    return "missing" if value is _MISSING else type(value).__name__


_MISSING = object()


def get_field(obj: dict, key: str, types: type | tuple[type, ...], path, where: str, fix: str = "") -> Any:
    """``obj[key]`` checked against ``types``; a :class:`RecordError` when absent or of the wrong type."""
    value = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
    if value is _MISSING:
        raise record_error(path, where, key, f"a {names}", "<missing>", fix or f"add the {key!r} field")
    if not isinstance(value,
                      types) or (isinstance(value,
                                            bool) and bool not in (types if isinstance(types, tuple) else (types,))):
        raise record_error(path, where, key, f"a {names}", value, fix or f"store {key!r} as a {names}")
    return value


def parse_lme_date(text: Any, path, where: str, field: str) -> datetime:
    """Parse ``YYYY/MM/DD (Dow) HH:MM``; a :class:`RecordError` otherwise."""
    try:
        return datetime.strptime(text, LME_DATE_FORMAT)
    except (TypeError, ValueError):
        raise record_error(path, where, field, "a date like '2023/05/30 (Tue) 23:40' (%Y/%m/%d (%a) %H:%M)", text,
                           "write the date in LongMemEval's format") from None


def open_text(path: Path, errors: str | None = None):
    """A dataset file opened as UTF-8 text (a byte-order mark is not content); ``*.gz`` files are read through gzip,
    so a compressed JSON / JSON Lines file reads like the plain one."""
    if Path(path).name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors=errors)
    return open(path, encoding="utf-8-sig", errors=errors)


def data_suffix(path: Path) -> str:
    """The suffix that says what a dataset file holds, past a ``.gz`` (``x.json.gz`` -> ``.json``)."""
    path = Path(path)
    return Path(path.name[:-3]).suffix if path.name.endswith(".gz") else path.suffix


def iter_json_objects(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, object)`` for a JSON array, a single JSON object or JSON Lines.

    ``where`` is ``"item N"`` (array, 0-based) or ``"line N"`` (JSONL, 1-based). A line that is not valid JSON
    yields a :class:`RecordError` instance as its object so that a lenient reader can skip it.
    """
    with open_text(path) as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("["):
        with open_text(path) as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as err:
                raise RecordError(f"{path}: not valid JSON ({err}). Fix: repair the file or re-download it") from None
        for i, obj in enumerate(data):
            yield f"item {i}", obj
        return
    with open_text(path) as fh:
        lines = fh.readlines()
    try:
        first = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        first = None
    if first is None and head.startswith("{"):  # one pretty-printed object
        try:
            yield "item 0", json.loads("".join(lines))
            return
        except json.JSONDecodeError:
            pass
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield f"line {n}", json.loads(line)
        except json.JSONDecodeError as err:
            yield f"line {n}", RecordError(f"{path}: line {n}: not valid JSON ({err.msg} at column {err.colno}). "
                                           "Fix: each line of a JSONL file must be one complete JSON object")


def peek_text(path: Path, n: int = 1 << 20) -> str:
    """The first ``n`` characters of a text file (format detection)."""
    with open_text(path, errors="replace") as fh:
        return fh.read(n)
