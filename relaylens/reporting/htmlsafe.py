"""HTML-safe formatting for the self-contained report: escaping that writes no URL, strict JSON for inline data.

Example:
    >>> from relaylens.reporting.htmlsafe import json_script, num
    >>> str(json_script({"a": [1, 2]})), num(0.5), num(float("nan")), defang("x://y")
    ('{"a":[1,2]}', '0.500', '', 'x:&#47;&#47;y')
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup, escape

__all__ = ["defang", "finalize", "num", "interval", "json_script", "clean", "records"]


def defang(text: str) -> str:
    return text.replace("://", ":&#47;&#47;")


def finalize(value: Any) -> Any:
    """Jinja ``finalize``: escape, then write ``://`` as ``:&#47;&#47;`` (renders the same, is no URL)."""
    if value is None:
        return ""
    if isinstance(value, Markup):
        return value
    if isinstance(value, str):
        return Markup(defang(str(escape(value))))
    return value


def num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    v = float(v)
    return f"{v:.{digits}f}" if abs(v) >= 10 ** -digits or v == 0 else f"{v:.2e}"


def interval(row: pd.Series, col: str, signed: bool = False) -> str:
    v = row.get(col)
    if v is None or not np.isfinite(v):
        return ""
    lo, hi = row.get(f"{col}_low"), row.get(f"{col}_high")
    head = f"{v:+.3f}" if signed else f"{v:.3f}"
    return head + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and np.isfinite(lo) and np.isfinite(hi) else "")


def json_script(data: Any) -> Markup:
    """JSON safe inside ``<script type="application/json">``: ``<``, ``>``, ``&`` and ``/`` escaped."""
    text = json.dumps(data, sort_keys=True, allow_nan=False, default=str, separators=(",", ":"))
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("/", "\\/")):
        text = text.replace(a, b)
    return Markup(text)


def clean(obj: Any) -> Any:
    """Replace NaN/inf with None and numpy scalars with Python ones (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def records(df: pd.DataFrame) -> list[dict]:
    return clean(df.to_dict(orient="records"))
