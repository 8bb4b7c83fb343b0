"""Exclusive locks on run directories: one writer at a time (``run``, ``merge``, ``report``, ``figures``, ``judge``).

A writer holds ``RUN_DIR/.relaylens.lock`` with ``fcntl.flock`` for as long as it writes, and records its pid and
command in the file, so that a second writer stops at once with one line naming the holder instead of deleting the
first writer's temporary files mid-write. The kernel drops the lock when the holder exits (even on SIGKILL), so a
crashed run never leaves a stale lock; the lock file is removed on release (under the lock, with an inode check, so
a waiting process never ends up holding a lock on a deleted file). The lock is :func:`relaylens.fileio.exclusive_lock`,
the one implementation the model cache's ``model pull`` uses too: a lock name that is a symbolic link (or a folder,
a FIFO, a hard link) is refused naming the path, never written through.

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

from collections.abc import Sequence
from pathlib import Path

from relaylens.errors import LockPathError, RelaylensError
from relaylens.fileio import exclusive_lock, read_lock_note

__all__ = ["LOCK_NAME", "RunLockedError", "LockPathError", "run_lock", "lock_holder", "output_lock"]

LOCK_NAME = ".relaylens.lock"


class RunLockedError(RelaylensError):
    """Another relaylens process is writing into the same run directory."""


def lock_holder(directory: str | Path) -> dict | None:
    """``{"pid", "command", "since"}`` recorded by the current holder of ``directory``'s lock, or None."""
    return read_lock_note(Path(directory) / LOCK_NAME)


def run_lock(directory: str | Path, command: str):
    """Hold the exclusive writer lock of ``directory`` (which must exist) for the ``with`` block.

    Raises :class:`RunLockedError` at once (no waiting) when another process holds it, naming that process's pid
    and command; ``command`` is recorded for the next one to read (``"run"``, ``"merge"``, ...). A lock name that is
    a symbolic link or anything but relaylens's own regular file is refused with
    :class:`~relaylens.errors.LockPathError` (:func:`relaylens.fileio.exclusive_lock`), never written through.
    """

    def busy() -> RunLockedError:
        holder = lock_holder(directory) or {}
        who = (f"pid {holder.get('pid')} (`relaylens {holder.get('command')}`, since {holder.get('since')})"
               if holder.get("pid") else "a process that has not yet recorded its pid")
        return RunLockedError(f"{directory} is in use by another relaylens process: {who}; `{command}` refuses "
                              "to write into it at the same time. Fix: wait for that process to finish (or stop "
                              "it), or choose another --out")

    def unwritable(exc: OSError) -> RunLockedError:
        return RunLockedError(f"cannot lock {directory} for `{command}`: {exc.strerror}. Fix: choose a writable "
                              "directory (--out)")

    return exclusive_lock(Path(directory) / LOCK_NAME, command, busy=busy, unwritable=unwritable)


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
