"""Selector arguments as text: ``NAME[:key=value,...]`` (``relaylens run --selector``, the TransformerLens export's
``selector=``), parsed once for every caller.

Example:
    >>> parse_selector_arg("h2o:recent=4")
    ('h2o', {'recent': 4})
"""

from __future__ import annotations

from relaylens.errors import RelaylensError
from relaylens.selectors.kvpress_adapter import PREFIX, canonical_name, is_press_selector

__all__ = ["parse_selector_arg"]


def parse_selector_arg(text: str) -> tuple[str, dict]:
    """``NAME[:key=value,...]`` -> ``(name, options)`` (values read as bool, int, float or text; each selector
    checks types and ranges when it is built, before any model loads). A kvpress press is
    ``kvpress:<PressName>[:key=value,...]``; its name keeps the press's spelling.

    >>> parse_selector_arg("bm25:packing=truncate,k1=1.2")
    ('bm25', {'packing': 'truncate', 'k1': 1.2})
    >>> parse_selector_arg("kvpress:snapkvpress:window_size=64")
    ('kvpress:SnapKVPress', {'window_size': 64})
    """
    if is_press_selector(text):
        press, _, rest = text.strip()[len(PREFIX):].partition(":")
        return canonical_name(PREFIX + press), _options(text, rest)
    name, _, rest = text.strip().partition(":")
    return name.strip().lower(), _options(text, rest)


def _options(text: str, rest: str) -> dict:
    options = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise RelaylensError(f"--selector {text!r}: {part!r} is not key=value. Form: NAME[:key=value,...], e.g. "
                                 "bm25:packing=truncate")
        options[key.strip()] = _value(value)
    return options


def _value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()
