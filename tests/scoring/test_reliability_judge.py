"""The judge's HTTP client against hostile endpoints (local ``http.server`` stubs on 127.0.0.1): redirects to
another origin are refused and the key never leaves for it; a key echoed in a 200 reply is redacted wherever the
reply lands; a trickling server is cut at the wall-clock deadline; an oversized reply is refused unread."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from relaylens.scoring.checklist import ChecklistJudge
from relaylens.scoring.judge import DEADLINE_S, MAX_REPLY_BYTES, Judge, JudgeBackendError, OpenAIBackend

KEY = "sk-test-0123456789abcdef"
RECORD = {"record_id": "q1", "question": "What is my dog called?", "answers": ["Biscuit"]}


def completion(content: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


@contextmanager
def serve(respond):
    """A local server whose every request (GET or POST) is answered by ``respond(handler)``; yields (url, seen)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self):
            length = int(self.headers.get("Content-Length") or 0)
            seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                         "body": self.rfile.read(length) if length else b""})
            try:
                respond(self)
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_POST = do_GET = _any

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def send(handler, status: int, body: bytes, headers: dict | None = None) -> None:
    handler.send_response(status)
    for k, v in (headers or {"Content-Type": "application/json"}).items():
        handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target", ["other_port", "other_host_name"])
def test_redirect_to_another_origin_is_refused_and_the_key_stays_home(monkeypatch, status, target):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with serve(lambda h: send(h, 200, completion('{"correct": true}'))) as (evil_url, evil_seen):
        evil = evil_url if target == "other_port" else evil_url.replace("127.0.0.1", "localhost")
        location = evil + "/chat/completions?token=leaked-secret"
        with serve(lambda h: send(h, status, b"moved", {"Location": location})) as (url, seen):
            backend = OpenAIBackend(url, "m", api_key_env="JUDGE_KEY", retries=2, backoff=0.01)
            with pytest.raises(JudgeBackendError, match=f"HTTP {status}, a redirect to .*never follows") as err:
                Judge(backend).judge(RECORD, "Biscuit")
    assert evil_seen == [], "nothing reaches the other origin: neither the request nor the key"
    assert len(seen) == 1 and seen[0]["auth"] == f"Bearer {KEY}", "a redirect is not retried"
    assert KEY not in str(err.value) and "leaked-secret" not in str(err.value) and "Fix:" in str(err.value)


def test_same_origin_redirect_is_refused_too(monkeypatch):
    """A redirect is never followed (urllib would turn the POST into a bodiless GET that keeps the key)."""
    with serve(lambda h: send(h, 302, b"", {"Location": "/v2/chat/completions"})) as (url, seen):
        with pytest.raises(JudgeBackendError, match="redirect to /v2/chat/completions"):
            OpenAIBackend(url, "m", retries=0).complete("s", "u")
    assert [r["method"] for r in seen] == ["POST"]


@pytest.mark.parametrize("echo", [KEY, f"Bearer {KEY}", f"prefix{KEY}suffix", f"{KEY}\n{KEY}"])
def test_key_echoed_in_a_200_reply_is_redacted_everywhere(monkeypatch, tmp_path, echo):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with serve(lambda h: send(h, 200, completion(f"your key is {echo}"))) as (url, _):
        backend = OpenAIBackend(url, "m", api_key_env="JUDGE_KEY")
        cache = tmp_path / "judge_cache.jsonl"
        verdict = Judge(backend, cache_path=cache).judge(RECORD, "Biscuit")
        again = Judge(backend, cache_path=cache).judge(RECORD, "Biscuit")  # from the cache
    assert verdict.failed and again.cached
    for text in (verdict.raw, verdict.error, again.raw, again.error, cache.read_text()):
        assert KEY not in text and "***" in text


def test_key_echoed_past_a_truncation_point_is_not_half_shown(monkeypatch):
    """Secrets are replaced before a message is cut, so no prefix of the key survives the cut."""
    monkeypatch.setenv("JUDGE_KEY", KEY)
    for status, body in ((200, b"x" * 190 + KEY.encode()), (400, b"y" * 190 + KEY.encode())):
        with serve(lambda h: send(h, status, body)) as (url, _):
            with pytest.raises(JudgeBackendError) as err:
                OpenAIBackend(url, "m", api_key_env="JUDGE_KEY", retries=0).complete("s", "u")
        assert KEY[:6] not in str(err.value), str(err.value)


def test_userinfo_password_and_its_basic_token_echoed_are_redacted(tmp_path):
    import base64

    token = base64.b64encode(b"me:s3cret-pass").decode()
    with serve(lambda h: send(h, 200, completion(f"s3cret-pass {token} {h.headers['Authorization']}"))) as (url, seen):
        raw = OpenAIBackend(url.replace("http://", "http://me:s3cret-pass@"), "m").complete("s", "u")
    assert seen[0]["auth"] == f"Basic {token}"
    assert "s3cret-pass" not in raw and token not in raw


def test_checklist_replies_are_redacted_before_the_cache(monkeypatch, tmp_path):
    from relaylens.datasets import load_records
    from relaylens.datasets.synthetic_hellobench import bundled_hellobench_path

    monkeypatch.setenv("JUDGE_KEY", KEY)
    with serve(lambda h: send(h, 200, completion(f"[{KEY}]"))) as (url, _):
        judge = ChecklistJudge(OpenAIBackend(url, "m", api_key_env="JUDGE_KEY"), cache_path=tmp_path / "c.jsonl")
        verdict = judge.judge(load_records(bundled_hellobench_path())[0], "a summary")
    assert verdict.failed and KEY not in verdict.raw + (verdict.error or "") + (tmp_path / "c.jsonl").read_text()


def trickle(handler, headers_too: bool = False, pause: float = 0.05) -> None:
    """Answer one byte at a time, each within the socket timeout (a per-read timeout never fires)."""
    body = completion('{"correct": true}')
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode())
    if not headers_too:
        handler.wfile.write(head)
        handler.wfile.flush()
        head = b""
    for i in range(len(head + body)):
        handler.wfile.write((head + body)[i:i + 1])
        handler.wfile.flush()
        time.sleep(pause)


@pytest.mark.parametrize("headers_too", [False, True])
def test_trickling_server_is_cut_at_the_wall_clock_deadline(headers_too):
    with serve(lambda h: trickle(h, headers_too)) as (url, seen):
        backend = OpenAIBackend(url, "m", timeout=2.0, deadline=0.6, retries=3, backoff=0.01)
        started = time.monotonic()
        with pytest.raises(JudgeBackendError, match="within the deadline of 0.6 s"):
            backend.complete("s", "u")
        took = time.monotonic() - started
    assert took < 1.5, f"one call took {took:.1f} s past a 0.6 s deadline"
    assert len(seen) == 1, "no retry starts after the deadline"


def test_slow_but_complete_reply_within_the_deadline_is_accepted():
    with serve(lambda h: trickle(h, pause=0.001)) as (url, _):
        assert OpenAIBackend(url, "m", deadline=20.0).complete("s", "u") == '{"correct": true}'


def big(handler, size: int, announce: bool) -> None:
    body = completion("x" * size)
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    if announce:
        handler.send_header("Content-Length", str(len(body)))
    else:
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    for i in range(0, len(body), 1 << 16):
        handler.wfile.write(body[i:i + (1 << 16)])


@pytest.mark.parametrize("announce", [True, False])
def test_oversized_reply_is_refused_and_not_cached(tmp_path, announce):
    with serve(lambda h: big(h, 3 * MAX_REPLY_BYTES, announce)) as (url, _):
        judge = Judge(OpenAIBackend(url, "m", retries=0), cache_path=tmp_path / "cache.jsonl")
        with pytest.raises(JudgeBackendError, match=f"over the cap of {MAX_REPLY_BYTES} bytes"):
            judge.judge(RECORD, "Biscuit")
    assert not (tmp_path / "cache.jsonl").exists() or (tmp_path / "cache.jsonl").stat().st_size == 0


def test_reply_cap_is_an_option():
    with serve(lambda h: big(h, 5000, True)) as (url, _):
        with pytest.raises(JudgeBackendError, match="cap of 1000 bytes"):
            OpenAIBackend(url, "m", max_reply_bytes=1000, retries=0).complete("s", "u")
        assert OpenAIBackend(url, "m", max_reply_bytes=10_000).complete("s", "u") == "x" * 5000


@pytest.mark.parametrize("kwargs", [{"deadline": 0}, {"deadline": float("nan")}, {"deadline": float("inf")},
                                    {"deadline": True}, {"max_reply_bytes": 0}, {"max_reply_bytes": 1.5}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(JudgeBackendError, match="deadline|max_reply_bytes"):
        OpenAIBackend("http://127.0.0.1:9/v1", "m", **kwargs)


def test_documented_defaults():
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m")
    assert (backend.deadline, backend.max_reply_bytes) == (DEADLINE_S, MAX_REPLY_BYTES) == (120.0, 1 << 20)
    assert "deadline" not in json.dumps(backend.settings), "the bounds do not change which cached verdicts apply"
