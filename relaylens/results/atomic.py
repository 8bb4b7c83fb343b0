"""Atomic file writes for outputs a reader may already rely on (reports, figures, tables): the run store's name for
the one implementation in :mod:`relaylens.fileio`, which the model cache uses too.

:func:`write_atomic` writes to a temp file beside the target (``.tmp-<name>-<pid>``, created fresh, never through a
link), flushes and fsyncs it, then ``os.replace`` s it onto the target: a full disk or a killed process leaves the
previous file intact and at most a temp file, never a truncated target. :func:`append_text`, :func:`read_text`,
:func:`safe_subdir` and :func:`check_below` (appends, cache reads and output folders that never go through a link)
are re-exported for the commands above the store (``experiments``, ``reporting``).

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "report.html"
    >>> write_atomic(path, "<html></html>").read_text()
    '<html></html>'
"""

from __future__ import annotations

from relaylens.fileio import (
    OutputWriteError,
    UnsafePathError,
    append_text,
    check_below,
    fsync_dir,
    read_text,
    safe_subdir,
    write_atomic,
)

__all__ = ["write_atomic", "fsync_dir", "OutputWriteError", "UnsafePathError", "append_text", "read_text",
           "safe_subdir", "check_below"]
