"""Dataset readers: LongMemEval, PersonaMem, Long-MT-Bench+, InfiniteBench, and the synthetic generator.

Use :func:`relaylens.records.load_records`; it calls :func:`detect_format` and one of :data:`READERS`.

Example:
    >>> from relaylens.datasets.synthetic import bundled_sample_path
    >>> detect_format(bundled_sample_path())
    'longmemeval'
"""

from __future__ import annotations

from pathlib import Path

from relaylens.datasets.common import peek_text
from relaylens.datasets.infinitebench import TASKS as INFINITEBENCH_TASKS
from relaylens.datasets.infinitebench import read_infinitebench
from relaylens.datasets.longmemeval import read_longmemeval
from relaylens.datasets.longmtbench import read_longmtbench
from relaylens.datasets.personamem import read_personamem

READERS = {
    "longmemeval": read_longmemeval,
    "personamem": read_personamem,
    "longmtbench": read_longmtbench,
    "infinitebench": read_infinitebench,
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
            if any(t in path.name for t in INFINITEBENCH_TASKS) or ('"context"' in head and '"input"' in head):
                return "infinitebench"
    _refuse_empty_or_broken_json(path)
    raise ValueError(f"cannot tell the dataset format of {path} from its name and first bytes. Fix: pass "
                     f"format= one of {tuple(READERS)} (PersonaMem: the questions_*.csv; Long-MT-Bench+: the parquet)")


def _refuse_empty_or_broken_json(path: Path) -> None:
    """Name the real problem of an unrecognised file when it is empty or JSON that does not parse."""
    import json

    from relaylens.errors import RecordError

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


__all__ = ["READERS", "detect_format", "INFINITEBENCH_TASKS"]
