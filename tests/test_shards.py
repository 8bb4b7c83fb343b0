"""Merging one run directory's shards (RUN_DIR/shards/I-of-N, from --shard auto or sweep) into RUN_DIR, and the
refusals: no shards, mixed sweeps, a missing shard, an unfinished shard, a misplaced shard, different configurations."""

from __future__ import annotations

import json

import pytest

from relaylens.launch import shard_dir
from relaylens.results import ResultStoreError, RunStore, load_tables
from relaylens.shards import merge_run_dir, shard_records
from test_results import assert_tables_equal, fill, manifest  # tests/ is on sys.path under pytest

IDS = [f"q{k}" for k in range(10)]


def make_shard(run_dir, index, count, ids=IDS, finish=True, **config):
    """A shard directory as the runner leaves it: its records' units, consolidated when the run finished."""
    store = RunStore.create_or_open(shard_dir(run_dir, index, count), manifest(**config) | {"shard": {"index": index, "count": count}})
    fill(store, shard_records(ids, index, count))
    if finish:
        store.consolidate()
    return store


def test_merge_run_dir_equals_unsharded_and_is_idempotent(tmp_path):
    full = RunStore.create_or_open(tmp_path / "full", manifest())
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
        ([(0, 2, {}), (1, 2, {"finish": False})], "shard 1-of-2 in"),
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


def test_a_killed_shard_that_resumed_and_finished_merges(tmp_path):
    run = tmp_path / "run"
    make_shard(run, 0, 2)
    partial = make_shard(run, 1, 2, ids=IDS[:3], finish=True)  # an earlier, shorter attempt consolidated ...
    fill(partial, [r for r in shard_records(IDS, 1, 2) if r not in IDS[:3]])  # ... then the resumed run added units
    with pytest.raises(ResultStoreError, match="has not finished"):
        merge_run_dir(run)
    partial.consolidate()  # the resumed run's end
    merge_run_dir(run)
    assert sorted(load_tables(run)["answers"].record_id.unique()) == sorted(IDS)
