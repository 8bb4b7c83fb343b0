"""Sharding a sweep across processes or machines, and merging the shard run directories back into one.

Records are assigned to shards by a hash of their id, so every process computes the same split without talking to
the others; ``merge_runs`` copies the committed unit files (and token views) of each shard into one run directory and
consolidates it. A merge reads and checks every source first and writes nothing when one is refused; merging again
into a run directory that was judged since (``relaylens judge``) keeps its judge scores.

Example:
    >>> parse_shard("1/4")
    (1, 4)
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import pandas as pd

from relaylens.errors import RelaylensError
from relaylens.results.locks import run_lock
from relaylens.results.manifest import ResultStoreError, manifest_diff, manifest_section
from relaylens.results.passes import pass_metrics, read_passes
from relaylens.results.store import RunStore, UnitKey, prepare_run_dir
from relaylens.results.tables import unit_labels
from relaylens.results.views import view_files, write_view

SHARDS = "shards"
"""The folder of a run directory that holds its shard directories ``I-of-N`` (``--shard auto``, ``relaylens sweep``)."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)``; shards are numbered ``0..n-1``.

    >>> parse_shard("0/2")
    (0, 2)
    """
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise RelaylensError(f"--shard expects 'i/n' with integers (e.g. 0/2); got {text!r}. Fix: pass e.g. --shard "
                             "0/2 for the first of two shards") from None
    if n < 1 or not 0 <= i < n:
        raise RelaylensError(f"--shard {text}: expected 0 <= i < n (shards are numbered 0..n-1); got i={i}, n={n}. "
                             f"Fix: pass i from 0 to n-1, e.g. --shard {max(n, 1) - 1}/{max(n, 1)}")
    return i, n


def shard_records(record_ids: list[str], i: int, n: int) -> list[str]:
    """The ids of shard ``i`` of ``n`` (input order kept): ``sha256(id) mod n == i``, stable across runs and machines.

    >>> ids = [f"q{k}" for k in range(10)]
    >>> sorted(shard_records(ids, 0, 2) + shard_records(ids, 1, 2)) == sorted(ids)
    True
    """
    parse_shard(f"{i}/{n}")
    return [r for r in record_ids if int(hashlib.sha256(str(r).encode("utf-8")).hexdigest()[:16], 16) % n == i]


def _planned_keys(manifest: dict) -> list[UnitKey] | None:
    """The units a manifest's ``plan`` and spec list, or None when it records no (usable) plan."""
    plan, spec = manifest.get("plan"), manifest_section(manifest, "config", "spec")
    if not isinstance(plan, dict) or not isinstance(plan.get("record_ids"), list) \
            or not isinstance(spec.get("selectors"), list) or not isinstance(spec.get("budgets", []), list):
        return None
    try:
        budgets = [int(b) if float(b) > 1 else float(b) for b in spec.get("budgets", [])]
        return [UnitKey(str(r), str(sel), b) for r in plan["record_ids"] for sel in unit_selectors(spec)
                for b in budgets]
    except (TypeError, ValueError):
        return None


def unit_selectors(spec: dict) -> list[str]:
    """The ``selector`` labels of a spec's units: its selectors, or ``NAME@keep=CELL`` per framing cell (the
    ``framing`` analysis; the rule of :meth:`relaylens.experiments.specs.ExperimentSpec.unit_selectors`, read here
    from the manifest's spec).

    >>> unit_selectors({"selectors": ["bm25"], "framing_cells": ["none", "sink4"]})
    ['bm25@keep=none', 'bm25@keep=sink4']
    """
    cells = spec.get("framing_cells") or []
    return unit_labels(spec["selectors"], cells if isinstance(cells, list) else [])


def expected_units(manifest: dict) -> set[str] | None:
    """Unit file hashes a run (or shard) must hold when complete, from its manifest's ``plan`` and spec; None for
    manifests written before relaylens recorded a plan."""
    keys = _planned_keys(manifest)
    return None if keys is None else {k.hash for k in keys}


def plan_progress(manifest: dict, unit_hashes) -> tuple[int, int] | None:
    """``(committed, planned)``: how many of the units the manifest plans are among ``unit_hashes``; None without a
    plan.

    >>> m = {"plan": {"record_ids": ["q1", "q2"]}, "config": {"spec": {"selectors": ["bm25"], "budgets": [0.1]}}}
    >>> plan_progress(m, [UnitKey("q1", "bm25", 0.1).hash])
    (1, 2)
    """
    want = expected_units(manifest)
    return None if not want else (len(want & set(unit_hashes)), len(want))


def merge_runs(shard_dirs: list[str | Path], out_dir: str | Path, allow_incomplete: bool = False) -> dict[str,
                                                                                                          pd.DataFrame]:
    """Combine shard run directories into ``out_dir`` and consolidate it. Manifests must agree except ``shard``
    and ``plan``; a unit present in two shards must have identical content.

    Completeness is checked against the manifests: the shards must be distinct shards of one split (same count)
    and, with ``allow_incomplete=False``, cover every shard and hold every unit their plan lists; otherwise the
    merge is refused with the missing shards / units named. ``allow_incomplete=True`` merges anyway, warns, and
    records the missing units under ``manifest["incomplete"]``. Returns the merged tables."""
    if not shard_dirs:
        raise RelaylensError("merge_runs needs at least one shard directory. Fix: pass the run directories of the "
                             "shards to merge")
    stores = [RunStore.open(d) for d in shard_dirs]
    base = stores[0]
    for s in stores[1:]:
        diff = manifest_diff(base.manifest, s.manifest, ignore={"shard", "plan"})
        if diff:
            raise ResultStoreError(f"cannot merge {s.run_dir} with {base.run_dir}: manifests differ in {diff}. "
                                   "Fix: merge only shards of one command (same analysis, config, model, data, code)")
    problems = _completeness(stores)
    if problems and not allow_incomplete:
        raise ResultStoreError(f"merging {len(stores)} directories would give incomplete tables: "
                               f"{'; '.join(problems)}. Fix: finish the missing shards (re-running a shard's command "
                               "resumes it), or pass --allow-incomplete to merge what is there")
    if problems:
        warnings.warn(f"merging incomplete shards: {'; '.join(problems)}", stacklevel=2)
    plans = [s.manifest.get("plan") for s in stores]
    manifest = {**base.manifest, "shard": None,
                "merged_from": [{"dir": str(s.run_dir), "shard": s.manifest.get("shard")} for s in stores]}
    if all(isinstance(p, dict) for p in plans):
        manifest["plan"] = {"record_ids": [r for p in plans for r in p.get("record_ids", [])],
                            "units": sum(p.get("units", 0) for p in plans)}
    if problems:
        manifest["incomplete"] = problems
    out_dir = Path(out_dir)
    copies = _units_to_copy(stores, RunStore(out_dir, {}))  # every source checked before anything is written
    views = _views_to_copy(stores)
    prepare_run_dir(out_dir)
    with run_lock(out_dir, "merge"):
        out = RunStore.create_or_open(out_dir, manifest)
        for path in copies:
            out.copy_unit(path)
        for view in views:
            write_view(out_dir, view)
        return out.consolidate()


def _completeness(stores: list[RunStore]) -> list[str]:
    """What the shards lack against their manifests: shards of another split, missing or repeated shards, units."""
    problems = []
    shards = [s.manifest.get("shard") for s in stores]
    counts = {sh["count"] for sh in shards if sh}
    if counts and (len(counts) > 1 or None in shards):
        shown = ", ".join("unsharded" if sh is None else f"{sh['index']}/{sh['count']}" for sh in shards)
        problems.append(f"the directories come from different splits (shards {shown}); merge the shards of one "
                        "--shard i/n split")
    elif counts:
        n = counts.pop()
        indices = [sh["index"] for sh in shards]
        missing = sorted(set(range(n)) - set(indices))
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        if missing:
            problems.append(f"shards {', '.join(f'{i}/{n}' for i in missing)} are missing")
        if repeated:
            problems.append(f"shards {', '.join(f'{i}/{n}' for i in repeated)} are given twice")
    for s in stores:
        want = expected_units(s.manifest)
        if want is None:  # an older manifest: nothing to check against, said loudly
            warnings.warn(f"{s.run_dir} records no plan (written by an older relaylens or by hand): its completeness "
                          "cannot be checked", stacklevel=3)
            continue
        have = {p.name.removesuffix(".json.gz") for p in s.unit_paths()}
        lacking = want - have
        if lacking:
            keys = _unit_keys(s.manifest, lacking)
            problems.append(f"{s.run_dir} lacks {len(lacking)} of its {len(want)} units ({', '.join(keys[:5])}"
                            f"{' ...' if len(keys) > 5 else ''})")
    return problems


def _unit_keys(manifest: dict, hashes: set[str]) -> list[str]:
    return [f"{k.record_id}/{k.selector}@{k.budget:g}" for k in _planned_keys(manifest) or [] if k.hash in hashes]


def _content(tables: dict[str, dict[str, list]], judged: dict[str, str]) -> str:
    """A digest of a unit's rows without the score rows of the metrics in ``judged`` (those of judge passes)."""
    if judged:
        scores = tables["scores"]
        keep = [i for i, m in enumerate(scores["metric"]) if m not in judged]
        tables = {**tables, "scores": {c: [v[i] for i in keep] for c, v in scores.items()}}
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def _units_to_copy(stores: list[RunStore], out: RunStore) -> list[Path]:
    """The unit files of ``stores`` that ``out`` lacks, after every unit's checksum was verified and no two copies of
    one unit disagree. ``out``'s own copy may add the score rows of its judge passes (``relaylens judge`` after an
    earlier merge): those are kept. Raises naming both copies; nothing is written."""
    judged = pass_metrics(read_passes(out.run_dir))
    seen: dict[str, tuple[Path, str]] = {p.name: (p, _content(out.load_unit(p), judged)) for p in out.unit_paths()}
    copies = []
    for s in stores:
        for path in s.unit_paths():
            content = _content(s.load_unit(path), judged)  # validates the checksum
            if path.name not in seen:
                seen[path.name] = (path, content)
                copies.append(path)
            elif seen[path.name][1] != content:
                first = seen[path.name][0]
                if first.parent.parent == out.run_dir:
                    fix = (f"merge into a new --out to keep both, or delete {first} to take the shard's copy, then "
                           "merge again")
                    why = f"{path.parent.parent} was re-run with other results since {out.run_dir} was merged"
                else:
                    fix = "merge each unit from one shard only: leave the directory that should not own it out"
                    why = "two shard directories hold the same unit"
                raise ResultStoreError(f"unit {path.name} differs between {first} and {path}: {why}; nothing was "
                                       f"merged. Fix: {fix}")
    return copies


def _views_to_copy(stores: list[RunStore]) -> list[dict]:
    """The readable token views of the units each shard holds (damaged ones are skipped with a warning)."""
    views = []
    for s in stores:
        units = {p.name.removesuffix(".json.gz") for p in s.unit_paths()}
        views += [view for _, view in view_files(s.run_dir)
                  if UnitKey(view["record_id"], view["selector"], view["budget"]).hash in units]
    return views


def merge_run_dir(run_dir: str | Path, allow_incomplete: bool = False) -> list[Path]:
    """Merge the shard directories ``RUN_DIR/shards/I-of-N`` (written by ``relaylens run --shard auto`` or
    ``relaylens sweep``) into ``RUN_DIR`` itself; returns the shard directories merged.

    Refuses, naming the shard and the fix: no shards, shards of different sweeps (two values of N), a missing shard
    or missing units (unless ``allow_incomplete``), a shard directory holding another shard, and shards of
    different configurations (:func:`merge_runs`)."""
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
    if missing and not allow_incomplete:
        raise ResultStoreError(f"shard(s) {', '.join(f'{i}-of-{count}' for i in missing)} missing in "
                               f"{run_dir / SHARDS}: that process never started, or wrote to storage this machine does "
                               "not see (the run directory must be on storage every process shares). Fix: run the "
                               "missing ranks with the same command (finished units are kept), then merge again")
    for path, (index, _) in found.items():
        shard = RunStore.open(path).manifest.get("shard")
        if shard != {"index": index, "count": count}:
            raise ResultStoreError(f"{path} holds shard {shard}, not {index}-of-{count}. Fix: move it to the "
                                   "directory its manifest names, or re-run that shard")
    merge_runs(list(found), run_dir, allow_incomplete=allow_incomplete)  # configurations agree; every unit present
    return list(found)
