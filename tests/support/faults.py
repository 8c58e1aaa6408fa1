"""A fault-injection HTTP proxy in front of a real local S3 server.

It lets tests stage the failures a real store and network produce but a healthy local server
never does: a write that is applied but whose response is lost (the client must not assume
it failed), a response whose body breaks off part-way (the reader must see a broken read,
not a short object), a request body damaged on its way (one byte flipped, or the body cut
short with a Content-Length to match: the store must refuse it, not store it), a store that
silently ignores conditional-write headers (the client must detect it, not corrupt data),
a store whose clock is far from the client's (the ``Date`` of every response shifted), a
client that stalls (its requests held until it resumes, as if its process had been
stopped), and a store far away (``delay``: every request waits that long before it is
forwarded, each in its own thread, so concurrent requests are delayed side by side, not one
after another; the benchmarks use it as S3's round trip).

Requests are forwarded byte for byte (method, target, headers in order, body); only the
hop-by-hop headers of each leg are replaced. Each request uses a fresh upstream connection,
so a dropped response never leaves a half-read upstream connection behind; with
``keep_upstream`` (the benchmarks' latency proxy, thousands of requests a second) each client
connection keeps one upstream connection instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import os
import random
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

import botocore.auth

__all__ = ["CHAOS_KINDS", "Chaos", "FaultProxy", "ignoring_conditions"]

# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are never forwarded.
# Expect is answered by the proxy itself (BaseHTTPRequestHandler sends 100 Continue).
_REQUEST_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "expect"}
)
# The response body is re-framed with Content-Length, so its Transfer-Encoding goes too.
_RESPONSE_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "transfer-encoding"}
)
_CONDITIONAL_HEADERS = frozenset({"if-match", "if-none-match"})
_UPSTREAM_TIMEOUT = 120.0
_MAX_LINE = 64 * 1024
_LONGEST_PAUSE = 300.0  # a request held longer than this goes on anyway: a test forgot resume()


CHAOS_KINDS = (
    "latency",
    "reset",
    "slowdown",
    "error500",
    "error500_applied",
    "lost",
    "truncate",
    "flip",
)
"""The faults a ``Chaos`` schedule injects, in the order its figures print them."""


@dataclass(frozen=True)
class Chaos:
    """A seeded fault schedule: each request draws at most one fault, with these
    probabilities (latency is drawn on its own, so a faulted request may also be slow).

    ``reset`` closes the client's connection with a TCP RST before forwarding; ``slowdown``
    (503 SlowDown) and ``error500`` (500 InternalError) answer without forwarding;
    ``error500_applied`` forwards, then answers 500 in place of the store's answer;
    ``lost`` forwards, then closes the connection without an answer; ``truncate`` and
    ``flip`` damage a request body as ``FaultProxy.damage_request`` does, drawn only by
    requests with a body and a target containing one of ``damage_paths`` (empty: every
    target). The n-th request to arrive
    draws from ``random.Random(f"{seed}:{n}")``, so a schedule is reproducible in the order
    requests arrive (which threads and processes decide, so a run is seeded, not replayed).
    """

    seed: int
    latency: float = 0.25
    max_latency: float = 0.05
    reset: float = 0.015
    slowdown: float = 0.015
    error500: float = 0.015
    error500_applied: float = 0.015
    lost: float = 0.015
    truncate: float = 0.02
    flip: float = 0.02
    damage_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        odds = [getattr(self, kind) for kind in CHAOS_KINDS]
        if any(not 0 <= p <= 1 for p in odds) or sum(odds[1:]) > 1 or self.max_latency < 0:
            raise ValueError(f"chaos probabilities must be in [0, 1] and sum to at most 1: {self}")

    def draw(self, n: int, method: str, target: str, has_body: bool) -> tuple[float, str | None]:
        """The added latency (seconds) and the fault (or None) of the ``n``-th request. A
        request with a body it may damage draws ``truncate`` and ``flip`` first."""
        rng = random.Random(f"{self.seed}:{n}")
        delay = rng.uniform(0, self.max_latency) if rng.random() < self.latency else 0.0
        damageable = has_body and (
            not self.damage_paths or any(p in target for p in self.damage_paths)
        )
        roll = rng.random()
        for kind in CHAOS_KINDS[1:] if damageable else CHAOS_KINDS[1:-2]:
            roll -= getattr(self, kind)
            if roll < 0:
                return delay, kind
        return delay, None

    def scaled(self, intensity: float) -> Chaos:
        """This schedule with every fault's probability (not latency's) times
        ``intensity``."""
        odds = {kind: getattr(self, kind) * intensity for kind in CHAOS_KINDS[1:]}
        return dataclasses.replace(self, **odds)

    def describe(self) -> dict[str, object]:
        """The schedule as plain data (for a run's report)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class _DropRule:
    method: str
    path_contains: str
    remaining: int


@dataclass
class _CutRule:
    method: str
    path_contains: str
    after_bytes: int
    remaining: int


@dataclass
class _DamageRule:
    method: str
    path_contains: str
    how: str
    every: int
    remaining: int
    whole_only: bool
    seen: int = 0


@dataclass
class _KillRule:
    pid: int
    method: str
    path_contains: str
    nth: int
    phase: str
    after_seen: str | None
    count: int = 0
    armed: bool = False
    fired: bool = False


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet about a client that went away (a reset, a killed agent); loud otherwise."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive client connection is closed after this many seconds
    # The headers and the body of an answer go out in two writes: with Nagle's algorithm the
    # body would wait for the client's delayed ACK of the headers (40 ms on Linux).
    disable_nagle_algorithm = True
    server: _ProxyServer

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a test run should not print a line per request."""

    def handle_expect_100(self) -> bool:
        """Answer ``100 Continue`` as a server ``delay`` away would: one round trip on."""
        delay = self.server.proxy.delay
        if delay > 0:
            time.sleep(delay)
        return super().handle_expect_100()

    def _read_body(self) -> bytes:
        """The request body exactly as received (chunked bodies keep their chunk framing)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked_raw()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked_raw(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.rfile.readline(_MAX_LINE)
            if not line:
                raise ConnectionError("client closed the connection inside a chunked body")
            parts.append(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            data = self.rfile.read(size + 2)  # chunk data and its CRLF
            if len(data) != size + 2:
                raise ConnectionError("client closed the connection inside a chunk")
            parts.append(data)
        while True:  # trailer section, ended by an empty line
            line = self.rfile.readline(_MAX_LINE)
            parts.append(line)
            if line in (b"\r\n", b"\n", b""):
                break
        return b"".join(parts)

    def _proxy(self) -> None:
        proxy = self.server.proxy
        method = self.command
        try:
            body = self._read_body()
        except (OSError, ValueError):  # client went away or sent a malformed body
            self.close_connection = True
            return
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _REQUEST_HOP_HEADERS
        ]
        if proxy.strip_conditional_headers and method in ("PUT", "POST"):
            headers = [(n, v) for n, v in headers if n.lower() not in _CONDITIONAL_HEADERS]
        proxy._hold_while_paused()
        if proxy.delay > 0:
            time.sleep(proxy.delay)
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        fault = proxy._chaos_fault(method, self.path, bool(body) and not chunked)
        if fault == "reset":
            # SO_LINGER 0: closing sends a RST, as a peer or a middlebox that resets would.
            with contextlib.suppress(OSError):
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            self.close_connection = True
            return
        if fault in ("slowdown", "error500"):
            self._answer_error(fault)
            return
        if fault in ("truncate", "flip"):
            body = _damaged(body, fault)
            headers = [
                (n, str(len(body)) if n.lower() == "content-length" else v) for n, v in headers
            ]
        kill = proxy._take_kill(method, self.path)
        if kill is not None and kill.phase == "before":
            proxy._kill(kill)  # the request never reaches the store
            self.close_connection = True
            return
        drop = proxy._take_drop(method, self.path)
        proxy._log_request(method, self.path)
        damaged = False
        if body and "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            changed = proxy._damage(method, self.path, body)
            if changed is not body:
                body, damaged = changed, True
                headers = [
                    (n, str(len(body)) if n.lower() == "content-length" else v) for n, v in headers
                ]

        try:
            status, reason, resp_headers, resp_body = proxy._forward(
                method, self.path, headers, body
            )
        except (OSError, http.client.HTTPException) as err:
            self.close_connection = True
            message = f"fault proxy: upstream failed: {err}\n".encode()
            self.send_response_only(502, "Bad Gateway")
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(message)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(message)
            return

        if damaged or fault in ("truncate", "flip"):
            proxy._answered_damaged(status)
        if fault == "error500_applied":
            self._answer_error(fault)  # the store applied it; the client hears it failed
            return
        if fault == "lost":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kill is not None:
            proxy._kill(kill)  # applied upstream; the client died before the answer
            self.close_connection = True
            return

        if drop:
            # The upstream applied the request; the client never learns how it went.
            self.close_connection = True
            proxy._count_drop()
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return

        resp_headers = proxy._shift_dates(resp_headers)
        self.send_response_only(status, reason)
        for name, value in resp_headers:
            if name.lower() not in _RESPONSE_HOP_HEADERS and name.lower() != "content-length":
                self.send_header(name, value)
        no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        upstream_length = next((v for n, v in resp_headers if n.lower() == "content-length"), None)
        if no_body:
            # HEAD and 304 carry the length of the representation, not of this message.
            if upstream_length is not None:
                self.send_header("Content-Length", upstream_length)
        else:
            self.send_header("Content-Length", str(len(resp_body)))
        cut = None if no_body else proxy._take_cut(method, self.path)
        if cut is not None:
            # The headers promise the whole body; the connection breaks after ``cut`` bytes.
            self.close_connection = True
            self.end_headers()
            self.wfile.write(resp_body[:cut])
            self.wfile.flush()
            proxy._count_cut()
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not no_body and resp_body:
            self.wfile.write(resp_body)
        self.wfile.flush()

    def _answer_error(self, fault: str) -> None:
        """An S3 error answer of the proxy's own: 503 SlowDown or 500 InternalError."""
        status, code = (503, "SlowDown") if fault == "slowdown" else (500, "InternalError")
        message = f"{code} (injected by the fault proxy's chaos schedule)"
        body = (
            b""
            if self.command == "HEAD"
            else (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
            ).encode()
        )
        self.close_connection = True
        self.send_response_only(status, code)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(body)
        self.wfile.flush()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _proxy


class FaultProxy:
    """A loopback HTTP proxy in front of ``upstream_url`` that can lose responses, cut their
    bodies short, ignore conditional headers, shift the store's clock and stall the client on
    request. Use as a context manager or call start()/stop().

    ``date_offset`` (seconds, or a timedelta) is added to the ``Date`` header of every
    response: to a client behind this proxy the store's clock runs that far from its own.
    ``delay`` (seconds) is added to every request before it is forwarded, and to the
    ``100 Continue`` it answers to a request that asks ``Expect: 100-continue`` (a server
    ``delay`` away answers that one round trip later too).
    """

    def __init__(
        self,
        upstream_url: str,
        date_offset: float | timedelta = 0.0,
        delay: float = 0.0,
        keep_upstream: bool = False,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"FaultProxy needs an http:// upstream URL, got {upstream_url!r}")
        self.upstream_url = upstream_url
        self._upstream_host = parsed.hostname
        self._upstream_port = parsed.port or 80
        self.strip_conditional_headers = False
        if delay < 0:
            raise ValueError("delay must not be negative")
        self.delay = delay
        self.keep_upstream = keep_upstream
        self._upstream = threading.local()
        self.date_offset = (
            date_offset if isinstance(date_offset, timedelta) else timedelta(seconds=date_offset)
        )
        self.dropped = 0
        self.held = 0
        """Requests waiting now because the proxy is paused."""
        self._running = threading.Event()
        self._running.set()
        self.cut = 0
        self.damaged: list[tuple[str, str, str]] = []
        """(method, target, how) of every request body damaged on its way."""
        self.damaged_answers: list[int] = []
        """The status the store answered to each damaged request, in the order answered."""
        self._damages: list[_DamageRule] = []
        self._damage_once = True
        self._damaged_bodies: set[tuple[str, str, bytes]] = set()
        self.requests: list[tuple[str, str]] = []
        self._rules: list[_DropRule] = []
        self._cuts: list[_CutRule] = []
        self._kills: list[_KillRule] = []
        self.killed = 0
        self.chaos: Chaos | None = None
        """A fault schedule every request draws from (``None``: no chaos); set it any time."""
        self.faults: Counter[str] = Counter()
        """Under chaos: ``requests`` seen, and how many drew each fault of ``CHAOS_KINDS``."""
        self._chaos_seen = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server = _ProxyServer(self)
        port = self._server.server_address[1]
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ test-facing controls

    def drop_response(self, method: str, path_contains: str, count: int = 1) -> None:
        """Lose the responses of the next ``count`` requests with this method whose target
        contains ``path_contains``: they are applied upstream, then the client's connection
        is closed without a response."""
        if count < 1:
            raise ValueError("count must be at least 1")
        with self._lock:
            self._rules.append(_DropRule(method.upper(), path_contains, count))

    def kill_client(
        self,
        pid: int,
        method: str,
        path_contains: str,
        nth: int = 1,
        phase: str = "before",
        after_seen: str | None = None,
    ) -> None:
        """SIGKILL the process ``pid`` at the ``nth`` request with this method whose target
        contains ``path_contains`` (counting only from the first request, of any method,
        whose target contains ``after_seen``, if given): ``before`` it reaches the store, or
        ``after`` the store applied it and before its answer. Only that process should be
        talking to this proxy."""
        if nth < 1 or phase not in ("before", "after"):
            raise ValueError("nth must be at least 1 and phase 'before' or 'after'")
        with self._lock:
            self._kills.append(
                _KillRule(pid, method.upper(), path_contains, nth, phase, after_seen)
            )

    def pause(self) -> None:
        """Hold every request that arrives from now on (a request already forwarded still
        gets its answer): to the store the client has stopped, as a stopped process would."""
        self._running.clear()

    def resume(self) -> None:
        """Forward the held requests, in no particular order, and every later one."""
        self._running.set()

    def cut_response(
        self, method: str, path_contains: str, after_bytes: int, count: int = 1
    ) -> None:
        """Break the responses of the next ``count`` requests with this method whose target
        contains ``path_contains`` after ``after_bytes`` bytes of their body: the status and
        headers (with the whole body's Content-Length) arrive, then the first ``after_bytes``
        bytes, then the connection is closed. Responses without a body (HEAD, 304, 204)
        pass untouched and do not count."""
        if count < 1:
            raise ValueError("count must be at least 1")
        if after_bytes < 0:
            raise ValueError("after_bytes must not be negative")
        with self._lock:
            self._cuts.append(_CutRule(method.upper(), path_contains, after_bytes, count))

    def damage_request(
        self,
        method: str,
        path_contains: str,
        count: int = 1,
        how: str = "flip",
        every: int = 1,
        whole_only: bool = False,
        once: bool = True,
    ) -> None:
        """Damage the bodies of ``count`` requests with this method whose target contains
        ``path_contains`` (every ``every``-th of them; with ``whole_only``, not parts of
        multipart uploads nor their completion on Azure), on their way to the store:
        ``flip`` inverts one bit of the middle byte; ``truncate`` forwards the first half of
        the body with a ``Content-Length`` to match, so the store sees a complete, shorter
        body. Headers (a digest the client sent, its signature) are forwarded as they were.
        With ``once``, a request sent again with the same target and body passes untouched.
        Requests without a body, or with a chunked one, pass untouched and do not count."""
        if count < 1 or every < 1 or how not in ("flip", "truncate"):
            raise ValueError("count and every must be at least 1, how 'flip' or 'truncate'")
        with self._lock:
            self._damages.append(
                _DamageRule(method.upper(), path_contains, how, every, count, whole_only)
            )
            self._damage_once = once

    def stop_damage(self) -> None:
        """Damage no more request bodies (the rules given so far are dropped)."""
        with self._lock:
            self._damages.clear()

    def start(self) -> None:
        """Serve in a background thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FaultProxy {self.endpoint_url}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every client connection (idempotent)."""
        self.resume()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._server.shutdown()
            thread.join()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------- used by the handler

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _hold_while_paused(self) -> None:
        if self._running.is_set():
            return
        with self._lock:
            self.held += 1
        try:
            self._running.wait(_LONGEST_PAUSE)
        finally:
            with self._lock:
                self.held -= 1

    def _shift_dates(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if not self.date_offset:
            return headers
        shifted = []
        for name, value in headers:
            if name.lower() == "date":
                with contextlib.suppress(TypeError, ValueError):
                    moved = parsedate_to_datetime(value) + self.date_offset
                    value = format_datetime(moved, usegmt=True)
            shifted.append((name, value))
        return shifted

    def _take_kill(self, method: str, path: str) -> _KillRule | None:
        with self._lock:
            for rule in self._kills:
                if rule.fired:
                    continue
                if rule.after_seen is not None and not rule.armed:
                    rule.armed = rule.after_seen in path
                    continue
                if rule.method == method and rule.path_contains in path:
                    rule.count += 1
                    if rule.count == rule.nth:
                        rule.fired = True
                        return rule
        return None

    def _kill(self, rule: _KillRule) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rule.pid, signal.SIGKILL)
        with self._lock:
            self.killed += 1

    def _take_drop(self, method: str, path: str) -> bool:
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and rule.method == method and rule.path_contains in path:
                    rule.remaining -= 1
                    return True
        return False

    def _take_cut(self, method: str, path: str) -> int | None:
        with self._lock:
            for rule in self._cuts:
                if rule.remaining > 0 and rule.method == method and rule.path_contains in path:
                    rule.remaining -= 1
                    return rule.after_bytes
        return None

    def _damage(self, method: str, path: str, body: bytes) -> bytes:
        """``body`` as a damage rule leaves it (the same object if none applies)."""
        if not self._damages:
            return body  # no hashing on the benchmarks' path
        with self._lock:
            identity = (method, path, hashlib.sha256(body).digest())
            if self._damage_once and identity in self._damaged_bodies:
                return body
            for rule in self._damages:
                if rule.remaining <= 0 or rule.method != method or rule.path_contains not in path:
                    continue
                if rule.whole_only and ("partNumber=" in path or "comp=block" in path):
                    continue  # a part (S3's UploadPart, Azure's Put Block or Put Block List)
                rule.seen += 1
                if rule.seen % rule.every:
                    continue
                rule.remaining -= 1
                self.damaged.append((method, path, rule.how))
                self._damaged_bodies.add(identity)
                return _damaged(body, rule.how)
        return body

    def _chaos_fault(self, method: str, path: str, has_body: bool) -> str | None:
        """Under a chaos schedule: wait this request's added latency, count and return its
        fault (None for none)."""
        chaos = self.chaos
        if chaos is None:
            return None
        with self._lock:
            n = self._chaos_seen
            self._chaos_seen += 1
        delay, fault = chaos.draw(n, method, path, has_body)
        if delay > 0:
            time.sleep(delay)
        with self._lock:
            self.faults["requests"] += 1
            if delay > 0:
                self.faults["latency"] += 1
            if fault is not None:
                self.faults[fault] += 1
                if fault in ("truncate", "flip"):
                    self.damaged.append((method, path, fault))
        return fault

    def _answered_damaged(self, status: int) -> None:
        with self._lock:
            self.damaged_answers.append(status)

    def _count_drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def _count_cut(self) -> None:
        with self._lock:
            self.cut += 1

    def _log_request(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send one request upstream and read the whole response: on a fresh connection, or
        with ``keep_upstream`` on this handler thread's own (opened again, and the request
        sent once more, only if the upstream had closed it while idle)."""
        if not self.keep_upstream:
            conn = self._connect()
            try:
                return self._exchange(conn, method, target, headers, body, close=True)
            finally:
                conn.close()
        conn = getattr(self._upstream, "conn", None)
        if conn is not None:
            try:
                answer = self._exchange(conn, method, target, headers, body, close=False)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()  # closed by the upstream while idle: it never saw this request
            else:
                self._keep_or_close(conn, answer[2])
                return answer
        conn = self._upstream.conn = self._connect()
        try:
            answer = self._exchange(conn, method, target, headers, body, close=False)
        except BaseException:
            conn.close()
            self._upstream.conn = None
            raise
        self._keep_or_close(conn, answer[2])
        return answer

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(
            self._upstream_host, self._upstream_port, timeout=_UPSTREAM_TIMEOUT
        )

    def _keep_or_close(
        self, conn: http.client.HTTPConnection, headers: list[tuple[str, str]]
    ) -> None:
        if any(n.lower() == "connection" and "close" in v.lower() for n, v in headers):
            conn.close()
            self._upstream.conn = None

    @staticmethod
    def _exchange(
        conn: http.client.HTTPConnection,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
        close: bool,
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        # Host and Accept-Encoding come from the client's headers, untouched: SigV4 signs
        # Host, so it must stay the proxy's address the client signed.
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if close:
            conn.putheader("Connection", "close")
        conn.endheaders()
        if body:
            conn.send(body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.reason, resp.getheaders(), data


def _damaged(body: bytes, how: str) -> bytes:
    """``body`` cut to its first half (``truncate``) or with one bit of its middle byte
    inverted (``flip``)."""
    if how == "truncate":
        return body[: len(body) // 2]
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 0x01]) + body[middle + 1 :]


@contextlib.contextmanager
def ignoring_conditions(upstream_url: str) -> Iterator[FaultProxy]:
    """A proxy in front of ``upstream_url`` that drops ``If-Match`` / ``If-None-Match`` from
    every write, as a store that ignores them would answer.

    SigV4 signs those headers, and a server that checks signatures (SeaweedFS) refuses a
    request that lost a signed header (403 SignatureDoesNotMatch) before any condition
    matters, so while the proxy runs botocore leaves them out of the signature.
    """
    blacklist = botocore.auth.SIGNED_HEADERS_BLACKLIST
    botocore.auth.SIGNED_HEADERS_BLACKLIST = [*blacklist, "if-match", "if-none-match"]
    try:
        with FaultProxy(upstream_url) as proxy:
            proxy.strip_conditional_headers = True
            yield proxy
    finally:
        botocore.auth.SIGNED_HEADERS_BLACKLIST = blacklist
