"""Reliability of run directories (issue 14): data loss, concurrent writers, provenance on resume, merge completeness.

Runs use the tiny random Llama and tokenizer (``relaylens.testing``) in process, except where a second real process
is the point (the concurrent-writer case and the edited-source case start the real CLI).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relaylens.results.store import ResultStoreError, RunStore, UnitKey, load_tables

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A tiny model directory, its (model, tokenizer) and a 4-record LongMemEval-schema file."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("store")
    model, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    model.save_pretrained(root / "tiny-llama")
    tokenizer.save_pretrained(root / "tiny-llama")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=4, seed=3, history_tokens=800)))
    return {"root": root, "model_dir": root / "tiny-llama", "model": model, "tokenizer": tokenizer, "data": data}


def _spec():
    from relaylens.experiments.specs import load_analysis

    return load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())


def _run(ws, out, model_and_tokenizer=None, **config):
    from relaylens.experiments.runner import RunConfig, run_analysis

    config = {"model": str(ws["model_dir"]), "data": str(ws["data"]), "limit": 2, "out": str(out), **config}
    return run_analysis(_spec(), RunConfig(**config), progress=False,
                        model_and_tokenizer=model_and_tokenizer or (ws["model"], ws["tokenizer"]))


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "relaylens.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**ENV, **(env or {})}, cwd=cwd)


def _error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


# ------------------------------------------------------------------------------------------ 1. data loss


@pytest.mark.parametrize("contents", ["foreign-temp-file", "foreign-temp-folder", "unit-like-temp-of-another-tool"])
def test_existing_foreign_directory_is_refused_and_untouched(tmp_path, contents):
    """``--out`` on a directory that is not a relaylens run: refused before anything in it is deleted."""
    out = tmp_path / "mine"
    (out / "units").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    if contents == "foreign-temp-file":
        (out / ".tmp-x").write_text("an editor's swap file")
    elif contents == "foreign-temp-folder":
        (out / ".tmp-x").mkdir()
        (out / ".tmp-x" / "keep.txt").write_text("keep")
    else:
        (out / "units" / ".tmp-draft.json.gz-1").write_text("someone's draft")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ResultStoreError, match=r"not empty and is not a relaylens run directory.*notes.txt.*Fix"):
        RunStore.create_or_open(out, {"analysis": "demo", "config": {}})
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_temp_folder_inside_a_run_is_left_alone(tmp_path):
    """A folder named ``.tmp-x`` inside a real run: re-opening neither deletes nor trips over it."""
    out = tmp_path / "run"
    RunStore.create_or_open(out, {"analysis": "demo", "config": {}})
    (out / ".tmp-x").mkdir()
    (out / "units" / ".tmp-y").mkdir()
    (out / ".tmp-notes").write_text("not ours")
    own = out / "units" / f".tmp-{UnitKey('q1', 's', 0.1).hash}.json.gz-4242"
    own.write_bytes(b"torn unit of a killed run")
    RunStore.create_or_open(out, {"analysis": "demo", "config": {}})
    assert (out / ".tmp-x").is_dir() and (out / "units" / ".tmp-y").is_dir() and (out / ".tmp-notes").exists()
    assert not own.exists()  # relaylens's own temp names are still cleaned


@pytest.mark.parametrize("force", [False, True])
def test_foreign_manifest_is_never_overwritten(tmp_path, force):
    out = tmp_path / "other"
    out.mkdir()
    foreign = json.dumps({"name": "another tool's manifest", "files": ["a", "b"]})
    (out / "manifest.json").write_text(foreign)
    with pytest.raises(ResultStoreError, match="not a relaylens run manifest.*even with --force"):
        RunStore.create_or_open(out, {"analysis": "demo", "config": {}}, force=force)
    assert (out / "manifest.json").read_text() == foreign


def test_cli_run_into_foreign_directory_exits_2(ws, tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8")
    (out / ".tmp-x").write_text("x")
    result = _cli("run", "ordering", "--model", ws["model_dir"], "--data", ws["data"], "--limit", "1",
                  "--max-new-tokens", "2", "--out", out)
    assert result.returncode == 2
    line = _error_line(result.stderr)
    assert str(out) in line and "holiday.jpg" in line and "--out" in line
    assert sorted(p.name for p in out.iterdir()) == [".tmp-x", "holiday.jpg"]


# ---------------------------------------------------------------------------------------- 3. concurrent writers


def test_second_run_on_the_same_out_is_refused_naming_the_holder(ws, tmp_path):
    """A second real ``relaylens run`` while the first is mid-run (stopped with SIGSTOP after its manifest): the
    second exits 2 naming the first's pid, and the first's temp file survives."""
    out = tmp_path / "run"
    args = ["run", "ordering", "--model", ws["model_dir"], "--data", ws["data"], "--limit", "4", "--budget", "0.4",
            "--max-new-tokens", "8", "--out", out]
    first = subprocess.Popen([sys.executable, "-m", "relaylens.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 240
        while not (out / "manifest.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended before its manifest"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGSTOP)
        temp = out / "units" / f".tmp-{UnitKey('x', 'snapkv', 0.4).hash}.json.gz-{first.pid}"
        temp.write_bytes(b"half a unit, being written")
        second = _cli(*args)
        assert second.returncode == 2, second.stderr[-2000:]
        line = _error_line(second.stderr)
        assert f"pid {first.pid}" in line and "relaylens run" in line and "in use" in line and "--out" in line
        assert "replace=True" not in second.stderr
        assert temp.read_bytes() == b"half a unit, being written"
    finally:
        first.kill()
        first.wait()


def test_every_writer_takes_the_lock(ws, tmp_path):
    from relaylens.results.locks import RunLockedError, run_lock
    from relaylens.results.shards import merge_runs

    run_dir = _run(ws, tmp_path / "run", limit=1)
    merged = tmp_path / "merged"
    merged.mkdir()
    with run_lock(run_dir, "report"):
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}.*relaylens report"):
            _run(ws, run_dir, limit=1)
    with run_lock(merged, "run"):
        with pytest.raises(RunLockedError, match="in use"):
            merge_runs([run_dir], merged)
    from relaylens.experiments.rejudge import rejudge_run

    class NeverCalled:
        model_id = "never-called"

        def complete(self, system, user):
            raise AssertionError("the judge must not run while another process writes the run")

    with run_lock(run_dir, "figures"):
        with pytest.raises(RunLockedError, match="relaylens figures"):
            rejudge_run(run_dir, NeverCalled(), "locked")
    assert not (run_dir / ".relaylens.lock").exists()  # released and removed


# ------------------------------------------------------------------------------------- 9. provenance on resume


def _swapped_tokenizer(ws):
    import copy

    tok = copy.deepcopy(ws["tokenizer"])
    tok.chat_template = tok.chat_template.replace("assistant", "model")
    return ws["model"], tok


def _edited_config(ws):
    from relaylens.testing import tiny_model

    model = tiny_model("llama", seed=0)
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_theta": 123456.0}
    return model, ws["tokenizer"]


@pytest.mark.parametrize(("change", "key"), [(_swapped_tokenizer, "model.tokenizer_sha256"),
                                            (_edited_config, "model.config_sha256")],
                         ids=["swapped-tokenizer", "edited-config-rope-theta"])
def test_resume_refuses_a_changed_model_besides_its_weights(ws, tmp_path, change, key):
    from relaylens.model.loading import model_fingerprint

    out = _run(ws, tmp_path / "run")
    changed = change(ws)
    assert model_fingerprint(changed[0]) == model_fingerprint(ws["model"])  # same weights: only the new keys see it
    with pytest.raises(ResultStoreError, match=rf"different manifest.*{key}.*--force"):
        _run(ws, out, model_and_tokenizer=changed)
    forced = _run(ws, out, model_and_tokenizer=changed, force=True)
    manifest = json.loads((forced / "manifest.json").read_text())
    assert key in manifest["forced"][-1]["keys"]


def test_resume_refuses_changed_relaylens_source(ws, tmp_path):
    """The real CLI from a copy of the package: after editing one source file, resuming is refused."""
    code = tmp_path / "code"
    shutil.copytree(Path(__file__).resolve().parents[2] / "relaylens", code / "relaylens",  # relaylens/analyses/ too
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(code)}
    args = ["run", "ordering", "--model", ws["model_dir"], "--data", ws["data"], "--limit", "1", "--budget", "0.4",
            "--max-new-tokens", "2", "--out", tmp_path / "run"]
    first = _cli(*args, env=env, cwd=code)  # cwd: ``python -m`` puts it first on sys.path
    assert first.returncode == 0, first.stderr[-2000:]
    source = json.loads((tmp_path / "run" / "manifest.json").read_text())["source"]
    assert source["source_sha256"] and source["commit"] is None  # the copy is no git checkout: the hash decides
    scoring = code / "relaylens" / "scoring" / "metrics.py"
    scoring.write_text(scoring.read_text() + "\n# a local edit that could change scores\n")
    again = _cli(*args, env=env, cwd=code)
    assert again.returncode == 2, again.stderr[-2000:]
    assert "source.source_sha256" in _error_line(again.stderr)


def test_same_data_and_model_at_another_path_resume(ws, tmp_path, monkeypatch):
    """A relative path to the same data/model is the same run (content hashes decide, not path strings)."""
    out = _run(ws, tmp_path / "run")
    monkeypatch.chdir(ws["root"])
    again = _run(ws, out, data="records.json", model="tiny-llama")
    assert len(load_tables(again)["answers"]) == len(load_tables(out)["answers"])


def test_judge_error_after_start_does_not_block_the_corrected_rerun(ws, tmp_path, monkeypatch):
    monkeypatch.delenv("RELAYLENS_NO_SUCH_KEY", raising=False)
    out = tmp_path / "run"
    with pytest.raises(Exception, match="RELAYLENS_NO_SUCH_KEY is not set"):
        _run(ws, out, judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_key_env="RELAYLENS_NO_SUCH_KEY")
    assert len(load_tables(_run(ws, out))["answers"]) > 0  # the corrected command (no judge) runs


# ------------------------------------------------------------------------------------------ 10. merge completeness


@pytest.fixture(scope="module")
def shards(ws, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    data_b = root / "mount-b" / "records.json"  # shard 1 ran on a machine that mounts the data elsewhere
    data_b.parent.mkdir()
    shutil.copy(ws["data"], data_b)
    return {"0/2": _run(ws, root / "s0", limit=4, shard="0/2"), "1/2": _run(ws, root / "s1", limit=4, shard="1/2",
                                                                         data=str(data_b)),
            "1/3": _run(ws, root / "t1", limit=4, shard="1/3"), "full": _run(ws, root / "full", limit=4)}


def test_merge_of_shards_from_different_mounts_equals_the_full_run(shards, tmp_path):
    from relaylens.results.shards import merge_runs

    merged = merge_runs([shards["0/2"], shards["1/2"]], tmp_path / "merged")
    full = load_tables(shards["full"])
    for name in ("answers", "scores"):
        drop = ["elapsed_s", "prefill_s", "selection_s", "batch_rows"] if name == "answers" else []
        assert merged[name].drop(columns=drop).equals(full[name].drop(columns=drop))


def test_merge_refuses_shards_of_different_splits(shards, tmp_path):
    from relaylens.results.shards import merge_runs

    with pytest.raises(ResultStoreError, match=r"different splits \(shards 0/2, 1/3\).*--allow-incomplete"):
        merge_runs([shards["0/2"], shards["1/3"]], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_merge_refuses_a_shard_missing_a_unit_and_names_it(shards, tmp_path):
    from relaylens.results.shards import merge_runs

    copy = tmp_path / "s1-copy"
    shutil.copytree(shards["1/2"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    record = manifest["plan"]["record_ids"][0]
    RunStore.open(copy).unit_path(UnitKey(record, "snapkv", 0.4)).unlink()
    with pytest.raises(ResultStoreError, match=rf"lacks 1 of its \d+ units \({record}/snapkv@0.4\)"):
        merge_runs([shards["0/2"], copy], tmp_path / "merged")
    with pytest.raises(ResultStoreError, match="shards 1/2 are missing"):
        merge_runs([shards["0/2"]], tmp_path / "merged")
    result = _cli("merge", shards["0/2"], copy, "--out", tmp_path / "merged", "--allow-incomplete")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning:" in result.stderr and f"{record}/snapkv@0.4" in result.stderr
    assert json.loads((tmp_path / "merged" / "manifest.json").read_text())["incomplete"]


# ------------------------------------------------------------------------------------------ 17. store odds and ends


def test_deleted_parquet_with_marker_intact_is_rebuilt(ws, tmp_path):
    out = _run(ws, tmp_path / "run", limit=1)
    before = load_tables(out)
    (out / "scores.parquet").unlink()
    assert (out / "consolidated.json").exists()
    after = load_tables(out)
    assert after["scores"].equals(before["scores"])


def test_utf8_byte_order_mark_is_read(ws, tmp_path):
    from relaylens.datasets import load_records

    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + ws["data"].read_bytes())
    assert [r.record_id for r in load_records(path)] == [r.record_id for r in load_records(ws["data"])]


def test_lenient_load_skips_an_infinite_end_index(tmp_path):
    """PersonaMem ``end_index`` of ``inf`` used to raise OverflowError through ``lenient=True``."""
    import pandas as pd

    from relaylens.datasets import load_records_with_report

    fixtures = Path(__file__).parents[1] / "fixtures"
    frame = pd.read_csv(fixtures / "questions_32k.csv", dtype=str, keep_default_na=False)
    frame.loc[0, "end_index_in_shared_context"] = "inf"
    frame.to_csv(tmp_path / "questions_32k.csv", index=False)
    shutil.copy(fixtures / "shared_contexts_32k.jsonl", tmp_path)
    with pytest.warns(UserWarning, match="skipped 1"):
        records, report = load_records_with_report(tmp_path / "questions_32k.csv", lenient=True)
    assert len(records) == len(frame) - 1 and "end_index_in_shared_context" in report.skipped[0][1]
