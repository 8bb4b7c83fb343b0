"""Merging one run directory's shards (RUN_DIR/shards/I-of-N, from --shard auto or sweep) into RUN_DIR, and the
refusals: no shards, mixed sweeps, a missing shard, a shard lacking units, a misplaced shard, different
configurations."""

from __future__ import annotations

import json

import pytest
from support.runs import (  # tests/ is on sys.path under pytest (tests/conftest.py)
    assert_tables_equal,
    fill,
    manifest,
)

from relaylens.experiments.launch import shard_dir
from relaylens.results.shards import merge_run_dir, shard_records
from relaylens.results.store import (
    ResultStoreError,
    RunStore,
    build_manifest,
    load_tables,
)

IDS = [f"q{k}" for k in range(10)]


def make_shard(run_dir, index, count, finish=True, **config):
    """A shard directory as the runner leaves it: a manifest with its plan (its records; one bm25 @ 0.1 unit
    each), and every planned unit committed (``finish=False``: only the first, as a killed run leaves it)."""
    ids = shard_records(IDS, index, count)
    m = build_manifest("test_analysis", {"seed": 0, "spec": {"selectors": ["bm25"], "budgets": [0.1]}, **config},
                       "tiny-llama", "deadbeef", shard=(index, count), plan={"record_ids": ids, "units": len(ids)})
    store = RunStore.create_or_open(shard_dir(run_dir, index, count), m)
    fill(store, ids if finish else ids[:1])
    store.consolidate()
    return store


def test_merge_run_dir_equals_unsharded_and_is_idempotent(tmp_path):
    full = RunStore.create_or_open(tmp_path / "full", manifest())  # the same units, unsharded
    fill(full, IDS)
    run = tmp_path / "run"
    for i in range(3):
        make_shard(run, i, 3)
    assert not (run / "manifest.json").exists()
    merged = merge_run_dir(run)
    assert sorted(p.name for p in merged) == ["0-of-3", "1-of-3", "2-of-3"]
    assert_tables_equal(load_tables(run), full.consolidate())
    m = json.loads((run / "manifest.json").read_text())
    assert m["shard"] is None and sorted(d["shard"]["index"] for d in m["merged_from"]) == [0, 1, 2]
    merge_run_dir(run)  # again: same result
    assert_tables_equal(load_tables(run), full.consolidate())


def _shards(run, spec):
    for index, count, kw in spec:
        make_shard(run, index, count, **kw)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "holds no shard directories"),
        ([(0, 2, {}), (1, 2, {}), (0, 3, {})], "mixes shards of sweeps with 2 and 3 shards"),
        ([(0, 3, {}), (2, 3, {})], "shard(s) 1-of-3 missing"),
        ([(0, 2, {}), (1, 2, {"finish": False})], "1-of-2 lacks"),
        ([(0, 2, {}), (1, 2, {"seed": 1})], "manifests differ in ['config.seed']"),
    ],
    ids=["none", "mixed-counts", "missing", "unfinished", "different-config"],
)
def test_merge_run_dir_refuses(tmp_path, spec, message):
    run = tmp_path / "run"
    run.mkdir()
    _shards(run, spec)
    with pytest.raises(ResultStoreError) as err:
        merge_run_dir(run)
    assert message in str(err.value) and "Fix" in str(err.value)
    assert not (run / "manifest.json").exists(), "a refused merge must not start the merged run directory"


def test_merge_run_dir_refuses_a_shard_in_the_wrong_directory(tmp_path):
    run = tmp_path / "run"
    make_shard(run, 0, 2)
    make_shard(run, 1, 2)
    (run / "shards" / "1-of-2").rename(run / "shards" / "moved")
    make_shard(tmp_path / "other", 0, 2)
    (tmp_path / "other" / "shards" / "0-of-2").rename(run / "shards" / "1-of-2")  # shard 0's directory named 1-of-2
    with pytest.raises(ResultStoreError, match="holds shard .* not 1-of-2"):
        merge_run_dir(run)


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "allow-incomplete"])
def test_a_killed_shard_merges_once_resumed_or_with_allow_incomplete(tmp_path, resume):
    run = tmp_path / "run"
    make_shard(run, 0, 2)
    partial = make_shard(run, 1, 2, finish=False)  # killed after its first unit
    with pytest.raises(ResultStoreError, match="lacks"):
        merge_run_dir(run)
    if resume:
        fill(partial, shard_records(IDS, 1, 2)[1:])  # the resumed run commits the rest
        merge_run_dir(run)
        assert sorted(load_tables(run)["answers"].record_id.unique()) == sorted(IDS)
    else:
        with pytest.warns(UserWarning, match="lacks"):
            merge_run_dir(run, allow_incomplete=True)
        assert len(load_tables(run)["answers"].record_id.unique()) == len(shard_records(IDS, 0, 2)) + 1
