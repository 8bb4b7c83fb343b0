"""The per-format registry: everything relaylens knows about one dataset format, in one place.

A :class:`DatasetFormat` names the format and holds its reader, its sniffing rule (does this file look like the
format?), its bundled sample (if relaylens ships one; ``--data sample:NAME``) and its prompt layout (if the format
brings its own instead of the LongMemEval reader prompt). Each reader module defines its ``FORMAT``;
:mod:`relaylens.datasets` collects them in :data:`relaylens.datasets.REGISTRY`, in sniffing order. Code outside
``datasets/`` never compares format names: it asks the registry.

Example:
    >>> from relaylens.datasets import REGISTRY
    >>> [name for name, fmt in REGISTRY.items() if fmt.sample is not None]
    ['longmemeval', 'infinitebench', 'hellobench']
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relaylens.datasets.common import data_suffix, peek_text

JSON_SUFFIXES_EXCLUDED = (".csv", ".parquet")  # formats sniffed by suffix, never by JSON keys


@dataclass(frozen=True)
class DatasetFormat:
    """One dataset format.

    Attributes:
        name: the format name (``--format NAME``); records it reads carry it as ``Record.source`` where their
            prompt layout depends on it.
        reader: ``reader(path, collector, **options)`` appends the file's records to a ``RecordCollector``.
        sniff: ``sniff(path) -> bool``: the file looks like this format (name, suffix, first bytes).
        sample: the bundled sample file of this format (``--data sample:NAME``), or None.
        layout: ``layout(record, mode) -> PromptLayout`` when the format has its own prompt, else None (the
            LongMemEval reader prompt of :mod:`relaylens.datasets.prompting`).
    """

    name: str
    reader: Callable
    sniff: Callable[[Path], bool]
    sample: Callable[[], Path] | None = None
    layout: Callable | None = None


def json_head(path: Path) -> str | None:
    """The first bytes of a JSON / JSON Lines file, plain or ``.gz`` (left-stripped), or None for files sniffed by
    suffix or not starting like JSON."""
    if data_suffix(path) in JSON_SUFFIXES_EXCLUDED:
        return None
    head = peek_text(path).lstrip()
    return head if head[:1] in "[{" else None


def has_keys(head: str | None, *keys: str) -> bool:
    """Every ``"key"`` occurs in ``head`` (a JSON prefix)."""
    return head is not None and all(json.dumps(key) in head for key in keys)
