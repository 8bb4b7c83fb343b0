"""What the commands print and record when the dataset and the judge endpoint are hostile: record ids with ANSI /
OSC escapes, newlines and rich markup reach the terminal as visible escapes (progress bar, skipped summary, judge
failure list, warnings); an API key echoed by the judge reaches no output, list or cache; ``judge --name`` with a
trailing newline is refused; a summarization run's judge names the metrics it wrote; an unset ``--judge-key-env`` is
explained in command-line terms; warnings are one line without a source path; the manifest names the preset."""

from __future__ import annotations

import json
import os
import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from support.checklist_shared import short_sample
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.errors import shown

KEY = "sk-live-0123456789abcdef"
HOSTILE_IDS = ["r0\x1b[2J\x1b]0;pwned\x07", "r1\nerror: forged [link=http://x]y[/link]"]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@contextmanager
def judge_server(content):
    """A chat-completions stub answering ``content(request_json)`` for every POST."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps({"choices": [{"message": {"content": content(body)}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def echo_key(body) -> str:
    return f"not json \x1b]0;title\x07 and the key {KEY}\nerror: forged"


def invoke(args, **env):
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


RAW = ["\x1b[2J", "\x1b]0;", "\x07", "\x1b[31m", "\nerror: forged"]  # the hostile sequences, unescaped


def assert_clean(text: str) -> None:
    """No key, and no hostile sequence reaches ``text`` raw (libraries' own progress bars may still use ``\\r``)."""
    assert KEY not in text, "the API key reached the output"
    for raw in RAW:
        assert raw not in text, f"{raw!r} reached the terminal raw"
    assert not any(line.lstrip().startswith("error: forged") for line in re.split(r"[\r\n]", text)), text


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from relaylens.testing import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, model_dir):
    """``relaylens run`` on records with hostile ids, judged inline by a key-echoing endpoint."""
    from relaylens.datasets.synthetic import generate_records

    root = tmp_path_factory.mktemp("hostile")
    records = generate_records(n=2, seed=3, history_tokens=800)
    for record, rid in zip(records, HOSTILE_IDS):
        record["question_id"] = rid
    data = root / "records.json"
    data.write_text(json.dumps(records))
    out = root / "run"
    with judge_server(echo_key) as url:
        result = invoke(["run", "ordering", "--model", str(model_dir), "--data", str(data), "--budget", "0.4",
                         "--max-new-tokens", "2", "--out", str(out), "--judge-url", url, "--judge-model", "m",
                         "--judge-key-env", "RELAYLENS_TEST_KEY"], RELAYLENS_TEST_KEY=KEY)
    assert result.exit_code == 0, result.output
    return out, data, result


def test_run_output_shows_hostile_ids_as_escapes(hostile_run):
    out, _, result = hostile_run
    assert_clean(result.output)
    assert_clean(result.stderr)
    assert shown(HOSTILE_IDS[1]) in result.output, "the progress bar names the record, escaped"
    assert "[link=http://x]" in result.output, "rich markup in a record id is printed, not interpreted"


def test_inline_judge_cache_never_holds_the_key(hostile_run):
    out, _, _ = hostile_run
    cache = (out / "judge_cache.jsonl").read_text()
    assert cache and KEY not in cache and "***" in cache


def test_judge_command_redacts_the_key_and_escapes_the_failure_list(hostile_run):
    out, _, _ = hostile_run
    with judge_server(echo_key) as url:
        result = invoke(["judge", str(out), "--judge-url", url, "--judge-model", "m", "--judge-key-env",
                         "RELAYLENS_TEST_KEY", "--name", "echo"], RELAYLENS_TEST_KEY=KEY)
    assert result.exit_code == 0, result.output
    assert_clean(result.output)
    failed = [line for line in result.output.splitlines() if line.startswith("  failed: ")]
    assert len(failed) == len(pd.read_parquet(out / "answers.parquet")), result.output
    assert all(shown(rid) in result.output for rid in HOSTILE_IDS)
    for name in ("judge_echo_failures.json", "judge_cache_echo.jsonl", "judges.json"):
        text = (out / name).read_text()
        assert KEY not in text, name
    assert "scores judge_echo, judge_echo_failed" in result.stderr
    assert_clean(result.stderr)


def test_skipped_summary_is_one_escaped_line_per_record():
    from relaylens.experiments.summary import skipped_summary

    skipped = pd.DataFrame({"record_id": HOSTILE_IDS, "selector": ["bm25"] * 2, "budget": [0.1] * 2,
                            "reason": ["too_long", "too\x1b[31m_long"], "history_length": [9, 9],
                            "detail": [f"record {rid}: too long" for rid in HOSTILE_IDS]})
    text = skipped_summary({"skipped": skipped})
    assert len(text.splitlines()) == 1 + len(HOSTILE_IDS)
    assert_clean(text)


def test_progress_stage_is_plain_text():
    import io

    from rich.console import Console

    from relaylens.experiments.walk import advance_bar
    from relaylens.progress import progress_view

    sink = io.StringIO()
    view = progress_view(Console(file=sink, force_terminal=False, width=300))
    with view:
        task = view.add_task("demo", total=2, stage="")
        for rid in HOSTILE_IDS:
            advance_bar(view, task, 1, rid, "committed")
    text = sink.getvalue()
    assert_clean(text)
    assert "[link=http://x]y[/link]" in text


@pytest.mark.parametrize("name", ["y\n", "y\r", "Bad", "_x", "x-y", "", "y\x1b[2J"])
def test_judge_name_must_be_the_whole_name(hostile_run, name):
    from relaylens.errors import RelaylensError
    from relaylens.experiments.rejudge import check_judge_name

    with pytest.raises(RelaylensError, match="judge name"):
        check_judge_name(name)
    out, _, _ = hostile_run
    result = invoke(["judge", str(out), "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--name", name])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "--name" in errors[0], result.stderr
    assert not CONTROL.search(result.stderr)
    assert not (out / f"judge_{name}_failures.json").exists()


@pytest.mark.parametrize("command", ["judge", "run"])
def test_unset_key_variable_is_explained_in_command_line_terms(hostile_run, model_dir, command):
    out, data, _ = hostile_run
    args = (["judge", str(out)] if command == "judge" else
            ["run", "ordering", "--model", str(model_dir), "--data", str(data), "--out", str(out.parent / "unused")])
    env = {k: v for k, v in os.environ.items() if k != "RELAYLENS_UNSET_KEY"}
    result = CliRunner().invoke(app, [*args, "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m",
                                      "--judge-key-env", "RELAYLENS_UNSET_KEY"], env={**env, "COLUMNS": "200"})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.stderr
    assert "--judge-key-env RELAYLENS_UNSET_KEY" in errors[0] and "export RELAYLENS_UNSET_KEY=" in errors[0]
    assert "api_key_env" not in errors[0], "no Python-API advice on the command line"
    assert not (out.parent / "unused").exists()


@pytest.fixture(scope="module")
def summary_run(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("summaries")
    data = root / "summaries.jsonl"
    short_sample(data, n=2, words=60)
    out = root / "run"
    result = invoke(["run", "summarization", "--model", str(model_dir), "--data", str(data), "--budget", "0.5",
                     "--max-new-tokens", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_summarization_judge_names_the_metrics_it_wrote_and_warns_in_one_line(summary_run):
    def checklist_reply(body):
        payload = json.loads(body["messages"][1]["content"].split("\n\n", 1)[1])
        return json.dumps([{"checklist_id": q["checklist_id"], "evaluation_score": 1} for q in payload["checklists"]])

    with judge_server(checklist_reply) as url:
        result = invoke(["judge", str(summary_run), "--judge-url", url, "--judge-model", "m", "--name", "sj"])
    assert result.exit_code == 0, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "quality_sj" in last and "coverage_sj" in last and "judge_sj" not in last, last
    judges = json.loads((summary_run / "judges.json").read_text())["sj"]
    assert judges["metric"] == "quality_sj" and "judge_sj" not in judges["metrics"]
    scores = pd.read_parquet(summary_run / "scores.parquet")
    assert set(judges["metrics"]) == {m for m in scores.metric.unique() if m.endswith("_sj")}
    warnings = [line for line in result.stderr.splitlines() if "cut off" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: "), result.stderr
    assert "UserWarning" not in result.stderr and "rejudge.py" not in result.stderr


def test_manifest_names_the_preset(tmp_path, model_dir):
    from relaylens.experiments.presets import apply_preset
    from relaylens.experiments.specs import load_analysis

    module = load_analysis("ordering")
    assert apply_preset(module, "paper").preset == "paper"
    assert "preset" not in apply_preset(module, None).to_dict(), "manifests without a preset stay as they were"
    result = invoke(["run", "ordering", "--preset", "paper", "--model", str(model_dir), "--data", "sample",
                     "--limit", "1", "--budget", "0.4", "--max-new-tokens", "1", "--condition", "relay",
                     "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["spec"]["preset"] == "paper"
