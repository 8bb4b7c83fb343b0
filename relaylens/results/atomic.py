"""Atomic file writes for outputs a reader may already rely on (reports, figures, tables).

:func:`write_atomic` writes to a temp file beside the target (``.tmp-<name>-<pid>``), flushes and fsyncs it, then
``os.replace`` s it onto the target: a full disk or a killed process leaves the previous file intact and at most a
temp file, never a truncated target.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "report.html"
    >>> write_atomic(path, "<html></html>").read_text()
    '<html></html>'
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["write_atomic", "OutputWriteError"]


class OutputWriteError(OSError):
    """Writing an output file failed; the previous file (if any) is intact and no temp file was left."""


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; returns ``path``.

    Raises :class:`OutputWriteError` (an ``OSError`` with the original errno) naming the file and the fix.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        fix = ("free space (or raise the file-size limit), or write elsewhere" if full else
               "check that the directory exists and is writable, or write elsewhere")
        kept = "the previous file is intact" if path.exists() else "nothing was written"
        raise OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}; {kept}. Fix: {fix}") from exc
    return path
