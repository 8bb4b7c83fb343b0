"""The runner end to end through the CLI on a tiny saved model: tables, resume after SIGKILL, shards, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from relaylens.results.store import load_tables
from relaylens.results.tables import TIMING_COLUMNS

ANALYSIS = "coordinate_ablation"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny random Llama saved like a user's local model, and a small LongMemEval-format file."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("runner")
    model_dir = root / "tiny-llama"
    model, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=6, seed=3, history_tokens=800)))
    return root, model_dir, data


def _command(model_dir, data, out, *extra):
    return [sys.executable, "-m", "relaylens.cli", "run", ANALYSIS, "--model", str(model_dir), "--data", str(data),
            "--max-new-tokens", "4", "--budget", "0.4", "--out", str(out), "--limit", "6", *extra]


def _run(model_dir, data, out, *extra):
    result = subprocess.run(_command(model_dir, data, out, *extra), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _comparable(tables):
    out = {}
    for name, frame in tables.items():
        frame = frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])
        out[name] = frame.sort_values(list(frame.columns[:8])).reset_index(drop=True)
    return out


@pytest.fixture(scope="module")
def reference_run(workspace):
    root, model_dir, data = workspace
    out = root / "reference"
    result = _run(model_dir, data, out)
    return out, result


def test_run_writes_three_tables_and_prints_accuracy(reference_run):
    out, result = reference_run
    tables = load_tables(out)
    assert set(tables) == {"answers", "scores", "probes", "skipped", "geometry"}
    assert tables["skipped"].empty  # every record of the file fits
    answers = tables["answers"]
    assert len(answers) == 6 * 5  # records x conditions (one selector, one budget)
    assert set(answers.condition) == {"original", "key_only", "relay", "query_only(2048)", "common_shift(2048)"}
    assert not tables["probes"].empty and not tables["scores"].empty
    for name in ("answers.parquet", "scores.parquet", "probes.parquet", "manifest.json"):
        assert (out / name).exists()
    assert "contains" in result.stdout and "relay" in result.stdout


def test_rerun_is_deterministic_and_skips_everything(workspace, reference_run):
    root, model_dir, data = workspace
    out, _ = reference_run
    before = _comparable(load_tables(out))
    started = time.perf_counter()
    _run(model_dir, data, out)  # resume: every unit already committed
    assert time.perf_counter() - started < 60
    again = root / "again"
    _run(model_dir, data, again)
    fresh = _comparable(load_tables(again))
    for name in before:
        pd.testing.assert_frame_equal(before[name], fresh[name])


@pytest.mark.parametrize("delay", [4.0, 7.0])
def test_sigkill_then_resume_equals_uninterrupted(workspace, reference_run, delay):
    root, model_dir, data = workspace
    out = root / f"killed-{delay}"
    process = subprocess.Popen(_command(model_dir, data, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait()
    _run(model_dir, data, out)
    expected = _comparable(load_tables(reference_run[0]))
    resumed = _comparable(load_tables(out))
    for name in expected:
        pd.testing.assert_frame_equal(expected[name], resumed[name])


def test_two_shards_merged_equal_unsharded(workspace, reference_run):
    root, model_dir, data = workspace
    shards = []
    for index in range(2):
        shard_dir = root / f"shard{index}"
        _run(model_dir, data, shard_dir, "--shard", f"{index}/2")
        shards.append(shard_dir)
    merged = root / "merged"
    result = subprocess.run([sys.executable, "-m", "relaylens.cli", "merge", *map(str, shards), "--out", str(merged)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = _comparable(load_tables(reference_run[0]))
    combined = _comparable(load_tables(merged))
    for name in expected:
        pd.testing.assert_frame_equal(expected[name], combined[name])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "no_such_analysis"], "unknown analysis"),
        (["run", ANALYSIS, "--data", "/nonexistent/file.json"], "does not exist"),
        (["run", ANALYSIS, "--budget", "1.5"], "budget"),
        (["run", ANALYSIS, "--shard", "3/2"], "shard"),
        (["run", ANALYSIS, "--prompt-mode", "poem"], "prompt_mode"),
    ],
)
def test_bad_cli_arguments_give_one_clear_line(args, message):
    result = subprocess.run([sys.executable, "-m", "relaylens.cli", *args], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_run_with_an_openai_compatible_judge(workspace):
    """The judge sees question, references and candidate only; its verdicts land in the scores table."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Stub(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body["messages"][-1]["content"])
            verdict = '{"correct": true}' if len(seen) % 2 else "not json"
            reply = {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        root, model_dir, data = workspace
        out = root / "judged"
        _run(model_dir, data, out, "--limit", "2", "--judge-url", f"http://127.0.0.1:{server.server_port}/v1",
             "--judge-model", "stub-judge")
    finally:
        server.shutdown()
    scores = load_tables(out)["scores"]
    judged = scores[scores.metric == "judge"]
    failed = scores[scores.metric == "judge_failed"]
    assert len(judged) == len(failed) == 2 * 5
    assert set(failed.value) == {0.0, 1.0}, "malformed verdicts are recorded as failures"
    assert judged[failed.value.to_numpy() == 1.0].value.isna().all(), "a failed verdict never counts as correct"
    assert not any("relay" in message or "original" in message or "bm25" in message for message in seen)


def test_sequential_rows_match_the_batched_default(workspace, reference_run):
    """``--batch-rows 1`` (one row at a time) and the default (all rows of a record in one batch) agree."""
    root, model_dir, data = workspace
    out, _ = reference_run
    sequential = root / "sequential"
    _run(model_dir, data, sequential, "--batch-rows", "1")
    batched, one = load_tables(out), load_tables(sequential)
    assert set(batched["answers"].batch_rows) == {5} and set(one["answers"].batch_rows) == {1}
    assert (one["answers"][["prefill_s", "selection_s", "elapsed_s"]] > 0).all().all()
    left, right = _comparable(batched), _comparable(one)
    pd.testing.assert_frame_equal(left["answers"], right["answers"])
    pd.testing.assert_frame_equal(left["scores"], right["scores"])
    pd.testing.assert_frame_equal(left["probes"], right["probes"], check_exact=False, atol=1e-5, rtol=5e-5)


def test_bad_batch_rows_is_one_clear_line(workspace, tmp_path):
    root, model_dir, data = workspace
    result = subprocess.run(_command(model_dir, data, tmp_path / "bad", "--batch-rows", "0"), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode != 0 and "batch_rows must be a positive number" in result.stderr
    assert "Traceback" not in result.stderr
