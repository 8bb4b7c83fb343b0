"""Reliability of run directories (issue 28): consolidated tables checked against their recorded checksums and row
counts, merges that write nothing until every source is checked, merging again after `relaylens judge`, token views
carried by merges, named by unit key hash and read without trusting a damaged file."""

from __future__ import annotations

import io
import json
import random
import re
import warnings

import pytest
from support.runs import assert_tables_equal, fill, manifest, unit_rows  # tests/ is on sys.path (tests/conftest.py)

from relaylens.experiments.launch import shard_dir
from relaylens.reporting.token_view import example_view
from relaylens.results.shards import merge_run_dir, merge_runs, shard_records
from relaylens.results.store import ResultStoreError, RunStore, UnitKey, build_manifest, load_tables
from relaylens.results.views import load_views, view_path, write_view

IDS = [f"q{k}" for k in range(6)]


def _run(tmp_path, ids=IDS):
    store = RunStore.create_or_open(tmp_path / "run", manifest())
    fill(store, ids)
    return store, store.consolidate()


def _shard(run_dir, index, count, ids=IDS, **config):
    mine = shard_records(ids, index, count)
    m = build_manifest("test_analysis", {"seed": 0, "spec": {"selectors": ["bm25"], "budgets": [0.1]}, **config},
                       "tiny-llama", "deadbeef", shard=(index, count), plan={"record_ids": mine, "units": len(mine)})
    store = RunStore.create_or_open(shard_dir(run_dir, index, count), m)
    fill(store, mine)
    return store


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 4. consolidated tables are checked on load


def test_scores_parquet_with_rows_dropped_is_not_used(tmp_path):
    store, tables = _run(tmp_path)
    path = store.run_dir / "scores.parquet"
    tables["scores"].iloc[:-3].to_parquet(path, index=False)  # three rows dropped; consolidated.json untouched
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_tables(store.run_dir)
    assert_tables_equal(loaded, tables)
    assert any(re.search(r"scores\.parquet does not match the sha256 .*: the tables were rebuilt from the run's 6 "
                         "committed units", str(w.message)) for w in caught)


def test_a_marker_without_checksums_still_checks_row_counts(tmp_path):
    """consolidated.json of an older relaylens records row counts but no checksums: those are checked."""
    store, tables = _run(tmp_path)
    marker = store.run_dir / "consolidated.json"
    marker.write_text(json.dumps({k: v for k,
                                  v in json.loads(marker.read_text()).items() if k == "units" or k == "rows"}))
    assert_tables_equal(load_tables(store.run_dir), tables)
    tables["scores"].iloc[:-3].to_parquet(store.run_dir / "scores.parquet", index=False)
    with pytest.warns(UserWarning, match=r"scores\.parquet holds 21 rows; consolidated.json records 24"):
        assert_tables_equal(load_tables(store.run_dir), tables)


def test_single_bit_flips_in_probes_parquet_never_read_as_other_numbers(tmp_path):
    store, tables = _run(tmp_path)
    path = store.run_dir / "probes.parquet"
    good = path.read_bytes()
    rng = random.Random(28)
    misread = []
    for _ in range(60):
        damaged = bytearray(good)
        bit = rng.randrange(len(good) * 8)
        damaged[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(damaged))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            loaded = load_tables(store.run_dir)
        if not loaded["probes"].equals(tables["probes"]):
            misread.append(bit)
    assert not misread, f"{len(misread)} of 60 single-bit flips were read as other tables"


def test_run_without_units_refuses_a_damaged_table_naming_it(tmp_path):
    """A published run (parquet tables, no units) with consolidated.json: nothing to rebuild from, so a table that
    does not match its recorded row count is refused with the file named."""
    store, tables = _run(tmp_path)
    for unit in store.unit_paths():
        unit.unlink()
    assert_tables_equal(load_tables(store.run_dir), tables)  # intact: loads as before
    buf = io.BytesIO()
    tables["probes"].iloc[:-1].to_parquet(buf, index=False)
    (store.run_dir / "probes.parquet").write_bytes(buf.getvalue())
    with pytest.raises(ResultStoreError, match=r"probes\.parquet does not match .*no units to rebuild.*Fix"):
        load_tables(store.run_dir)


def test_rewritten_unit_makes_the_parquet_stale(tmp_path):
    """A unit rewritten in place keeps its file name: the tables must not be read from parquet written before."""
    store, _ = _run(tmp_path)
    store.write_unit(UnitKey("q0", "bm25", 0.1), *unit_rows("q0", bump=0.25), replace=True)
    assert not (store.run_dir / "consolidated.json").exists()
    assert_tables_equal(load_tables(store.run_dir), store.build_tables())


# ---------------------------------------------------------------------- 8. a refused merge writes nothing


def test_refused_merge_writes_nothing(tmp_path):
    run = tmp_path / "run"
    _shard(run, 0, 2)
    second = _shard(run, 1, 2)
    stray = shard_records(IDS, 0, 2)[-1]  # a unit of shard 0, with other results, in shard 1 too
    second.write_unit(UnitKey(stray, "bm25", 0.1), *unit_rows(stray, bump=0.5))
    out = tmp_path / "merged"
    with pytest.raises(ResultStoreError, match="differs between"):
        merge_runs([shard_dir(run, 0, 2), shard_dir(run, 1, 2)], out)
    assert not out.exists(), "a refused merge must not start the merged run directory"
    before = _snapshot(run)
    with pytest.raises(ResultStoreError):
        merge_run_dir(run)
    assert _snapshot(run) == before, "merge_run_dir wrote into RUN_DIR before refusing"


def test_merge_with_a_damaged_unit_writes_nothing(tmp_path):
    run = tmp_path / "run"
    _shard(run, 0, 2)
    second = _shard(run, 1, 2)
    last = second.unit_paths()[-1]
    last.write_bytes(last.read_bytes()[:-8])
    before = _snapshot(run)
    with pytest.raises(ResultStoreError, match="corrupt unit file"):
        merge_run_dir(run)
    assert _snapshot(run) == before


# -------------------------------------------------------------- 9. merging again after `relaylens judge`


def test_merge_again_after_judge_keeps_the_judge_scores(tmp_path):
    """`relaylens merge RUN_DIR` after `relaylens judge RUN_DIR` (a re-run sweep resumes and merges): the merged
    units carry the judge's rows, the shards do not; nothing else differs, so the merge keeps them."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.rejudge import rejudge_run

    records = generate_records(n=4, seed=3, history_tokens=800)
    data = tmp_path / "records.json"
    data.write_text(json.dumps(records))
    ids = [r["question_id"] for r in records]
    run = tmp_path / "run"
    for index in range(2):
        mine = shard_records(ids, index, 2)
        m = build_manifest("test_analysis", {"seed": 0, "spec": {"selectors": ["bm25"], "budgets": [0.1]}},
                           "tiny-llama", "deadbeef", data, shard=(index, 2), plan={"record_ids": mine, "units": 2})
        fill(RunStore.create_or_open(shard_dir(run, index, 2), m), mine)
    merge_run_dir(run)

    class Stub:
        model_id = "stub"

        def complete(self, system, user):
            return '{"correct": true}'

    rejudge_run(run, Stub(), "stub")
    judged = load_tables(run)
    assert (judged["scores"].metric == "judge_stub").sum() == len(judged["answers"]) > 0
    merge_run_dir(run)
    assert_tables_equal(load_tables(run), judged)


# -------------------------------------------------------------------------- 10, 11. token views


def test_merge_carries_the_shards_token_views(tmp_path):
    run = tmp_path / "run"
    for index in range(2):
        shard = _shard(run, index, 2)
        rid = shard_records(IDS, index, 2)[0]
        write_view(shard.run_dir, example_view() | {"record_id": rid, "order": 0})
    merge_run_dir(run)
    assert (sorted(v["record_id"] for v in load_views(run, None))
            == sorted(shard_records(IDS, i, 2)[0] for i in range(2)))


@pytest.mark.parametrize("ids", [["q" * 300], ["q 1", "q?1"]], ids=["300-characters", "same-sanitised-name"])
def test_views_are_named_by_unit_key_hash(tmp_path, ids):
    for order, rid in enumerate(ids):
        path = write_view(tmp_path, example_view() | {"record_id": rid, "order": order})
        assert path.name == f"{UnitKey(rid, 'bm25', 0.1).hash}.json"
    assert [v["record_id"] for v in load_views(tmp_path, None)] == ids
    assert not [p for p in (tmp_path / "views").iterdir() if "tmp" in p.name]


@pytest.mark.parametrize("damage", ["not-json", "missing-field", "wrong-shape"])
def test_a_damaged_view_is_skipped_with_a_warning_naming_it(tmp_path, damage):
    for order, rid in enumerate(("a", "b")):
        write_view(tmp_path, example_view() | {"record_id": rid, "order": order})
    path = view_path(tmp_path, {"record_id": "a", "selector": "bm25", "budget": 0.1})
    view = json.loads(path.read_text())
    if damage == "not-json":
        path.write_text(path.read_text()[:50])
    elif damage == "missing-field":
        path.write_text(json.dumps({k: v for k, v in view.items() if k != "kept"}))
    else:
        path.write_text(json.dumps(view | {"attention": {"original": [[0.1]]}}))
    with pytest.warns(UserWarning, match=f"token view {path}.*damaged.*Fix"):
        assert [v["record_id"] for v in load_views(tmp_path, None)] == ["b"]


def test_report_renders_past_a_damaged_view(tmp_path):
    from typer.testing import CliRunner

    from relaylens.cli import app

    store, _ = _run(tmp_path)
    write_view(store.run_dir, example_view() | {"record_id": "q0"})
    write_view(store.run_dir, example_view() | {"record_id": "q1", "order": 1})
    view_path(store.run_dir, {"record_id": "q0", "selector": "bm25", "budget": 0.1}).write_text('{"record_id": "q0"}')
    result = CliRunner().invoke(app, ["report", str(store.run_dir)])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "damaged" in result.stderr
    html = (store.run_dir / "report.html").read_text()
    assert '"record_id":"q1"' in html and 'id="token-view"' in html
