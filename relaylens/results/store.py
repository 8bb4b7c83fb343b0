"""The resumable result store: one run directory per sweep, crash-safe, shardable, consolidated into parquet.

Layout of a run directory::

    run_dir/
      manifest.json          what produced the run (build_manifest: relaylens.results.manifest); written
                             atomically, compared on re-open
      units/<hash>.json.gz   one committed unit of work = all conditions of one (record_id, selector, budget),
                             with the stamp of the machine that computed it (``machine``: device, CPU / GPU
                             name, native bfloat16, threads) where the writer set one
      answers.parquet        consolidated tables (columns of relaylens.results.tables), sorted by key
      scores.parquet
      probes.parquet
      consolidated.json      written last by consolidate(): the unit hashes the parquet files contain, and each
                             file's sha256 and row count
      judges.json            judge passes (relaylens.results.passes): a pass's scores show once it is complete

**Commit protocol.** A unit's rows (every condition of one shared selection) are serialised into one JSON document
(column lists, with a sha256 checksum of the content), gzip-compressed (``mtime=0``: identical content gives
identical bytes), written to ``units/.tmp-<hash>.json.gz-<pid>``, flushed, fsynced, then ``os.replace`` d onto
``units/<hash>.json.gz`` and the directory fsynced. The rename is the commit marker: a crash leaves at most a
``.tmp-*`` file, which readers never look at (re-opening deletes it), so a partially written unit is never read;
the checksum catches files damaged afterwards. Re-running the same command skips units whose file exists
(:meth:`RunStore.is_done`). The parquet files are derived data, rewritten whole (temp file + rename) by
:meth:`RunStore.consolidate`. Rewriting a unit in place or removing one first removes ``consolidated.json`` (the
unit keeps its name, so the marker's unit list could not tell); :func:`load_tables` rebuilds from the units when the
marker is missing or stale, and reads a parquet file only when its sha256 and row count match the marker (a file
damaged or edited afterwards is rebuilt from the units, or, in a run without units, refused naming the file).

Example:
    >>> import tempfile
    >>> run = RunStore.create_or_open(tempfile.mkdtemp() + "/run", {"analysis": "demo", "config": {"seed": 0}})
    >>> key = UnitKey("q1", "bm25", 0.1)
    >>> run.is_done(key)
    False
    >>> run.write_unit(key, [], [dict(record_id="q1", selector="bm25", budget=0.1, condition="relay",
    ...     question_type="t", is_abstention=False, cluster_id=None, metric="f1", value=1.0)], [])
    >>> run.is_done(key), len(run.consolidate()["scores"])
    (True, 1)
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import math
import numbers
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from relaylens import moved_name
from relaylens.fileio import check_below, file_sha256, safe_subdir
from relaylens.results.atomic import fsync_dir, write_atomic
from relaylens.results.locks import LOCK_NAME
from relaylens.results.manifest import (
    ResultStoreError,
    build_manifest,
    canonical_manifest,
    flatten_manifest,
    json_default,
    manifest_diff,
    manifest_section,
    refuse_repinned,
)
from relaylens.results.passes import failed_passes, hidden_passes, pass_metrics, read_passes
from relaylens.results.tables import (
    BOOL,
    DTYPES,
    FLOAT,
    INT,
    OPT_STR,
    OPTIONAL_TABLES,
    SORT_COLUMNS,
    TABLES,
    coerce_table,
    get_table,
    sort_table,
)

__all__ = ["UnitKey", "RunStore", "ResultStoreError", "StoreWriteError", "build_manifest", "file_sha256",
           "load_tables", "load_run", "manifest_section", "SORT_COLUMNS", "DTYPES"]

UNITS = "units"
_SHARDS = "shards"  # relaylens.results.shards.SHARDS (that module imports this one)
_SHARD_DIR = re.compile(r"\d+-of-\d+")
"""The folder of a run directory that holds its committed units (``units/<hash>.json.gz``)."""
MARKER = "consolidated.json"
_OWN_TEMP = re.compile(r"\.tmp-(manifest\.json|consolidated\.json|judges\.json|("
                       + "|".join(TABLES) + r")\.parquet)-\d+")
_OWN_UNIT_TEMP = re.compile(r"\.tmp-[0-9a-f]{24}\.json\.gz-\d+")
_OWN_VIEW_TEMP = re.compile(r"\.tmp-[0-9a-f]{24}\.json-\d+|[^/]+\.json\.tmp")  # views/ (and the older temp name)
_UNIT_NAME = re.compile(r"[0-9a-f]{24}\.json\.gz")


class StoreWriteError(OSError):
    """Writing into a run directory failed (unwritable, disk full); nothing partial was left behind."""


class UnitKey(NamedTuple):
    """One unit of work: every condition of one (record, selector, budget) selection."""

    record_id: str
    selector: str
    budget: float

    def normalised(self) -> "UnitKey":
        return UnitKey(str(self.record_id), str(self.selector), float(self.budget))

    @property
    def hash(self) -> str:
        k = self.normalised()
        return hashlib.sha256(json.dumps([k.record_id, k.selector, repr(k.budget)]).encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------------------------ atomic write

def _default_writer(f: io.BufferedWriter, data: bytes) -> None:
    f.write(data)


def _atomic_write(path: Path, data: bytes, run_dir: Path, writer: Callable = _default_writer) -> None:
    """Write ``data`` to ``path`` atomically (:func:`relaylens.results.atomic.write_atomic`, directory fsynced); on
    failure nothing is left and the error names the run directory."""

    def error(exc: OSError) -> StoreWriteError:
        hint = ("the disk is full: free space or choose another --out" if exc.errno == errno.ENOSPC else
                "check that the directory is writable, or choose another --out")
        return StoreWriteError(exc.errno, f"cannot write {path.name} into run directory {run_dir}: "
                               f"{exc.strerror or exc}; nothing partial was kept. Fix: {hint}")

    check_below(run_dir, path)  # units/ (or any folder below the run directory) that is a link: refused
    write_atomic(path, data, writer=writer, sync_dir=True, error=error)


# ------------------------------------------------------------------------------------------------- row checks

def _check_value(kind: str, v: Any) -> Any:
    """The JSON-native value of ``v`` for a column kind; raises TypeError when it does not fit."""
    if kind == INT:
        if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
            return int(v)
    elif kind == FLOAT:
        if v is None:
            return None
        if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
            v = float(v)
            return None if math.isnan(v) else v  # NaN is stored as JSON null
    elif kind == BOOL:
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
    elif isinstance(v, str) or (kind == OPT_STR and v is None):
        return v
    raise TypeError(kind)


def _columns(name: str, rows: Any, key: "UnitKey", where: str) -> dict[str, list]:
    """Rows (list of dicts or a DataFrame) -> ``{column: values}`` with exactly the table's columns, every value
    of its column's kind (:data:`DTYPES`), the unit's key, and no duplicate row identity."""
    columns = TABLES[name]
    if isinstance(rows, pd.DataFrame):
        rows = rows.to_dict("records")
    out: dict[str, list] = {c: [] for c in columns}
    want = set(columns)
    kinds = [(c, DTYPES[c]) for c in columns]
    for row in rows:
        if row.keys() != want:
            missing, extra = sorted(want - row.keys()), sorted(row.keys() - want)
            raise ResultStoreError(f"{where}: {name} rows must have exactly the columns of relaylens.results.tables "
                                   f"({name}); missing {missing}, unexpected {extra}")
        for c, kind in kinds:
            try:
                out[c].append(_check_value(kind, row[c]))
            except TypeError:
                raise ResultStoreError(f"{where}: {name} column {c!r} expects {kind} values; got {row[c]!r} "
                                       f"({type(row[c]).__name__}). Fix: convert the value before write_unit") from None
        for c, k in zip(("record_id", "selector", "budget"), key):
            if out[c][-1] != k:
                raise ResultStoreError(f"{where}: a {name} row has {c}={out[c][-1]!r}, expected {k!r}; a unit holds "
                                       "only its own (record_id, selector, budget)")
    ident = list(zip(*(out[c] for c in SORT_COLUMNS[name])))
    if len(set(ident)) != len(ident):
        seen: set = set()
        dup = next(i for i in ident if i in seen or seen.add(i))
        raise ResultStoreError(f"{where}: duplicate {name} rows for {list(dup)}; each {SORT_COLUMNS[name]} must "
                               "appear once")
    return out


def _table(name: str, columns: dict[str, list]) -> pd.DataFrame:
    """Column lists -> the canonical, sorted DataFrame of a table."""
    return sort_table(name, coerce_table(name, pd.DataFrame({c: columns[c] for c in TABLES[name]})))


# ------------------------------------------------------------------------------------------------------ store

class _Unset:
    """Default of ``write_unit(machine=...)``: the store's own :attr:`RunStore.machine`."""


class RunStore:
    """A run directory (see the module docstring). Create with :meth:`create_or_open` or :meth:`open`."""

    def __init__(self, run_dir: Path, manifest: dict, writer: Callable = _default_writer):
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.writer = writer  # (binary file, bytes) -> None; tests inject a failing writer
        # the machine stamp (relaylens.model.placement.machine_stamp) written into every new unit; the runner sets it
        self.machine: dict | None = None

    # -- opening
    @classmethod
    def create_or_open(cls, run_dir: str | Path, manifest: dict, force: bool = False,
                       writer: Callable = _default_writer) -> "RunStore":
        """Start a run in ``run_dir`` or resume it. An existing manifest must equal ``manifest`` (ignoring
        ``created_at``, paths and the other keys :func:`~relaylens.results.manifest.manifest_diff` ignores);
        ``force=True`` keeps the finished units, adopts the new manifest and records the differing keys under
        ``manifest["forced"]``. A directory holding no committed unit yet adopts the new manifest (nothing could be
        mixed; noted under ``replaced``).

        Refused: a non-empty directory that is not a relaylens run (no ``manifest.json``), and a ``manifest.json``
        that relaylens did not write (even with ``force``). Callers that write should hold
        :func:`relaylens.results.locks.run_lock` (the runner and ``merge`` do)."""
        run_dir = Path(run_dir)
        manifest = canonical_manifest(manifest)
        prepare_run_dir(run_dir)
        path = run_dir / "manifest.json"
        store = cls(run_dir, manifest, writer)
        if path.exists():
            old = _read_manifest(run_dir)
            diff = manifest_diff(old, manifest)
            refuse_repinned(run_dir, old, manifest, bool(store.unit_paths()))
            if diff and not store.unit_paths():
                manifest = {**manifest,
                            "replaced": old.get("replaced", []) + [{"keys": diff, "at": manifest.get("created_at")}]}
                store.manifest = manifest
            elif diff and not force:
                shown = ", ".join(f"{k}: {flatten_manifest(old).get(k, '<absent>')!r} -> "
                                  f"{flatten_manifest(manifest).get(k, '<absent>')!r}"
                                  for k in diff[:8])
                raise ResultStoreError(f"run directory {run_dir} was started with a different manifest; differing "
                                       f"keys: {shown}{' ...' if len(diff) > 8 else ''}. Fix: re-run with the original "
                                       "settings, choose a new --out, or pass --force to continue with the new "
                                       "settings")
            elif not diff:
                store.manifest = old
                store._clean_temp()
                return store
            else:
                manifest = {**manifest,
                            "forced": old.get("forced", []) + [{"keys": diff, "at": manifest.get("created_at")}]}
                store.manifest = manifest
        store._clean_temp()
        _atomic_write(path, _dumps(manifest, indent=2), run_dir, writer)
        return store

    @classmethod
    def open(cls, run_dir: str | Path) -> "RunStore":
        """Open an existing run directory for reading (and appending) without comparing manifests."""
        run_dir = Path(run_dir)
        return cls(run_dir, _read_manifest(run_dir))

    def _clean_temp(self) -> None:
        """Delete the temp files a killed relaylens writer left (its own names only, regular files only)."""
        for folder, pattern in ((self.run_dir / UNITS, _OWN_UNIT_TEMP), (self.run_dir, _OWN_TEMP),
                                (self.run_dir / "views", _OWN_VIEW_TEMP)):
            if folder.is_symlink():  # never deletes through a link (writing there is refused)
                continue
            for p in folder.glob("*tmp*"):
                if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink():
                    p.unlink(missing_ok=True)

    # -- units
    def unit_path(self, key: UnitKey | tuple) -> Path:
        return self.run_dir / UNITS / f"{UnitKey(*key).hash}.json.gz"

    def is_done(self, key: UnitKey | tuple) -> bool:
        """True when the unit ``(record_id, selector, budget)`` has been committed."""
        return self.unit_path(key).exists()

    def unit_paths(self) -> list[Path]:
        return sorted((self.run_dir / UNITS).glob("[0-9a-f]*.json.gz"))

    def write_unit(self, key: UnitKey | tuple, answers_rows: Any, scores_rows: Any, probes_rows: Any,
                   replace: bool = False, skipped_rows: Any = (), geometry_rows: Any = (),
                   machine: dict | None | type[_Unset] = _Unset) -> None:
        """Commit all rows of one unit atomically. Rows are lists of dicts (or DataFrames) with the columns of
        :mod:`relaylens.results.tables`; their key columns must match ``key``; no two rows may share an identity
        (:data:`SORT_COLUMNS`). Float NaN / None are stored as null and read back as NaN. A unit that was not run
        commits one ``skipped_rows`` row (and no other rows): resuming does not retry it. ``geometry_rows``: the
        training unit of ``learned_geometry`` (rewritten with ``replace=True`` after every step). ``machine``: the
        stamp to record (default :attr:`machine`; a rewrite that keeps a unit's rows, such as a judge pass, passes
        the unit's own stamp, :meth:`unit_machine`, so that it still names the machine that computed them)."""
        key = UnitKey(*key).normalised()
        where = f"unit {tuple(key)}"
        if self.is_done(key) and not replace:
            raise ResultStoreError(f"{where} is already committed in {self.run_dir}; the runner should skip done units "
                                   "(is_done). Fix: pass replace=True to overwrite it deliberately")
        tables = {name: _columns(name, rows, key, where)
                  for name, rows in (("answers", answers_rows), ("scores", scores_rows), ("probes", probes_rows),
                                     ("skipped", skipped_rows), ("geometry", geometry_rows))}
        machine = self.machine if machine is _Unset else machine
        body = {"unit": list(key), "tables": tables, **({"machine": machine} if machine is not None else {})}
        doc = {**body, "sha256": hashlib.sha256(_dumps(body)).hexdigest()}  # the checksum covers all but itself
        if replace:
            self.invalidate()  # rewritten in place: same name, so the marker's unit list would not tell
        _atomic_write(self.unit_path(key), gzip.compress(_dumps(doc), compresslevel=6, mtime=0), self.run_dir,
                      self.writer)

    def copy_unit(self, path: Path) -> None:
        """Commit a unit file of another run directory into this one, byte for byte (atomically)."""
        if (self.run_dir / UNITS / path.name).exists():
            self.invalidate()
        _atomic_write(self.run_dir / UNITS / path.name, path.read_bytes(), self.run_dir, self.writer)

    def remove_unit(self, key: UnitKey | tuple) -> None:
        """Delete a committed unit (it runs again on resume); never through a linked ``units/``."""
        self.invalidate()
        check_below(self.run_dir, self.unit_path(key)).unlink(missing_ok=True)

    def invalidate(self) -> None:
        """Remove ``consolidated.json`` before a unit is rewritten in place or removed (a new unit changes the
        marker's unit list; these may not): until :meth:`consolidate` runs again, readers rebuild the tables from the
        units instead of trusting parquet files that no longer match them."""
        marker = self.run_dir / MARKER
        if marker.exists():
            marker.unlink()
            fsync_dir(self.run_dir)

    def load_unit(self, path: Path) -> dict[str, dict[str, list]]:
        """The raw column lists of one committed unit file, per table (its checksum verified)."""
        return self._load_unit_doc(path)["tables"]

    def unit_machine(self, path: Path) -> dict | None:
        """The machine stamp a committed unit file carries (None: written before units carried one, or by a writer
        that set none); the file's checksum is verified first."""
        return self._load_unit_doc(path).get("machine")

    def _load_unit_doc(self, path: Path) -> dict:
        """One committed unit file's document, its checksum, key and table columns verified."""
        fix = "delete it and re-run the same command to recompute that unit"
        try:
            doc = json.loads(gzip.decompress(path.read_bytes()))
            key = UnitKey(*doc["unit"])
            tables = doc["tables"]
            payload = _dumps({name: value for name, value in doc.items() if name != "sha256"})
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            raise ResultStoreError(f"corrupt unit file {path}: {type(exc).__name__}: {exc}. Fix: {fix}") from None
        if hashlib.sha256(payload).hexdigest() != doc.get("sha256") or f"{key.hash}.json.gz" != path.name:
            raise ResultStoreError(f"corrupt unit file {path}: checksum or unit key does not match its content. Fix: "
                                   f"{fix}")
        for name in OPTIONAL_TABLES:
            tables.setdefault(name, {c: [] for c in TABLES[name]})
        for name, cols in TABLES.items():
            if not isinstance(tables.get(name), dict) or set(tables[name]) != set(cols):
                raise ResultStoreError(f"corrupt unit file {path}: table {name} does not have the columns of "
                                       f"relaylens.results.tables (written by another relaylens version?). Fix: {fix}")
        return doc

    def read_unit(self, path: Path) -> dict[str, pd.DataFrame]:
        """The three tables of one committed unit file; a damaged file raises naming it."""
        return {name: _table(name, cols) for name, cols in self.load_unit(path).items()}

    def build_tables(self) -> dict[str, pd.DataFrame]:
        """All committed units as the sorted tables (in memory; nothing written), without the scores of judge
        passes that are not complete (:mod:`relaylens.results.passes`)."""
        return self._build()[0]

    def _build(self) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
        """``(tables, {judge pass: why hidden})``."""
        passes = read_passes(self.run_dir)
        owner = pass_metrics(passes)
        covered: dict[str, int] = dict.fromkeys(set(owner.values()), 0)
        judged_units = 0
        acc: dict[str, dict[str, list]] = {name: {c: [] for c in cols} for name, cols in TABLES.items()}
        for path in self.unit_paths():
            unit = self.load_unit(path)
            if owner and unit["answers"]["condition"]:
                judged_units += 1
                conditions = set(unit["answers"]["condition"])
                scores = unit["scores"]
                for name in covered:
                    mine = {c for c, m in zip(scores["condition"], scores["metric"]) if owner.get(m) == name}
                    covered[name] += conditions <= mine
            for name, cols in unit.items():
                for c, values in cols.items():
                    acc[name][c].extend(values)
        hidden = hidden_passes(passes, covered, judged_units)
        tables = {name: _table(name, cols) for name, cols in acc.items()}
        dropped = set(hidden) - failed_passes(passes)  # a failed pass keeps its rows: NaN verdicts, failures counted
        if dropped:
            scores = tables["scores"]
            drop = scores["metric"].map(lambda m: owner.get(m) in dropped)
            tables["scores"] = scores[~drop].reset_index(drop=True)
        return tables, hidden

    def consolidate(self) -> dict[str, pd.DataFrame]:
        """Write ``answers/scores/probes/skipped/geometry.parquet`` (each atomically) then ``consolidated.json`` (the
        units, and each file's sha256 and row count); return the tables."""
        hashes = [p.stem for p in self.unit_paths()]
        tables, hidden = self._build()
        digests = {}
        for name, df in tables.items():
            buf = io.BytesIO()
            df.to_parquet(buf, index=False)
            digests[name] = hashlib.sha256(buf.getvalue()).hexdigest()
            _atomic_write(self.run_dir / f"{name}.parquet", buf.getvalue(), self.run_dir, self.writer)
        marker = {"units": hashes, "rows": {n: len(df) for n, df in tables.items()}, "sha256": digests,
                  "hidden_passes": hidden}
        _atomic_write(self.run_dir / MARKER, _dumps(marker), self.run_dir, self.writer)
        return tables


def prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` (and ``units/``) for writing; refuse a directory that holds something else.

    A directory is accepted when it is new, empty, or a relaylens run (its ``manifest.json`` written by relaylens);
    an existing directory without a manifest may hold only what relaylens itself leaves there (an empty
    ``units/``, the lock file, relaylens temp files, the ``shards/`` of ``--shard auto`` and ``sweep``)."""

    run_dir = Path(run_dir)
    if _SHARD_DIR.fullmatch(run_dir.name) and run_dir.parent.name == _SHARDS:  # RUN_DIR/shards/I-of-N
        safe_subdir(run_dir.parent.parent, _SHARDS, run_dir.name)  # a linked shards/ or shard folder: refused
    if run_dir.exists() and not run_dir.is_dir():
        raise StoreWriteError(errno.ENOTDIR, f"cannot create run directory {run_dir}: it is a file. Fix: choose "
                              "another --out")
    if run_dir.is_dir():
        if (run_dir / "manifest.json").exists() or (run_dir / "manifest.json").is_symlink():
            _read_manifest(run_dir)  # refuses a foreign or damaged manifest before anything is touched
        else:
            foreign = []
            for p in sorted(run_dir.iterdir()):
                if p.name == UNITS and p.is_dir() and not p.is_symlink():
                    foreign += [f"{UNITS}/{q.name}" for q in sorted(p.iterdir())
                                if not _OWN_UNIT_TEMP.fullmatch(q.name)]
                elif p.name not in (LOCK_NAME,
                                    "shards") and not _OWN_TEMP.fullmatch(p.name):  # shards/: --shard auto, sweep
                    foreign.append(p.name)
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise ResultStoreError(f"{run_dir} is not empty and is not a relaylens run directory (no "
                                       f"manifest.json; it holds {shown}); relaylens will not write into it. Fix: "
                                       "choose a new or empty --out directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        safe_subdir(run_dir, UNITS)  # a units/ that is a link (to a folder or not) is refused, never written through
    except OSError as exc:
        raise StoreWriteError(exc.errno, f"cannot create run directory {run_dir}: {exc.strerror or exc}. "
                              "Fix: choose a writable --out directory") from exc
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise StoreWriteError(errno.EACCES, f"run directory {run_dir} is not writable. Fix: choose another --out")


def _dumps(obj: Any, indent: int | None = None) -> bytes:
    return json.dumps(obj, default=json_default, sort_keys=True, indent=indent).encode("utf-8")


def _read_manifest(run_dir: Path) -> dict:
    path = run_dir / "manifest.json"
    if not path.exists():
        raise ResultStoreError(f"{run_dir} is not a run directory (no manifest.json). Fix: pass the --out "
                               "directory of a `relaylens run`")
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ResultStoreError(f"corrupt manifest {path}: {type(exc).__name__}: {exc}. Fix: restore it or start a "
                               "new run directory") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("analysis"), str) \
            or not isinstance(manifest.get("config"), dict):
        raise ResultStoreError(f"{path} is not a relaylens run manifest (expected a JSON object with 'analysis' and "
                               "'config'); relaylens neither reads nor overwrites it, even with --force. Fix: pass the "
                               "--out directory of a `relaylens run`, or choose a new directory")
    return manifest


class _Mismatch(Exception):
    """A consolidated parquet file that does not match what ``consolidated.json`` records for it."""


def _marker(run_dir: Path) -> dict | None:
    """``consolidated.json`` (None when absent); raises :class:`_Mismatch` when it is damaged."""
    path = run_dir / MARKER
    try:
        marker = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise _Mismatch(f"{path} is damaged ({type(exc).__name__})") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("units"), list) \
            or not all(isinstance(marker.get(k, {}), dict) for k in ("rows", "sha256", "hidden_passes")):
        raise _Mismatch(f"{path} is not a consolidation record (expected an object with a 'units' list)")
    return marker


def _parquet(run_dir: Path, name: str, marker: dict | None) -> pd.DataFrame:
    """One consolidated table, checked against the sha256 and row count ``marker`` records for it (when it does);
    a missing optional table reads as empty. Raises :class:`_Mismatch` naming the file."""
    path = run_dir / f"{name}.parquet"
    recorded = marker or {}
    if name in OPTIONAL_TABLES and not path.exists():
        frame = get_table({}, name)  # an empty table of the schema
    else:
        data = path.read_bytes()
        want = recorded.get("sha256", {}).get(name)
        if want is not None and hashlib.sha256(data).hexdigest() != want:
            raise _Mismatch(f"{path} does not match the sha256 that consolidated.json records for it")
        try:
            frame = pd.read_parquet(io.BytesIO(data))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types (ArrowInvalid, NotImplementedError, ...)
            raise _Mismatch(f"{path} cannot be read as parquet ({type(exc).__name__})") from None
    rows = recorded.get("rows", {}).get(name)
    if rows is not None and len(frame) != rows:
        raise _Mismatch(f"{path} holds {len(frame)} rows; consolidated.json records {rows}")
    try:
        return sort_table(name, coerce_table(name, frame))
    except KeyError as err:
        raise _Mismatch(f"{path} lacks column {err} of the {name} table") from None


def _hidden(marker: dict | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (marker or {}).get("hidden_passes", {}).items()}


def _exported_tables(run_dir: Path) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """The parquet tables of a run directory that holds no units (checked against ``consolidated.json`` when the
    run has one; a missing optional table reads as empty), and the judge passes they do not show."""
    try:
        marker = _marker(run_dir)
        return {name: _parquet(run_dir, name, marker) for name in TABLES}, _hidden(marker)
    except (_Mismatch, OSError, ValueError, TypeError) as err:
        raise ResultStoreError(f"{err}, and the run has no units to rebuild it from (the file was changed or damaged "
                               "after the run). Fix: restore the run directory from its copy, or rerun the analysis "
                               "into a fresh directory") from None


def load_run(run_dir: str | Path) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """``(tables, hidden)``: the run's tables (:func:`load_tables`) and ``{judge pass: why its scores are not
    shown}`` (:mod:`relaylens.results.passes`)."""
    store = RunStore.open(run_dir)
    run_dir = store.run_dir
    units = [p.stem for p in store.unit_paths()]
    required = [name for name in TABLES if name not in OPTIONAL_TABLES]
    if not units and all((run_dir / f"{name}.parquet").exists() for name in required):
        return _exported_tables(run_dir)  # tables without units (an exported or published run, e.g. figures/)
    try:
        marker = _marker(run_dir)
        if marker is not None and marker["units"] == units:  # else stale: a running, killed or rejudged run
            return {name: _parquet(run_dir, name, marker) for name in TABLES}, _hidden(marker)
    except (_Mismatch, OSError, ValueError, TypeError) as err:  # the units are the truth: rebuilt in memory
        warnings.warn(f"{err}: the tables were rebuilt from the run's {len(units)} committed units. Fix: re-run the "
                      "same command (or `relaylens merge`) to rewrite the consolidated tables", stacklevel=2)
    return store._build()


def load_tables(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The consolidated tables of a run; rebuilt from the committed units (in memory) when the parquet files are
    missing, older than the units (an interrupted run), or do not match the checksums and row counts recorded in
    ``consolidated.json``."""
    return load_run(run_dir)[0]



def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
