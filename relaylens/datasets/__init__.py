"""The datasets stage: records, the dataset readers (LongMemEval, PersonaMem, Long-MT-Bench+, InfiniteBench,
HelloBench summarization, LoCoMo), the per-format registry, prompt rendering with token spans, and the synthetic
generator.

Owns: :mod:`~relaylens.datasets.records` (:class:`Record` and its checks), one module per format (reader, sniffing,
bundled sample, prompt layout; collected in :data:`REGISTRY`, see :mod:`~relaylens.datasets.formats`),
:mod:`~relaylens.datasets.prompting` and :mod:`~relaylens.datasets.spans` (a record as history / question tokens with
session, turn and evidence spans), :mod:`~relaylens.datasets.prompt_templates` (InfiniteBench's own templates) and
the ``synthetic*`` generators. :func:`load_records` calls :func:`detect_format` and one format's reader.

In: a dataset file (or ``sample`` / ``sample:NAME``, :func:`resolve_data`) and a tokenizer. Out: records and
rendered prompts (token ids, spans, ``evidence_mask``).

May import: :mod:`relaylens.errors`, :mod:`relaylens.registry`, the answer normalisation of :mod:`relaylens.scoring`
(a reference that normalises to nothing is refused when records load) and the model stage's torch-free parts
(:mod:`relaylens.model.tokens`: data text tokenised as data; the embedded downloader and cache root, inside
functions). Never torch at import time (token tensors are built when a prompt is rendered).

Example:
    >>> detect_format(bundled_sample_path())
    'longmemeval'
    >>> resolve_data("sample:hellobench").name
    'sample_hellobench.jsonl'
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

from relaylens.datasets import hellobench, infinitebench, locomo, longmemeval, longmtbench, personamem
from relaylens.datasets.common import data_suffix, peek_text
from relaylens.datasets.formats import DatasetFormat
from relaylens.datasets.infinitebench import TASKS as INFINITEBENCH_TASKS
from relaylens.datasets.longmemeval import bundled_sample_path
from relaylens.datasets.records import LoadReport, Record, RecordCollector
from relaylens.errors import RecordError, RelaylensError, shown
from relaylens.registry import Registry

log = logging.getLogger("relaylens.datasets.records")

ENTRY_POINT_GROUP = "relaylens.datasets"
"""The entry-point group of dataset-format plugins: ``[project.entry-points."relaylens.datasets"] NAME =
"pkg.mod:FORMAT"`` in a distribution's ``pyproject.toml`` makes that :class:`DatasetFormat` the format ``NAME``
(``--format NAME``; sniffed after the built-in formats)."""


def check_format(name: str, fmt) -> None:
    """Refuse what cannot be the dataset format ``name``: no :class:`DatasetFormat`, or one named otherwise."""
    if not isinstance(fmt, DatasetFormat) or fmt.name != name:
        raise RelaylensError(f"dataset format {name!r} is {fmt!r}, not a DatasetFormat named {name!r}. Fix: point it "
                             f"at DatasetFormat({name!r}, reader, sniff, ...) (relaylens.datasets.formats)")


_BUILT_IN = (longmemeval, personamem, longmtbench, infinitebench, hellobench, locomo)
REGISTRY: Registry[DatasetFormat] = Registry("dataset format", entry_point_group=ENTRY_POINT_GROUP, check=check_format)
"""Every dataset format by name: its reader, sniffing rule, bundled sample and prompt layout; then the formats of
installed plugins (entry-point group :data:`ENTRY_POINT_GROUP`). A :class:`~relaylens.registry.Registry`."""
for _module in _BUILT_IN:
    REGISTRY.register(_module.FORMAT.name, _module.FORMAT)
FORMATS = tuple(m.FORMAT.name for m in _BUILT_IN)
"""The names of the built-in dataset formats (``relaylens run --format``; a plugin's formats are in
:data:`REGISTRY`)."""
READERS = {m.FORMAT.name: m.FORMAT.reader for m in _BUILT_IN}
"""The reader of each built-in dataset format by name."""
del _module
SNIFF_ORDER = ("personamem", "longmemeval", "locomo", "longmtbench", "hellobench", "infinitebench")  # first match wins
SAMPLE = "sample"  # --data sample: the bundled LongMemEval-schema sample; sample:NAME: the bundled sample of NAME
"""``--data sample``: the bundled LongMemEval-schema sample; ``sample:NAME``: the bundled sample of format NAME."""


def detect_format(path: str | Path) -> str:
    """The dataset format of ``path`` from its extension, header or first keys; a clear error when ambiguous."""
    path = Path(path)
    for name in SNIFF_ORDER:
        if REGISTRY[name].sniff(path):
            return name
    for name, fmt in REGISTRY.items():  # then the formats of plugins, in registration order
        if name not in SNIFF_ORDER and fmt.sniff(path):
            return name
    _refuse_empty_or_broken_json(path)
    raise RelaylensError(f"cannot tell the dataset format of {path} from its name and first bytes. Fix: pass "
                         f"format= one of {tuple(REGISTRY)} (PersonaMem: the questions_*.csv; Long-MT-Bench+: the "
                         "parquet)")


def resolve_data(data: str) -> Path:
    """``sample`` -> the bundled LongMemEval-schema sample; ``sample:NAME`` -> the bundled sample of format NAME
    (``sample:infinitebench``, ``sample:hellobench``); anything else is a path, which must exist."""
    if data == SAMPLE:
        return bundled_sample_path()
    if data.startswith(f"{SAMPLE}:"):
        fmt = REGISTRY.get(data.partition(":")[2], None)
        if fmt is not None and fmt.sample is not None:
            return fmt.sample()
    path = Path(data)
    if not path.exists():
        samples = ", ".join(f"{SAMPLE}:{name}" for name, fmt in REGISTRY.items() if fmt.sample is not None)
        raise RelaylensError(f"dataset {data!r} does not exist; pass a file path or 'sample' for the bundled sample "
                             f"(bundled samples by format: {samples})")
    return path


def prompt_layout(record: Record):
    """The prompt layout of ``record``'s format (``layout(record, mode)``), or None for the LongMemEval reader
    prompt."""
    fmt = REGISTRY.get(record.source or "", None)
    return fmt.layout if fmt is not None else None


def _refuse_empty_or_broken_json(path: Path) -> None:
    """Name the real problem of an unrecognised file when it is empty or JSON that does not parse."""
    text = peek_text(path, 1 << 26).strip()  # unrecognised files only: reading them is the cheap part of an error
    if not text:
        raise RecordError(f"dataset file {path} is empty. Fix: pass a file of one of the formats {', '.join(REGISTRY)} "
                          "(re-download it if a transfer was cut short)")
    if data_suffix(path) not in (".csv", ".parquet") and text[:1] in "[{":
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


def load_records_with_report(path: str | Path, format: str = "auto", lenient: bool = False,
                             **options) -> tuple[list[Record], LoadReport]:
    """Read a dataset file into records and report what was skipped.

    Args:
        path: the dataset file (PersonaMem: the questions CSV; the shared contexts are found beside it).
        format: ``"auto"`` or one of :data:`FORMATS`.
        lenient: skip malformed records (each skip is reported, warned and logged) instead of raising.
        **options: reader options, e.g. ``contexts_path=`` (PersonaMem) or ``task=`` (InfiniteBench).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist; pass the path of a file of one of the formats "
                                f"{', '.join(FORMATS)}")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in REGISTRY:
        raise RelaylensError(f"unknown dataset format {fmt!r}; expected 'auto' or one of {tuple(REGISTRY)}. Fix: pass "
                             "format='auto' to tell it from the file, or one of those names")
    collector = RecordCollector(lenient, path)
    try:
        REGISTRY[fmt].reader(path, collector, **options)
    except UnicodeDecodeError as err:
        raise RecordError(f"{path}: not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at offset "
                          f"{err.start}: {err.reason}). Fix: re-encode the file as UTF-8 (e.g. iconv -f latin1 -t "
                          "utf-8)") from None
    except RecursionError:
        raise RecordError(f"{path}: the JSON is nested too deeply to read (more levels than Python's recursion "
                          "limit). Fix: check that this is a dataset file; records are only a few levels "
                          "deep") from None
    report = LoadReport(str(path), fmt, len(collector.records), tuple(collector.skipped))
    if report.num_skipped:
        where, why = (shown(text) for text in report.skipped[0])  # dataset text: one line, no terminal control
        msg = f"{path}: skipped {report.num_skipped} malformed {fmt} record(s) (lenient=True); first: {where}: {why}"
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


__all__ = ["READERS", "FORMATS", "REGISTRY", "ENTRY_POINT_GROUP", "check_format", "DatasetFormat", "detect_format",
           "INFINITEBENCH_TASKS", "load_records", "load_records_with_report", "bundled_sample_path", "resolve_data",
           "prompt_layout", "SAMPLE"]
