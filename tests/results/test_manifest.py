"""A run's manifest (relaylens.results.manifest): its contents, the source state, and how two manifests compare."""

from __future__ import annotations

import doctest
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import relaylens.results.manifest as manifest_module
from relaylens.fileio import file_sha256
from relaylens.results.manifest import (
    FORMAT_VERSION,
    ResultStoreError,
    build_manifest,
    canonical_manifest,
    manifest_diff,
    refuse_repinned,
    source_state,
)
from relaylens.results.store import RunStore

ROOT = Path(__file__).resolve().parents[2]


def test_docstring_examples():
    result = doctest.testmod(manifest_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0


def test_manifest_contents(tmp_path):
    data = tmp_path / "data.json"
    data.write_text("[1, 2, 3]")
    m = build_manifest("a", {"x": [1, 2]}, "spec", "hash", dataset_path=data, shard=(1, 3))
    assert m["dataset"] == {"path": str(data), "sha256": hashlib.sha256(b"[1, 2, 3]").hexdigest()}
    assert m["shard"] == {"index": 1, "count": 3} and m["model"] == {"spec": "spec", "weights_hash": "hash"}
    assert {"python", "torch", "transformers", "relaylens", "pandas"} <= set(m["versions"])
    assert m["git_commit"] is None or len(m["git_commit"]) == 40
    assert m["format_version"] == FORMAT_VERSION and m["git_commit"] == m["source"]["commit"]
    store = RunStore.create_or_open(tmp_path / "run", m)
    on_disk = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert on_disk["config"] == {"x": [1, 2]} and store.manifest == on_disk
    assert not list((tmp_path / "run").glob(".tmp-*"))


def test_paths_and_times_are_not_compared_and_new_settings_compare_as_their_default():
    a = {"analysis": "x", "config": {"seed": 0, "run": {"model": "a/b"}}, "created_at": "t0",
         "dataset": {"path": "/a/d.json", "sha256": "1"}}
    b = {"analysis": "x", "config": {"seed": 0, "run": {"model": "c/b", "record_order": "file"}}, "created_at": "t1",
         "dataset": {"path": "d.json", "sha256": "1"}}
    assert manifest_diff(a, b) == []
    assert manifest_diff(a, {**b, "config": {"seed": 0, "run": {"record_order": "interleave"}}}) \
        == ["config.run.record_order"]
    assert manifest_diff(a, {**a, "config": {"seed": 1, "run": {"model": "a/b"}}}, ignore={"config.seed"}) == []


def test_a_manifest_that_is_not_json_is_refused():
    assert canonical_manifest({"p": Path("x"), "s": {2, 1}}) == {"p": "x", "s": [1, 2]}
    with pytest.raises(ResultStoreError, match="must be JSON-serialisable"):
        canonical_manifest({"x": object()})


def test_a_learned_geometry_changed_under_committed_units_is_refused(tmp_path):
    old = {"config": {"learned": {"lg": {"sha256": "a" * 64}}}}
    new = {"config": {"learned": {"lg": {"sha256": "b" * 64}}}}
    refuse_repinned(tmp_path, old, new, has_units=False)  # nothing committed: nothing to mix
    refuse_repinned(tmp_path, old, old, has_units=True)
    with pytest.raises(ResultStoreError, match="not even --force"):
        refuse_repinned(tmp_path, old, new, has_units=True)


def test_source_state_hashes_the_analyses_without_importing_them():
    """The results stage finds the analyses' folder by its import spec: importing the analyses package (the top floor)
    from the run store would be an upward import."""
    code = ("import sys\nfrom relaylens.results.manifest import source_state\ns = source_state()\n"
            "print(len(s['source_sha256']), 'relaylens.analyses' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert out.stdout.split() == ["64", "False"]
    assert source_state()["source_sha256"] == source_state()["source_sha256"]


def test_the_old_homes_are_the_same_objects(tmp_path):
    import relaylens.results.store as store

    for name in ("FORMAT_VERSION", "ResultStoreError", "build_manifest", "manifest_diff", "manifest_section",
                 "source_state"):
        assert getattr(store, name) is getattr(manifest_module, name), name
    assert store.file_sha256 is file_sha256
    (tmp_path / "f").write_bytes(b"x" * 3_000_000)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(b"x" * 3_000_000).hexdigest()
