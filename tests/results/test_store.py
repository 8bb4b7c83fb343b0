"""Result store: atomic units, resume, corruption, full disk, consolidation, shards and merge (the manifest's
contents: tests/results/test_manifest.py)."""

from __future__ import annotations

import doctest
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from support.runs import CONDITIONS, assert_tables_equal, fill, manifest, unit_rows  # noqa: F401 - tests/ helpers

import relaylens.results.store as results
from relaylens.results.shards import merge_runs, parse_shard, shard_records
from relaylens.results.store import (
    ResultStoreError,
    RunStore,
    StoreWriteError,
    UnitKey,
    load_tables,
)
from relaylens.results.tables import TABLES


def test_docstring_examples():
    result = doctest.testmod(results, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 3 and result.failed == 0


def test_write_consolidate_columns_sorted_deterministic(tmp_path):
    a = RunStore.create_or_open(tmp_path / "a", manifest())
    b = RunStore.create_or_open(tmp_path / "b", manifest())
    ids = ["q3", "q1", "q2_abs", "q10"]
    fill(a, ids)
    fill(b, list(reversed(ids)))
    ta, tb = a.consolidate(), b.consolidate()
    assert_tables_equal(ta, tb)
    for name, cols in TABLES.items():
        assert list(ta[name].columns) == cols
        assert (tmp_path / "a" / f"{name}.parquet").exists()
    assert list(ta["answers"]["record_id"]) == sorted(ids * 2)
    assert len(ta["scores"]) == 4 * 4 and len(ta["probes"]) == 4 * 2 * 4
    assert ta["scores"]["value"].isna().sum() == 8  # NaN judge values round-trip as NaN
    assert ta["probes"]["layer"].dtype == "int64" and ta["answers"]["hit_limit"].dtype == bool
    assert ta["answers"]["cluster_id"].isna().all()
    probes = ta["probes"][ta["probes"]["record_id"] == "q1"]
    assert list(zip(probes["layer"], probes["head"]))[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert_tables_equal(load_tables(tmp_path / "a"), ta)


def test_units_carry_the_machine_stamp_under_their_checksum(tmp_path, monkeypatch):
    from relaylens.model.placement import machine_stamp

    monkeypatch.setenv("RELAYLENS_CPU_FLAGS", "fpu avx2")
    stamp = machine_stamp("cpu")
    assert stamp["bf16"] == "CPU reports neither AMX-BF16 nor AVX512-BF16" and stamp["threads"] >= 1
    store = RunStore.create_or_open(tmp_path / "run", manifest())
    fill(store, ["q_old"])  # a writer that set no stamp (units written before units carried one)
    store.machine = stamp
    fill(store, ["q_new"])
    old, new = (store.unit_path(UnitKey(r, "bm25", 0.1)) for r in ("q_old", "q_new"))
    assert store.unit_machine(old) is None and store.unit_machine(new) == stamp
    assert_tables_equal(store.consolidate(), load_tables(tmp_path / "run"))  # the stamp is not a table
    doc = json.loads(gzip.decompress(new.read_bytes()))
    doc["machine"]["name"] = "another CPU"  # a stamp edited afterwards fails the checksum
    new.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(ResultStoreError, match="checksum"):
        store.load_unit(new)


def test_resume_skips_done_units_and_rejects_double_write(tmp_path):
    store = RunStore.create_or_open(tmp_path / "run", manifest())
    fill(store, ["q1", "q2"])
    again = RunStore.create_or_open(tmp_path / "run", manifest())  # created_at differs: ignored
    assert again.is_done(("q1", "bm25", 0.1)) and again.is_done(UnitKey("q2", "bm25", 0.1))
    assert not again.is_done(("q1", "bm25", 0.2)) and not again.is_done(("q1", "snapkv", 0.1))
    with pytest.raises(ResultStoreError, match="already committed"):
        again.write_unit(("q1", "bm25", 0.1), *unit_rows("q1"))
    again.write_unit(("q1", "bm25", 0.1), *unit_rows("q1", bump=1.0), replace=True)
    scores = again.consolidate()["scores"]
    assert scores.loc[(scores.record_id == "q1") & (scores.metric == "f1"), "value"].min() == 1.0


def test_reopen_with_different_manifest(tmp_path):
    fill(RunStore.create_or_open(tmp_path / "run", manifest()), ["q1"])  # committed units: a new manifest would mix
    with pytest.raises(ResultStoreError) as err:
        RunStore.create_or_open(tmp_path / "run", manifest(budget=0.2, extra=True))
    msg = str(err.value)
    assert "config.budget" in msg and "config.extra" in msg and "--force" in msg and "0.1" in msg
    forced = RunStore.create_or_open(tmp_path / "run", manifest(budget=0.2), force=True)
    assert forced.manifest["forced"][0]["keys"] == ["config.budget"]
    assert RunStore.create_or_open(tmp_path / "run", manifest(budget=0.2)).manifest["config"]["budget"] == 0.2


def test_row_validation(tmp_path):
    store = RunStore.create_or_open(tmp_path / "run", manifest())
    answers, scores, probes = unit_rows("q1")
    key = ("q1", "bm25", 0.1)
    with pytest.raises(ResultStoreError, match=r"missing \['value'\]"):
        store.write_unit(key, answers, [{k: v for k, v in r.items() if k != "value"} for r in scores], probes)
    with pytest.raises(ResultStoreError, match="unexpected"):
        store.write_unit(key, answers, [r | {"oops": 1} for r in scores], probes)
    with pytest.raises(ResultStoreError, match="record_id='q2'"):
        store.write_unit(key, answers, scores, [r | {"record_id": "q2"} for r in probes])
    with pytest.raises(ResultStoreError, match="'layer' expects int"):
        store.write_unit(key, answers, scores, [r | {"layer": 1.5} for r in probes])
    with pytest.raises(ResultStoreError, match="'answer' expects str"):
        store.write_unit(key, [r | {"answer": None} for r in answers], scores, probes)
    with pytest.raises(ResultStoreError, match="duplicate scores rows"):
        store.write_unit(key, answers, scores + scores[:1], probes)
    assert not store.is_done(key)
    store.write_unit(key, pd.DataFrame(answers), pd.DataFrame(scores), probes)  # DataFrames are accepted too
    assert store.is_done(key)


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreWriteError, match=str(blocker / "run")):
        RunStore.create_or_open(blocker / "run", manifest())


def _enospc_after_half(f, data):
    f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_leaves_nothing_partial(tmp_path):
    run = tmp_path / "run"
    store = RunStore.create_or_open(run, manifest())
    fill(store, ["q1"])
    store.consolidate()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    full = RunStore.create_or_open(run, manifest(), writer=_enospc_after_half)
    with pytest.raises(StoreWriteError) as err:
        full.write_unit(("q2", "bm25", 0.1), *unit_rows("q2"))
    assert err.value.errno == errno.ENOSPC and str(run) in str(err.value) and "disk is full" in str(err.value)
    assert not full.is_done(("q2", "bm25", 0.1))
    fill(store, ["q3"])
    with pytest.raises(StoreWriteError, match=str(run)):
        full.consolidate()
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp-")]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # old parquet files intact
    assert_tables_equal(load_tables(run), store.build_tables())  # stale marker -> rebuilt from units
    assert len(load_tables(run)["answers"]) == 4


def test_stray_temp_files_are_never_read_and_cleaned(tmp_path):
    run = tmp_path / "run"
    store = RunStore.create_or_open(run, manifest())
    fill(store, ["q1"])
    stray = run / "units" / f".tmp-{UnitKey('q2', 'bm25', 0.1).hash}.json.gz-999"
    stray.write_bytes(gzip.compress(b'{"unit": ["q2", "bm')[:20])
    assert len(store.build_tables()["answers"]) == 2 and not store.is_done(("q2", "bm25", 0.1))
    RunStore.create_or_open(run, manifest())
    assert not stray.exists()


@pytest.mark.parametrize("damage", ["truncate", "edit", "rename"])
def test_corrupt_unit_file_is_named(tmp_path, damage):
    store = RunStore.create_or_open(tmp_path / "run", manifest())
    fill(store, ["q1", "q2"])
    path = store.unit_path(("q2", "bm25", 0.1))
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "edit":
        path.write_bytes(gzip.compress(gzip.decompress(raw).replace(b"ans q2 relay", b"ans q2 RELAY")))
    else:
        path = path.rename(store.unit_path(("q3", "bm25", 0.1)))
    with pytest.raises(ResultStoreError, match="corrupt unit file") as err:
        store.consolidate()
    assert str(path) in str(err.value) and "delete it" in str(err.value)


_KILL_SCRIPT = """
import json, time
from relaylens.results.store import RunStore, UnitKey
job = json.load(open({job!r}))
def slow(f, data):
    for i in range(0, len(data), 512):
        f.write(data[i:i + 512]); f.flush(); time.sleep(0.002)
store = RunStore.create_or_open({run!r}, job["manifest"], writer=slow)
for k, rows in enumerate(job["rows"]):
    store.write_unit(UnitKey(f"q{{k}}", "bm25", 0.1), *rows)
    print(k, flush=True)
"""


def test_sigkill_mid_write_then_resume_equals_uninterrupted(tmp_path):
    run = tmp_path / "run"
    job = tmp_path / "job.json"  # the writer's rows and manifest, made here (no test module imported there)
    job.write_text(json.dumps({"manifest": manifest(), "rows": [unit_rows(f"q{k}") for k in range(1000)]}))
    script = _KILL_SCRIPT.format(job=str(job), run=str(run))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # wait until a few units are committed, then kill mid-way
            assert proc.stdout.readline(), "writer process died early"
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    store = RunStore.create_or_open(run, manifest())
    done = [k for k in range(1000) if store.is_done(("q%d" % k, "bm25", 0.1))]
    assert 3 <= len(done) < 1000
    ids = [f"q{k}" for k in range(len(done) + 3)]
    fill(store, [r for r in ids if not store.is_done((r, "bm25", 0.1))])
    clean = RunStore.create_or_open(tmp_path / "clean", manifest())
    fill(clean, ids)
    assert_tables_equal(store.consolidate(), clean.consolidate())


def test_shard_records_partition_and_stability():
    ids = [f"rec{k}" for k in range(300)]
    shards = [shard_records(ids, i, 3) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(ids)
    assert all(80 <= len(s) <= 120 for s in shards)
    assert shards[0] == [r for r in ids if r in set(shards[0])]  # input order kept
    assert shard_records(list(reversed(ids)), 1, 3) == list(reversed(shards[1]))
    # pinned: the assignment must never change between versions/machines (sha256, not Python's hash())
    assert shard_records(["e47becba", "gpt4_2655b836", "q1", "q2", "q3"], 0, 2) == ["e47becba", "gpt4_2655b836", "q1"]
    assert parse_shard("0/1") == (0, 1)
    for bad in ("2/2", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_merge_two_shards_equals_unsharded(tmp_path):
    ids = [f"q{k}" for k in range(12)]
    full = RunStore.create_or_open(tmp_path / "full", manifest())
    fill(full, ids)
    dirs = []
    for i in range(2):
        shard = RunStore.create_or_open(tmp_path / f"s{i}", manifest() | {"shard": {"index": i, "count": 2}})
        fill(shard, shard_records(ids, i, 2))
        dirs.append(shard.run_dir)
    merged = merge_runs(dirs, tmp_path / "merged")
    assert_tables_equal(merged, full.consolidate())
    assert_tables_equal(load_tables(tmp_path / "merged"), merged)
    m = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert m["shard"] is None and [d["shard"]["index"] for d in m["merged_from"]] == [0, 1]
    assert_tables_equal(merge_runs(dirs, tmp_path / "merged"), merged)  # merging again is idempotent


def test_merge_rejects_disagreeing_shards(tmp_path):
    a = RunStore.create_or_open(tmp_path / "a", manifest() | {"shard": {"index": 0, "count": 2}})
    b = RunStore.create_or_open(tmp_path / "b", manifest(seed=1) | {"shard": {"index": 1, "count": 2}})
    with pytest.raises(ResultStoreError, match=r"manifests differ in \['config.seed'\]"):
        merge_runs([a.run_dir, b.run_dir], tmp_path / "out")
    c = RunStore.create_or_open(tmp_path / "c", manifest() | {"shard": {"index": 1, "count": 2}})
    fill(a, ["q1"])
    fill(c, ["q1"], bump=0.25)
    with pytest.raises(ResultStoreError, match="differs between"):
        merge_runs([a.run_dir, c.run_dir], tmp_path / "out2")
    with pytest.raises(ResultStoreError, match="shards 1/2 are missing"):  # refused: incomplete tables (issue 14)
        merge_runs([a.run_dir], tmp_path / "out3")
    with pytest.warns(UserWarning, match="shards 1/2 are missing"):
        merge_runs([a.run_dir], tmp_path / "out3", allow_incomplete=True)


def test_open_requires_manifest(tmp_path):
    with pytest.raises(ResultStoreError, match="not a run directory"):
        load_tables(tmp_path)


def test_exported_tables_without_units_load_and_older_columns_are_filled(tmp_path):
    """A run directory holding only its parquet tables (as published under figures/), written before the stage-time
    and batch columns existed, loads with those columns filled (NaN times, one row per batch)."""
    from relaylens.results.tables import LATER_COLUMNS, example_tables

    tables = example_tables(records=3, probes=False)
    (tmp_path / "manifest.json").write_text(json.dumps({"analysis": "coordinate_ablation", "config": {}}))
    tables["answers"].drop(columns=list(LATER_COLUMNS)).to_parquet(tmp_path / "answers.parquet")
    for name in ("scores", "probes"):
        tables[name].to_parquet(tmp_path / f"{name}.parquet")  # no skipped.parquet: an optional table, read as empty
    loaded = load_tables(tmp_path)
    assert len(loaded["answers"]) == len(tables["answers"]) > 0
    assert loaded["answers"]["prefill_s"].isna().all() and loaded["answers"]["selection_s"].isna().all()
    assert (loaded["answers"]["batch_rows"] == 1).all()
    assert len(loaded["scores"]) == len(tables["scores"]) and loaded["skipped"].empty


def test_exported_table_missing_a_core_column_is_named(tmp_path):
    from relaylens.errors import RelaylensError
    from relaylens.results.tables import example_tables

    tables = example_tables(records=2, probes=False)
    (tmp_path / "manifest.json").write_text(json.dumps({"analysis": "coordinate_ablation", "config": {}}))
    tables["answers"].drop(columns=["answer"]).to_parquet(tmp_path / "answers.parquet")
    for name in ("scores", "probes"):
        tables[name].to_parquet(tmp_path / f"{name}.parquet")
    with pytest.raises(RelaylensError, match="answers.parquet lacks column 'answer'.*no units"):
        load_tables(tmp_path)
