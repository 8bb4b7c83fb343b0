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
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic", "fsync_dir", "OutputWriteError"]


class OutputWriteError(OSError):
    """Writing an output file failed; the previous file (if any) is intact and no temp file was left."""


def write_atomic(path: str | Path, data: bytes | str, writer: Callable | None = None, sync_dir: bool = False,
                 error: Callable[[OSError], OSError] | None = None) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; returns ``path``.

    ``writer(file, data)`` writes the bytes (default: ``file.write``; tests inject failing writers), ``sync_dir``
    also fsyncs the directory after the rename (run directories), and ``error(exc)`` builds the error raised on
    failure (default: :class:`OutputWriteError` naming the file and the fix). On failure the temp file is removed and
    the previous file, if any, is intact.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            (writer or _write)(f, payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync_dir:
            fsync_dir(path.parent)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise (error(exc) if error is not None else _output_error(path, exc)) from exc
    return path


def _write(f, data: bytes) -> None:
    f.write(data)


def _output_error(path: Path, exc: OSError) -> OutputWriteError:
    full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    fix = ("free space (or raise the file-size limit), or write elsewhere" if full else
           "check that the directory exists and is writable, or write elsewhere")
    kept = "the previous file is intact" if path.exists() else "nothing was written"
    return OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}; {kept}. Fix: {fix}")


def fsync_dir(path: Path) -> None:
    """fsync a directory (a rename inside it is durable); silently skipped where the OS does not allow it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
