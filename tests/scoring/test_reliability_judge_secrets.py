"""Round 5 (issue 52, item 4): a judge key is redacted in every form it can travel in -- raw, percent-encoded (either
case, or twice), form-encoded, JSON-escaped, HTML character references, the base64url alphabet and without its ``=``
padding -- in messages, the verdict cache and ``judge_<name>_failures.json``; a judge URL with a space or a control
character is refused up front in one redacted line (no traceback, no key)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.scoring.judge import Judge, JudgeBackendError, OpenAIBackend

KEY = "Ab3/x+Yz9/Q+wv7=="  # a base64 key: '/', '+' and '=' change under every encoding
RECORD = {"record_id": "q1", "question": "What is my dog called?", "answers": ["Biscuit"]}


def completion(content: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


@contextmanager
def serve(respond):
    """A local endpoint whose every POST is answered by ``respond(handler)``; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            respond(self)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def send(handler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _forms(key: str) -> dict[str, str]:
    """Every form an endpoint may echo the key in."""
    quoted = urllib.parse.quote(key, safe="")
    return {"raw": key, "percent": quoted, "percent-lower": quoted.lower(), "form": urllib.parse.quote_plus(key),
            "twice": urllib.parse.quote(quoted, safe=""), "json-slash": key.replace("/", "\\/"),
            "json-unicode": "".join(f"\\u{ord(c):04x}" if c in "/+=" else c for c in key),
            "html": "".join(f"&#x{ord(c):x};" if c in "/+=" else c for c in key),
            "base64url": key.replace("+", "-").replace("/", "_"), "unpadded": key.rstrip("="),
            "base64url-unpadded": key.replace("+", "-").replace("/", "_").rstrip("=")}


def _leaks(text: str) -> list[str]:
    core = KEY.rstrip("=")
    parts = [core[:3], core[4:5] + core[6:9], core[10:]]  # the key's alphanumeric runs, whatever the separators
    return [p for p in parts if p in text]


@pytest.mark.parametrize("form", list(_forms(KEY)))
def test_a_key_echoed_in_any_encoding_is_redacted_in_replies_and_the_cache(monkeypatch, tmp_path, form):
    echo = _forms(KEY)[form]
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with serve(lambda h: send(h, 200, completion(f"your key is {echo} ok"))) as (url, _):
        backend = OpenAIBackend(url, "m", api_key_env="JUDGE_KEY")
        cache = tmp_path / "judge_cache.jsonl"
        verdict = Judge(backend, cache_path=cache).judge(RECORD, "Biscuit")
        again = Judge(backend, cache_path=cache).judge(RECORD, "Biscuit")
    assert again.cached
    for text in (verdict.raw, verdict.error, again.raw, cache.read_text()):
        assert not _leaks(text) and "***" in text, (form, text)
    assert verdict.raw == "your key is *** ok"


@pytest.mark.parametrize("form", ["percent", "json-unicode", "base64url-unpadded"])
def test_a_key_echoed_encoded_in_an_error_body_is_redacted_in_the_message(monkeypatch, form):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    body = json.dumps({"error": f"bad key {_forms(KEY)[form]}"}).encode()
    with serve(lambda h: send(h, 401, body)) as (url, _):
        with pytest.raises(JudgeBackendError) as err:
            OpenAIBackend(url, "m", api_key_env="JUDGE_KEY", retries=0).complete("s", "u")
    assert not _leaks(str(err.value)) and "***" in str(err.value), str(err.value)


def test_a_query_secret_echoed_percent_encoded_is_redacted(tmp_path):
    secret = "q/s+cr3t=="
    with serve(lambda h: send(h, 200, completion(urllib.parse.quote(secret, safe="")))) as (url, _):
        raw = OpenAIBackend(f"{url}?api-key={urllib.parse.quote(secret, safe='')}", "m").complete("s", "u")
    assert raw == "***"


@pytest.mark.parametrize("bad", [" ", "\t", "\n", "\x00", "\x7f", "\u200b"])
def test_a_judge_url_with_a_space_or_control_character_is_refused_in_one_redacted_line(monkeypatch, bad):
    """Before: the URL passed every check and ended in a traceback (http.client.InvalidURL) quoting it, key and all."""
    monkeypatch.setenv("JUDGE_KEY", KEY)
    url = f"http://127.0.0.1:9/v1{bad}x?key={urllib.parse.quote(KEY, safe='')}"
    with pytest.raises(JudgeBackendError, match="judge URL .* refuses it before any request. Fix:") as err:
        OpenAIBackend(url, "m", api_key_env="JUDGE_KEY")
    message = str(err.value)
    assert "\n" not in message and not _leaks(message) and "key=***" in message, message


def test_a_key_with_a_line_break_is_refused_without_showing_it(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY + "\nX-Injected: 1")
    with pytest.raises(JudgeBackendError, match="JUDGE_KEY holds a space, line break or control character") as err:
        OpenAIBackend("http://127.0.0.1:9/v1", "m", api_key_env="JUDGE_KEY")
    assert not _leaks(str(err.value))


def test_the_judge_command_refuses_a_bad_url_first_in_one_line(tmp_path):
    url = f"http://127.0.0.1:9/v1 x?key={urllib.parse.quote(KEY, safe='')}"
    result = CliRunner().invoke(app, ["judge", str(tmp_path / "no-run"), "--judge-url", url, "--judge-model", "m",
                                      "--judge-key-env", "JUDGE_KEY"],
                                env={"COLUMNS": "400", "JUDGE_KEY": KEY})
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "judge URL" in text and "a space (U+0020)" in text and "Traceback" not in text, text
    assert not _leaks(text), text


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished two-record run on the tiny model (its answers are what the judge is asked about)."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("secret-judge")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())
    return run_analysis(spec, RunConfig(model="tiny", data=str(data), limit=2, out=str(root / "run")),
                        progress=False, model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))


def test_relaylens_judge_never_writes_or_prints_an_encoded_key(finished_run):
    """End to end: an endpoint echoing the key percent-encoded; the printed failures, the verdict cache and
    ``judge_<name>_failures.json`` hold ``***`` only."""
    echo = urllib.parse.quote(KEY, safe="")
    with serve(lambda h: send(h, 200, completion(f"not a verdict: {echo}"))) as (url, _):
        result = CliRunner().invoke(app, ["judge", str(finished_run), "--judge-url", url, "--judge-model", "m",
                                          "--judge-key-env", "JUDGE_KEY", "--name", "loc"],
                                    env={"COLUMNS": "400", "JUDGE_KEY": KEY})
    assert result.exit_code == 0, result.output
    texts = {"output": result.output, "cache": (finished_run / "judge_cache_loc.jsonl").read_text(),
             "failures": (finished_run / "judge_loc_failures.json").read_text()}
    for where, text in texts.items():
        assert "***" in text and not _leaks(text), (where, text)
