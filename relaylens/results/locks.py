"""Exclusive locks on run directories: one writer at a time (``run``, ``merge``, ``report``, ``figures``, ``judge``).

A writer holds ``RUN_DIR/.relaylens.lock`` with ``fcntl.flock`` for as long as it writes, and records its pid and
command in the file, so that a second writer stops at once with one line naming the holder instead of deleting the
first writer's temporary files mid-write. The kernel drops the lock when the holder exits (even on SIGKILL), so a
crashed run never leaves a stale lock; the lock file is removed on release (under the lock, with an inode check, so
a waiting process never ends up holding a lock on a deleted file).

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with run_lock(d, "report"):
    ...     try:
    ...         with run_lock(d, "figures"):  # a second writer on the same directory
    ...             pass
    ...     except RunLockedError as err:
    ...         print(str(err).split(":")[0] == f"{d} is in use by another relaylens process")
    True
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from relaylens.errors import RelaylensError

__all__ = ["LOCK_NAME", "RunLockedError", "run_lock", "lock_holder", "output_lock"]

LOCK_NAME = ".relaylens.lock"


class RunLockedError(RelaylensError):
    """Another relaylens process is writing into the same run directory."""


def lock_holder(directory: str | Path) -> dict | None:
    """``{"pid", "command", "since"}`` recorded by the current holder of ``directory``'s lock, or None."""
    try:
        return json.loads((Path(directory) / LOCK_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def run_lock(directory: str | Path, command: str) -> Iterator[Path]:
    """Hold the exclusive writer lock of ``directory`` (which must exist) for the ``with`` block.

    Raises :class:`RunLockedError` at once (no waiting) when another process holds it, naming that process's pid
    and command. ``command`` is recorded for the next one to read (``"run"``, ``"merge"``, ...).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks; the atomic renames still apply
        yield Path(directory)
        return
    path = Path(directory) / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise RunLockedError(f"cannot lock {directory} for `{command}`: {exc.strerror}. Fix: choose a writable "
                                     "directory (--out)") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            holder = lock_holder(directory) or {}
            who = (f"pid {holder.get('pid')} (`relaylens {holder.get('command')}`, since {holder.get('since')})"
                   if holder.get("pid") else "a process that has not yet recorded its pid")
            raise RunLockedError(f"{directory} is in use by another relaylens process: {who}; `{command}` refuses "
                                 "to write into it at the same time. Fix: wait for that process to finish (or stop "
                                 "it), or choose another --out") from None
        # the file we locked may have been unlinked by the previous holder between our open and flock: retry
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        info = json.dumps({"pid": os.getpid(), "command": command,
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        yield Path(directory)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # closing releases the flock


def output_lock(out_dir: str | Path, run_dirs: Sequence[str | Path], command: str):
    """The writer lock for output written into ``out_dir``: the run directory that holds it (a second writer of
    that run waits its turn), else ``out_dir`` itself (created). A run directory that is only read is never locked,
    so a read-only run renders into another ``--out``."""
    out_dir = Path(out_dir).resolve()
    for run_dir in run_dirs:
        if out_dir == Path(run_dir).resolve() or Path(run_dir).resolve() in out_dir.parents:
            return run_lock(run_dir, command)
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_lock(out_dir, command)
