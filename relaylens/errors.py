"""Error types raised by relaylens, and :func:`shown`, which makes dataset text safe to print in messages.

Every error relaylens raises on purpose derives from :class:`RelaylensError` *and* from :class:`ValueError`, so
callers that only know ``ValueError`` still catch them; the exception classes other modules define derive from it too
(``PullError`` is also a ``RuntimeError``). Messages say what was expected, what arrived and how to fix it
(``Fix: ...``). A builtin exception (``ValueError``, ``TypeError``, ``RuntimeError``) raised by relaylens code is a
broken internal invariant, a bug; the few builtin raises and exception bases kept on purpose (abstract methods,
protocol hooks, the ``OSError`` of a failed write) are listed with their reasons in ``tests/test_error_vocabulary.py``.

Example:
    >>> issubclass(ShapeError, RelaylensError), issubclass(RelaylensError, ValueError)
    (True, True)
"""

from __future__ import annotations

import unicodedata


class RelaylensError(ValueError):
    """Base class of every relaylens input error. ``multiline``: the message's line breaks are its own (every
    dataset string in it went through :func:`shown`), so the CLI prints them as lines; otherwise the message is
    printed as one line, a line break shown as ``\\n``."""

    multiline: bool = False


class PositionError(RelaylensError):
    """Positions that are unsorted, duplicated, negative or past the rotary range."""


class ShapeError(RelaylensError):
    """Tensors, masks or selections whose shapes disagree."""


class RopeError(RelaylensError):
    """A rotary embedding type or layout relaylens cannot relocate exactly."""


class TooShortError(ShapeError):
    """A history not longer than a selector's observation window: the record cannot run under that selector (a run
    records it as skipped, ``too_short``)."""


class BudgetError(RelaylensError):
    """A budget outside (0, 1] as a ratio, or not a positive number of states."""


class RecordError(RelaylensError):
    """A malformed dataset record; the message names the file, the record and the field."""


class NonFiniteError(RelaylensError):
    """A cache (keys or values) holding NaN or inf, or a relocation whose result would overflow the cache dtype."""


class LockPathError(RelaylensError):
    """A lock file path that is a symbolic link, a folder, a FIFO or a hard link to another file: relaylens never
    writes a lock through it (:mod:`relaylens.fileio`)."""


class ModelError(RelaylensError):
    """A model spec that names nothing loadable: unknown embedded name, missing path, unpulled model offline, a
    damaged cached copy."""


_VISIBLE = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl",
           "Zp"}  # control, format (bidi), surrogate, private, unassigned, separators


def shown(text) -> str:
    """``text`` safe to print on a terminal: every control or format character (ANSI / OSC escapes, newlines,
    carriage returns, backspaces, C1 codes, bidirectional overrides, line separators) becomes a visible escape such
    as ``\\x1b`` or ``\\n``, so a dataset string can neither drive the terminal nor start a line of its own. Every
    place where dataset strings (record ids, details, judge replies) reach the terminal prints them through this.

    >>> shown("r1\\x1b]0;pwned\\x07\\nerror: forged"), shown("plain id: 42")
    ('r1\\\\x1b]0;pwned\\\\x07\\\\nerror: forged', 'plain id: 42')
    """
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _HIDDEN:
            out.append(ch)
        else:
            code = ord(ch)
            out.append(_VISIBLE.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                                            else f"\\U{code:08x}"))
    return "".join(out)
