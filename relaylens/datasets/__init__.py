"""Dataset readers (LongMemEval, PersonaMem, Long-MT-Bench+, InfiniteBench, HelloBench summarization), the synthetic generator, and the
loader: :func:`load_records` calls :func:`detect_format` and one of :data:`READERS`, each of which turns a file into
:class:`relaylens.datasets.records.Record` s.

Example:
    >>> detect_format(bundled_sample_path())
    'longmemeval'
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from relaylens.errors import RecordError
from relaylens.datasets.records import LoadReport, Record, RecordCollector

from relaylens.datasets.common import peek_text
from relaylens.datasets.infinitebench import TASKS as INFINITEBENCH_TASKS
from relaylens.datasets.hellobench import read_hellobench
from relaylens.datasets.infinitebench import read_infinitebench
from relaylens.datasets.longmemeval import read_longmemeval
from relaylens.datasets.longmtbench import read_longmtbench
from relaylens.datasets.personamem import read_personamem

log = logging.getLogger("relaylens.datasets.records")

READERS = {
    "longmemeval": read_longmemeval,
    "personamem": read_personamem,
    "longmtbench": read_longmtbench,
    "infinitebench": read_infinitebench,
    "hellobench": read_hellobench,
}


def detect_format(path: str | Path) -> str:
    """The dataset format of ``path`` from its extension, header or first keys; a clear error when ambiguous."""
    path = Path(path)
    if path.suffix == ".csv":
        header = peek_text(path, 1 << 16).split("\n", 1)[0]
        if "shared_context_id" in header and "correct_answer" in header:
            return "personamem"
    elif path.suffix == ".parquet":
        return "longmtbench"
    else:
        head = peek_text(path).lstrip()
        if head[:1] in "[{":
            if '"question_id"' in head and ('"haystack_sessions"' in head or '"haystack_session_ids"' in head):
                return "longmemeval"
            if '"conversation_id"' in head and '"sessions"' in head:
                return "longmtbench"
            if '"raw_text"' in head and ('"checklists"' in head or '"chat_prompt"' in head or '"category"' in head):
                return "hellobench"
            if any(t in path.name for t in INFINITEBENCH_TASKS) or ('"context"' in head and '"input"' in head):
                return "infinitebench"
    _refuse_empty_or_broken_json(path)
    raise ValueError(f"cannot tell the dataset format of {path} from its name and first bytes. Fix: pass "
                     f"format= one of {tuple(READERS)} (PersonaMem: the questions_*.csv; Long-MT-Bench+: the parquet)")


def _refuse_empty_or_broken_json(path: Path) -> None:
    """Name the real problem of an unrecognised file when it is empty or JSON that does not parse."""
    import json

    text = peek_text(path, 1 << 26).strip()  # unrecognised files only: reading them is the cheap part of an error
    if not text:
        raise RecordError(f"dataset file {path} is empty. Fix: pass a LongMemEval / PersonaMem / Long-MT-Bench+ / "
                          "InfiniteBench file (re-download it if a transfer was cut short)")
    if path.suffix not in (".csv", ".parquet") and text[:1] in "[{":
        try:
            json.loads(text)
        except RecursionError:
            raise RecordError(f"{path}: the JSON is nested too deeply to read. Fix: check that this is a dataset "
                              "file; records are only a few levels deep") from None
        except json.JSONDecodeError as err:
            first = text.splitlines()[0]
            try:
                json.loads(first)  # JSON Lines: the first line alone parses
            except json.JSONDecodeError:
                raise RecordError(f"{path}: not valid JSON ({err}). Fix: repair the file or re-download it") from None


def bundled_sample_path() -> Path:
    """Path of the bundled ``sample_longmemeval.json`` (24 synthetic records, ~2k-token histories)."""
    return Path(__file__).resolve().parent.parent / "data" / "sample_longmemeval.json"


FORMATS = ("longmemeval", "personamem", "longmtbench", "infinitebench", "hellobench")


def load_records_with_report(path: str | Path, format: str = "auto", lenient: bool = False, **options) -> tuple[list[Record], LoadReport]:
    """Read a dataset file into records and report what was skipped.

    Args:
        path: the dataset file (PersonaMem: the questions CSV; the shared contexts are found beside it).
        format: ``"auto"`` or one of :data:`FORMATS`.
        lenient: skip malformed records (each skip is reported, warned and logged) instead of raising.
        **options: reader options, e.g. ``contexts_path=`` (PersonaMem) or ``task=`` (InfiniteBench).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist; pass the path of a LongMemEval / PersonaMem / "
                                "Long-MT-Bench+ / InfiniteBench file")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; expected 'auto' or one of {FORMATS}")
    collector = RecordCollector(lenient, path)
    try:
        READERS[fmt](path, collector, **options)
    except UnicodeDecodeError as err:
        raise RecordError(f"{path}: not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at offset {err.start}: "
                          f"{err.reason}). Fix: re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    except RecursionError:
        raise RecordError(f"{path}: the JSON is nested too deeply to read (more levels than Python's recursion "
                          "limit). Fix: check that this is a dataset file; records are only a few levels deep") from None
    report = LoadReport(str(path), fmt, len(collector.records), tuple(collector.skipped))
    if report.num_skipped:
        msg = f"{path}: skipped {report.num_skipped} malformed {fmt} record(s) (lenient=True); first: {report.skipped[0][0]}: {report.skipped[0][1]}"
        log.warning(msg)
        warnings.warn(msg, stacklevel=2)
    return collector.records, report


def load_records(path: str | Path, format: str = "auto", lenient: bool = False, **options) -> list[Record]:
    """Read a dataset file into :class:`Record` s (see :func:`load_records_with_report` for the arguments).

    >>> recs = load_records(bundled_sample_path())
    >>> recs[0].source
    'longmemeval'
    """
    records, _ = load_records_with_report(path, format=format, lenient=lenient, **options)
    return records


__all__ = ["READERS", "FORMATS", "detect_format", "INFINITEBENCH_TASKS", "load_records", "load_records_with_report",
           "bundled_sample_path"]
