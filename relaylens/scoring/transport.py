"""The judge's HTTP exchange (stdlib ``urllib``): one POST, bounded in time and size, never redirected.

* **No redirects.** A 3xx answer is an error (``urllib.error.HTTPError`` with its ``Location``), never followed:
  following it would send the request, and its ``Authorization`` header, to a server the manifest, ``judges.json``
  and the cache key never name.
* **Wall-clock deadline.** ``deadline_at`` (a :func:`time.monotonic` instant) bounds the whole exchange: connecting,
  the status line, the headers and the body. ``timeout`` alone bounds each socket read, so a server that trickles
  one byte at a time could hold a call for as long as it likes; at the deadline the call raises
  :class:`DeadlinePassed` and the connection is shut.
* **Size cap.** At most ``max_bytes`` of the reply body are read (:class:`ReplyTooLarge` past it, and at once when
  ``Content-Length`` announces more); an HTTP error's body is read up to :data:`ERROR_BODY_BYTES`.
* Loopback hosts (vLLM, llama.cpp, test stubs) are reached directly, never through an ``http_proxy``.

Example:
    >>> post("http://127.0.0.1:9/v1/chat/completions", b"{}", {}, timeout=1, deadline_at=0.0, max_bytes=10)
    Traceback (most recent call last):
    ...
    relaylens.scoring.transport.DeadlinePassed: no time left before the deadline
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from relaylens.errors import RelaylensError

__all__ = ["post", "DeadlinePassed", "ReplyTooLarge", "ERROR_BODY_BYTES", "LOOPBACK"]

ERROR_BODY_BYTES = 4096
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CHUNK = 1 << 16


class DeadlinePassed(RelaylensError):
    """The exchange did not finish before its wall-clock deadline."""


class ReplyTooLarge(RelaylensError):
    """The reply body is longer than the cap."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError(code) carrying the Location header


class _Watch:
    """The sockets of one exchange, shut together when the deadline passes (so a late worker stops reading)."""

    def __init__(self):
        self.sockets: list[socket.socket] = []
        self.fired = False
        self.lock = threading.Lock()

    def add(self, sock):
        with self.lock:
            self.sockets.append(sock)
            if self.fired:
                self._shut(sock)
        return sock

    def fire(self) -> None:
        with self.lock:
            self.fired = True
            for sock in self.sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed, or detached by the TLS wrapper (its wrapped socket is registered too)
            pass


def _watched(base, watch: _Watch):
    class Connection(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = lambda *a, **k: watch.add(socket.create_connection(*a, **k))

        def connect(self):
            super().connect()
            watch.add(self.sock)

    return Connection


def _opener(url: str, watch: _Watch):
    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(_watched(http.client.HTTPConnection, watch), req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(_watched(http.client.HTTPSConnection, watch), req, context=self._context)

    handlers = [HTTP(), HTTPS(), _NoRedirect()]
    if (urllib.parse.urlsplit(url).hostname or "") in LOOPBACK:
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def _exchange(url: str, body: bytes, headers: dict, timeout: float, max_bytes: int, watch: _Watch) -> bytes:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _opener(url, watch).open(request, timeout=timeout) as resp:
            declared = resp.headers.get("Content-Length", "")
            if declared.strip().isdigit() and int(declared) > max_bytes:
                raise ReplyTooLarge(f"the reply announces {int(declared)} bytes")
            data = bytearray()
            while chunk := resp.read1(_CHUNK):
                data += chunk
                if len(data) > max_bytes:
                    raise ReplyTooLarge(f"the reply passed {max_bytes} bytes")
            return bytes(data)
    except urllib.error.HTTPError as exc:
        exc.body = exc.read(ERROR_BODY_BYTES) if exc.fp is not None else b""  # bounded, unlike exc.read()
        raise


def post(url: str, body: bytes, headers: dict, timeout: float, deadline_at: float, max_bytes: int) -> bytes:
    """The body of the reply to one POST of ``body`` to ``url`` (see the module docstring for the bounds).

    Raises what ``urllib`` raises (``HTTPError`` with the first :data:`ERROR_BODY_BYTES` of its body as ``.body``,
    ``URLError``, ``OSError``), :class:`DeadlinePassed` or :class:`ReplyTooLarge`."""
    left = deadline_at - time.monotonic()
    if left <= 0:
        raise DeadlinePassed("no time left before the deadline")
    watch, box = _Watch(), {}

    def work():
        try:
            box["data"] = _exchange(url, body, headers, min(timeout, left), max_bytes, watch)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="relaylens-judge-http", daemon=True)
    worker.start()
    worker.join(left)
    if worker.is_alive():
        watch.fire()
        raise DeadlinePassed(f"no complete reply within the deadline ({left:.3g} s left when the attempt began)")
    if "error" in box:
        raise box["error"]
    return box["data"]
