"""Sharding a sweep across processes or machines, and merging the shard run directories back into one.

Records are assigned to shards by a hash of their id, so every process computes the same split without talking to
the others; ``merge_runs`` copies the committed unit files of each shard into one run directory and consolidates it.

Example:
    >>> parse_shard("1/4")
    (1, 4)
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pandas as pd

from relaylens.results import UNITS, ResultStoreError, RunStore, _atomic_write, manifest_diff


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)``; shards are numbered ``0..n-1``.

    >>> parse_shard("0/2")
    (0, 2)
    """
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard expects 'i/n' with integers (e.g. 0/2); got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text}: expected 0 <= i < n (shards are numbered 0..n-1); got i={i}, n={n}")
    return i, n


def shard_records(record_ids: list[str], i: int, n: int) -> list[str]:
    """The ids of shard ``i`` of ``n`` (input order kept): ``sha256(id) mod n == i``, stable across runs and machines.

    >>> ids = [f"q{k}" for k in range(10)]
    >>> sorted(shard_records(ids, 0, 2) + shard_records(ids, 1, 2)) == sorted(ids)
    True
    """
    parse_shard(f"{i}/{n}")
    return [r for r in record_ids if int(hashlib.sha256(str(r).encode("utf-8")).hexdigest()[:16], 16) % n == i]


def merge_runs(shard_dirs: list[str | Path], out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Combine shard run directories into ``out_dir`` and consolidate it. Manifests must agree except ``shard``;
    a unit present in two shards must have identical content. Returns the merged tables."""
    if not shard_dirs:
        raise ValueError("merge_runs needs at least one shard directory")
    stores = [RunStore.open(d) for d in shard_dirs]
    base = stores[0]
    for s in stores[1:]:
        diff = manifest_diff(base.manifest, s.manifest, ignore={"shard"})
        if diff:
            raise ResultStoreError(f"cannot merge {s.run_dir} with {base.run_dir}: manifests differ in {diff}. "
                                   "Fix: merge only shards of one command (same analysis, config, model, data, code)")
    shards = [s.manifest.get("shard") for s in stores]
    counts = {sh["count"] for sh in shards if sh}
    if len(counts) == 1 and len({sh["index"] for sh in shards if sh}) < counts.pop():
        warnings.warn(f"merging {len(stores)} directories that do not cover every shard: {shards}", stacklevel=2)
    manifest = {**base.manifest, "shard": None,
                "merged_from": [{"dir": str(s.run_dir), "shard": s.manifest.get("shard")} for s in stores]}
    out = RunStore.create_or_open(out_dir, manifest)
    seen: dict[str, Path] = {p.name: p for p in out.unit_paths()}
    for s in stores:
        for path in s.unit_paths():
            content = s._load_unit(path)  # validates the checksum before copying
            if path.name in seen:
                if out._load_unit(seen[path.name]) != content:
                    raise ResultStoreError(f"unit {path.name} differs between {seen[path.name]} and {path}: the same "
                                           "(record, selector, budget) has different results. Fix: drop one shard's copy")
                continue
            _atomic_write(out.run_dir / UNITS / path.name, path.read_bytes(), out.run_dir, out.writer)
            seen[path.name] = path
    return out.consolidate()


def merge_run_dir(run_dir: str | Path) -> list[Path]:
    """Merge the shard directories ``RUN_DIR/shards/I-of-N`` (written by ``relaylens run --shard auto`` or
    ``relaylens sweep``) into ``RUN_DIR`` itself; returns the shard directories merged.

    Refuses, naming the shard and the fix: no shards, shards of different sweeps (two values of N), a missing shard,
    a shard that has not finished (its run did not reach the final consolidation), and shards of different
    configurations (:func:`merge_runs`)."""
    import json
    import re

    from relaylens.launch import SHARDS

    run_dir = Path(run_dir)
    found = {}
    for path in sorted((run_dir / SHARDS).glob("*-of-*")):
        match = re.fullmatch(r"(\d+)-of-(\d+)", path.name)
        if match and path.is_dir():
            found[path] = (int(match[1]), int(match[2]))
    if not found:
        raise ResultStoreError(f"{run_dir / SHARDS} holds no shard directories (I-of-N). Fix: pass the --out of "
                               "`relaylens run --shard auto` or `relaylens sweep`, or merge explicit shard "
                               "directories with --out")
    counts = sorted({n for _, n in found.values()})
    if len(counts) > 1:
        raise ResultStoreError(f"{run_dir / SHARDS} mixes shards of sweeps with {' and '.join(map(str, counts))} "
                               "shards. Fix: delete the stale shard directories (or start a new --out) and merge again")
    count = counts[0]
    missing = sorted(set(range(count)) - {i for i, _ in found.values()})
    if missing:
        raise ResultStoreError(f"shard(s) {', '.join(f'{i}-of-{count}' for i in missing)} missing in {run_dir / SHARDS}: "
                               "that process never started, or wrote to storage this machine does not see (the run "
                               "directory must be on storage every process shares). Fix: run the missing ranks with "
                               "the same command (finished units are kept), then merge again")
    for path, (index, _) in found.items():
        store = RunStore.open(path)
        if store.manifest.get("shard") != {"index": index, "count": count}:
            raise ResultStoreError(f"{path} holds shard {store.manifest.get('shard')}, not {index}-of-{count}. Fix: "
                                   "move it to the directory its manifest names, or re-run that shard")
        try:
            marker = json.loads((path / "consolidated.json").read_text("utf-8"))
        except (OSError, ValueError):
            marker = None
        units = [p.stem for p in store.unit_paths()]
        if marker is None or marker.get("units") != units:
            raise ResultStoreError(f"shard {path.name} in {run_dir / SHARDS} has not finished ({len(units)} units "
                                   "committed, run not completed). Fix: re-run that rank with the same command (it "
                                   "resumes from its committed units), then merge again")
    merge_runs(list(found), run_dir)
    return list(found)
