"""Stored token views of a run: ``RUN_DIR/views/*.json``, one per (record, selector, budget), written as the run
commits units (capture: :mod:`relaylens.probes.token_view`; rendering: :mod:`relaylens.reporting.token_view`).
"""

from __future__ import annotations

import json
from pathlib import Path

VIEWS = "views"


def view_path(run_dir: str | Path, key: dict) -> Path:
    """``RUN_DIR/views/<record>__<selector>__<budget>.json``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key["record_id"]))
    return Path(run_dir) / VIEWS / f"{safe}__{key['selector']}__{float(key['budget']):g}.json"


def write_view(run_dir: str | Path, view: dict) -> Path:
    """Write one view atomically (temp file + rename)."""
    path = view_path(run_dir, view)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(view, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path


def load_views(run_dir: str | Path, records: int | None = 3) -> list[dict]:
    """Stored views of the first ``records`` records (in the order the run processed them), each unit in order."""
    folder = Path(run_dir) / VIEWS
    if not folder.is_dir():
        return []
    views = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    views.sort(key=lambda v: (v.get("order", 0), v["record_id"], v["selector"], float(v["budget"])))
    chosen: list[str] = []
    for v in views:
        if v["record_id"] not in chosen:
            chosen.append(v["record_id"])
    keep = set(chosen if records is None else chosen[:records])
    return [v for v in views if v["record_id"] in keep]
