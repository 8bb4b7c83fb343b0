"""A run's manifest: what produced it, and whether two manifests describe the same run.

* building: :func:`build_manifest` (analysis, config, package versions, model and dataset hashes, shard, plan) and
  :func:`source_state` (a hash of the package and its analyses; inside a git checkout the commit and whether the
  code differs from it);
* comparing: :func:`canonical_manifest` (the JSON form a manifest is written and compared in), :func:`manifest_diff`
  (the dotted keys that differ; paths and times are ignored, settings recorded after runs existed compare as the
  value their absence stands for), :func:`refuse_repinned` (a learned geometry changed under a committed run);
* reading: :func:`manifest_section` (an object inside a manifest, ``{}`` where there is none).

:class:`~relaylens.results.store.RunStore` writes the manifest into ``manifest.json`` and compares it on re-open;
``merge`` compares the manifests of shards. No torch, no pandas.

Example:
    >>> old = build_manifest("ordering", {"seed": 0})
    >>> new = {**old, "config": {"seed": 1}, "created_at": "later"}
    >>> manifest_diff(old, new)
    ['config.seed']
    >>> manifest_section(new, "config")
    {'seed': 1}
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from relaylens.errors import RelaylensError
from relaylens.fileio import file_sha256

__all__ = ["FORMAT_VERSION", "ResultStoreError", "build_manifest", "source_state", "canonical_manifest",
           "manifest_diff", "manifest_section", "ABSENT_MEANS", "flatten_manifest", "json_default", "refuse_repinned"]

FORMAT_VERSION = 1
"""The run-directory format, recorded in every manifest."""
# Paths are recorded but never compared: the same data or model at another path (a relative path, another mount
# point) is the same run when the content hashes (dataset.sha256, model.*) agree.
_IGNORED_ON_COMPARE = {"created_at", "merged_from", "forced", "replaced", "dataset.path", "model.spec",
                       "config.run.model", "config.run.data"}
ABSENT_MEANS = {"config.run.judge_template": "memory_judge_v1", "config.run.record_order": "file",
                "config.run.decoding": "dynamic", "config.run.compile_backend": None}
"""Settings added after runs existed, compared as the value their absence stands for: a run started before one was
recorded resumes (and merges) as the same run when the setting is still what it then was."""


class ResultStoreError(RelaylensError):
    """A run directory whose manifest, unit files or rows are not what the store expects."""


# ---------------------------------------------------------------------------------------------------- building

def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("relaylens", "torch", "transformers", "accelerate", "numpy", "pandas", "pyarrow"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(pkg: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(pkg), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit() -> str | None:
    """``git rev-parse HEAD`` of the repository holding this package, else None (installed wheel, no git)."""
    pkg = Path(__file__).resolve().parents[1]  # the relaylens package
    top = (_git(pkg, "rev-parse", "--show-toplevel", "HEAD") or "").split()
    if len(top) != 2 or not (Path(top[0]) / "relaylens" / "__init__.py").resolve() == pkg / "__init__.py":
        return None
    return top[1]


def _analyses_folders() -> list[str]:
    """The folder of the analyses (``analyses/`` inside this package, beside ``results/``), named by path: the results
    stage stays below them and imports none; never a top-level ``analyses``."""
    return [str(Path(__file__).resolve().parents[1] / "analyses")]


def source_state() -> dict:
    """What code produced a run: ``source_sha256`` (every file of the ``relaylens`` package and the analyses,
    hashed by relative path and content: works for an installed wheel too), and, inside a git checkout, the
    ``commit``, whether the package differs from it (``dirty``) and a hash of that difference (``diff_sha256``).

    >>> s = source_state()
    >>> len(s["source_sha256"]), set(s) == {"source_sha256", "commit", "dirty", "diff_sha256"}
    (64, True)
    """
    pkg = Path(__file__).resolve().parents[1]  # the relaylens package
    roots = [pkg] + [Path(p).resolve() for p in _analyses_folders()]
    digest = hashlib.sha256()
    for root in roots:
        for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".json", ".jsonl")
                        and "__pycache__" not in p.parts
                        and not (root == pkg and p.relative_to(pkg).parts[0] == "analyses")):
            digest.update(f"{root.name}/{f.relative_to(root).as_posix()}\0".encode())
            digest.update(hashlib.sha256(f.read_bytes()).digest())
    commit = _git_commit()
    dirty = diff = None
    if commit is not None:
        paths = ["--", str(pkg)] + [str(r) for r in roots[1:]]
        status = _git(pkg, "status", "--porcelain", "--untracked-files=all", *paths)
        patch = _git(pkg, "diff", "HEAD", "--binary", *paths)
        if status is not None and patch is not None:
            dirty = bool(status.strip())
            diff = hashlib.sha256((status + patch).encode()).hexdigest() if dirty else None
    return {"source_sha256": digest.hexdigest(), "commit": commit, "dirty": dirty, "diff_sha256": diff}


def build_manifest(analysis: str, config: dict, model_spec: str | None = None, weights_hash: str | None = None,
                   dataset_path: str | Path | None = None, shard: tuple[int, int] | None = None,
                   model_info: dict | None = None, plan: dict | None = None) -> dict:
    """The manifest of a run: analysis, full config, package versions, model (weights, config and tokenizer
    hashes), dataset hash, source state (:func:`source_state`), shard, and the ``plan`` (the record ids this run or
    shard owns, so that ``merge`` can check completeness).

    >>> m = build_manifest("coordinate_ablation", {"budget": 0.1}, "smollm2-135m-instruct", "ab12")
    >>> m["model"], m["dataset"], m["shard"]
    ({'spec': 'smollm2-135m-instruct', 'weights_hash': 'ab12'}, None, None)
    """
    dataset = None
    if dataset_path is not None:
        dataset = {"path": str(dataset_path), "sha256": file_sha256(dataset_path)}
    source = source_state()
    return {
        "format_version": FORMAT_VERSION, "analysis": analysis, "config": config,
        "model": {"spec": model_spec, "weights_hash": weights_hash, **(model_info or {})}, "dataset": dataset,
        "versions": _versions(), "git_commit": source["commit"], "source": source,
        "shard": None if shard is None else {"index": int(shard[0]), "count": int(shard[1])},
        **({"plan": plan} if plan is not None else {}),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------------------------------- comparing

def json_default(obj: Any) -> Any:
    """The ``default=`` hook of every JSON document a run directory holds: dataclasses as dicts, paths as strings,
    numpy scalars as numbers, sets sorted; anything else raises ``TypeError`` (as ``json.dumps`` expects).

    >>> json.dumps({"p": Path("a/b"), "s": {2, 1}}, default=json_default, sort_keys=True)
    '{"p": "a/b", "s": [1, 2]}'
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (Path, os.PathLike)):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} {obj!r} is not JSON-serialisable")


def canonical_manifest(manifest: dict) -> dict:
    """The manifest as it reads back from JSON (the form it is written and compared in); a manifest that is not
    JSON-serialisable raises :class:`ResultStoreError`."""
    try:
        return json.loads(json.dumps(manifest, default=json_default, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise ResultStoreError(f"the manifest must be JSON-serialisable: {exc}. Fix: pass plain dicts, lists, "
                               "strings and numbers (dataclasses and paths are converted)") from None


def refuse_repinned(run_dir: Path, old: dict, new: dict, has_units: bool) -> None:
    """Refuse, even with ``--force``, a run whose committed units used pinned content (``config.learned``: a learned
    geometry's file, by SHA-256) that has changed under the same label: resuming would mix two geometries under one
    condition label. Nothing is refused before the first unit is committed."""
    before, after = manifest_section(old, "config", "learned"), manifest_section(new, "config", "learned")
    changed = sorted(label for label in set(before) & set(after)
                     if isinstance(before[label], dict) and isinstance(after[label], dict)
                     and before[label].get("sha256") != after[label].get("sha256"))
    if changed and has_units:
        first = changed[0]
        raise ResultStoreError(f"run directory {run_dir}: condition {first} now reads another learned geometry (sha256 "
                               f"{str(before[first].get('sha256'))[:12]} -> {str(after[first].get('sha256'))[:12]}) "
                               "than the one its committed units used; continuing would mix two geometries under one "
                               "label, so not even --force continues. Fix: restore that learned_geometry.json, or "
                               "write the new geometry's run to a new --out")


def flatten_manifest(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of the leaves of a manifest (an empty object is a leaf).

    >>> flatten_manifest({"config": {"seed": 0, "run": {}}, "shard": None})
    {'config.seed': 0, 'config.run': {}, 'shard': None}
    """
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten_manifest(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def manifest_diff(a: dict, b: dict, ignore: set[str] = frozenset()) -> list[str]:
    """Dotted keys whose values differ between two manifests (``created_at`` and friends ignored)."""
    fa, fb = flatten_manifest(canonical_manifest(a)), flatten_manifest(canonical_manifest(b))
    skip = _IGNORED_ON_COMPARE | set(ignore)
    absent = {k: ABSENT_MEANS.get(k, "<absent>") for k in set(fa) | set(fb)}
    return sorted(k for k in absent
                  if fa.get(k, absent[k]) != fb.get(k, absent[k])
                  and not any(k == s or k.startswith(s + ".") for s in skip))


# ----------------------------------------------------------------------------------------------------- reading

def manifest_section(manifest: dict, *path: str) -> dict:
    """The object at ``path`` in a manifest (``"config", "spec"``: the analysis spec; ``"model"``), or ``{}`` where
    the manifest records none or records something other than an object (a hand-edited or damaged manifest).

    >>> manifest_section({"config": {"spec": "ordering"}}, "config", "spec")
    {}
    >>> manifest_section({"model": {"spec": "x"}}, "model")
    {'spec': 'x'}
    """
    for key in path:
        manifest = manifest.get(key) if isinstance(manifest, dict) else None
    return manifest if isinstance(manifest, dict) else {}
