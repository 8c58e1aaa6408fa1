"""The fault proxy forwards faithfully, and injects exactly the faults it is told to."""

from __future__ import annotations

import dataclasses
import http.client
import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import botocore.auth
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, HTTPClientError

from objmanifest.local import servers
from objmanifest.local.servers import LocalS3
from tests.support.faults import CHAOS_KINDS, Chaos, FaultProxy

pytestmark = pytest.mark.xdist_group("faults")
"""Under xdist (``--dist loadgroup``) this module's tests run on one worker, so its own
module-scoped servers start once."""

# --------------------------------------------------------------------- a plain echo upstream


class _Echo(BaseHTTPRequestHandler):
    """Answers with what it received, so tests can see exactly what the proxy forwarded."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, object]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.read(2)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        record = {
            "method": self.command,
            "path": self.path,
            "headers": list(self.headers.items()),
            "body": body.decode("latin-1"),
        }
        _Echo.seen.append(record)
        if self.path.startswith("/not-modified"):
            self.send_response(304)
            self.send_header("ETag", '"e1"')
            self.end_headers()
            return
        if self.path.startswith("/chunked-response"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        payload = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Dup", "a")
        self.send_header("X-Dup", "b")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def echo_proxy(echo: str) -> Iterator[FaultProxy]:
    _Echo.seen.clear()
    with FaultProxy(echo) as proxy:
        yield proxy


def _conn(proxy: FaultProxy) -> http.client.HTTPConnection:
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def test_forwards_method_target_headers_and_body(echo_proxy: FaultProxy) -> None:
    conn = _conn(echo_proxy)
    conn.putrequest("PUT", "/b/k?partNumber=2&uploadId=x%2Fy", skip_accept_encoding=True)
    conn.putheader("X-First", "1")
    conn.putheader("X-Amz-Meta-Dup", "one")
    conn.putheader("X-Amz-Meta-Dup", "two")
    conn.putheader("If-None-Match", "*")
    conn.putheader("Content-Length", "5")
    conn.endheaders(b"hello")
    resp = conn.getresponse()
    got = json.loads(resp.read())
    assert resp.status == 200
    assert resp.msg.get_all("X-Dup") == ["a", "b"]
    assert got["method"] == "PUT"
    assert got["path"] == "/b/k?partNumber=2&uploadId=x%2Fy"
    assert got["body"] == "hello"
    sent = [(n, v) for n, v in got["headers"] if n.lower() not in ("connection",)]
    assert sent == [
        ("Host", echo_proxy.endpoint_url.removeprefix("http://")),
        ("X-First", "1"),
        ("X-Amz-Meta-Dup", "one"),
        ("X-Amz-Meta-Dup", "two"),
        ("If-None-Match", "*"),
        ("Content-Length", "5"),
    ]
    assert echo_proxy.requests == [("PUT", "/b/k?partNumber=2&uploadId=x%2Fy")]


def test_chunked_request_body_is_forwarded(echo_proxy: FaultProxy) -> None:
    conn = _conn(echo_proxy)
    parts = [b"abc", b"", b"x" * 70000, b"tail"]
    conn.request("POST", "/chunky", body=iter(parts), encode_chunked=True)
    resp = conn.getresponse()
    got = json.loads(resp.read())
    assert got["body"] == (b"abc" + b"x" * 70000 + b"tail").decode()
    assert ("Transfer-Encoding", "chunked") in [tuple(h) for h in got["headers"]]
    # The connection is still usable afterwards: the chunked body was consumed exactly.
    conn.request("GET", "/after")
    assert json.loads(conn.getresponse().read())["path"] == "/after"


def test_keep_alive_304_head_and_chunked_responses(echo_proxy: FaultProxy) -> None:
    conn = _conn(echo_proxy)
    conn.request("GET", "/not-modified", headers={"If-None-Match": '"e1"'})
    resp = conn.getresponse()
    assert (resp.status, resp.read(), resp.getheader("ETag")) == (304, b"", '"e1"')
    sock = conn.sock

    conn.request("HEAD", "/head")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    assert int(resp.getheader("Content-Length") or 0) > 0  # the GET length, no body sent

    conn.request("GET", "/chunked-response")
    resp = conn.getresponse()
    assert resp.read() == b"hello world"
    assert resp.getheader("Transfer-Encoding") is None

    conn.request("GET", "/last")
    assert json.loads(conn.getresponse().read())["path"] == "/last"
    assert conn.sock is sock, "the proxy closed a keep-alive connection"


def test_strip_only_touches_conditional_headers_on_writes(echo_proxy: FaultProxy) -> None:
    echo_proxy.strip_conditional_headers = True
    conn = _conn(echo_proxy)
    for method in ("PUT", "POST", "GET"):
        conn.request(method, "/x", body=b"", headers={"If-Match": '"e"', "If-None-Match": "*"})
        got = json.loads(conn.getresponse().read())
        names = {n.lower() for n, _ in got["headers"]}
        stripped = {"if-match", "if-none-match"}.isdisjoint(names)
        assert stripped == (method != "GET"), method


def test_drop_response_applies_the_request_and_closes(echo_proxy: FaultProxy) -> None:
    echo_proxy.drop_response("put", "/lost", count=2)
    for _ in range(2):
        conn = _conn(echo_proxy)
        conn.request("PUT", "/lost/1", body=b"data")
        with pytest.raises(
            (http.client.RemoteDisconnected, ConnectionError),
            match=r"Remote end closed connection without response|Connection reset by peer",
        ):
            conn.getresponse()
        conn.close()
    assert echo_proxy.dropped == 2
    assert [r["path"] for r in _Echo.seen] == ["/lost/1", "/lost/1"]
    conn = _conn(echo_proxy)
    conn.request("PUT", "/lost/1", body=b"data")  # the rule is used up
    assert conn.getresponse().status == 200
    assert echo_proxy.dropped == 2


def test_date_offset_shifts_the_date_of_every_answer(echo: str) -> None:
    for offset in (3600, -3600):
        with FaultProxy(echo, date_offset=offset) as proxy:
            for method in ("GET", "HEAD"):
                conn = _conn(proxy)
                conn.request(method, "/dated")
                resp = conn.getresponse()
                resp.read()
                shifted = parsedate_to_datetime(resp.getheader("Date") or "")
                drift = (shifted - datetime.now(timezone.utc)).total_seconds() - offset
                assert abs(drift) < 5, (method, offset, drift)
                assert len(resp.msg.get_all("Date") or []) == 1


def test_pause_holds_requests_until_resume(echo_proxy: FaultProxy) -> None:
    echo_proxy.pause()
    answers: list[int] = []

    def ask() -> None:
        conn = _conn(echo_proxy)
        conn.request("PUT", "/held", body=b"data")
        answers.append(conn.getresponse().status)

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.monotonic() + 10
    while echo_proxy.held < 1:
        assert time.monotonic() < deadline, "the request never reached the proxy"
        time.sleep(0.01)
    time.sleep(0.2)
    assert _Echo.seen == [] and answers == []  # held: not forwarded, not answered
    echo_proxy.resume()
    thread.join(10)
    assert answers == [200] and [r["path"] for r in _Echo.seen] == ["/held"]
    assert echo_proxy.held == 0


def test_cut_response_breaks_the_body_after_some_bytes(echo_proxy: FaultProxy) -> None:
    echo_proxy.cut_response("get", "/cut", after_bytes=10)
    conn = _conn(echo_proxy)
    conn.request("HEAD", "/cut/head")  # no body: passes untouched, the rule stays
    head = conn.getresponse()
    assert (head.status, head.read()) == (200, b"")
    conn.request("GET", "/cut/1")
    resp = conn.getresponse()
    whole = int(resp.getheader("Content-Length") or 0)
    assert resp.status == 200 and whole > 10
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()
    assert (len(info.value.partial), info.value.expected) == (10, whole - 10)
    assert echo_proxy.cut == 1
    conn.close()
    conn = _conn(echo_proxy)
    conn.request("GET", "/cut/1")  # the rule is used up
    assert json.loads(conn.getresponse().read())["path"] == "/cut/1"
    assert echo_proxy.cut == 1


def test_upstream_down_is_a_502() -> None:
    with FaultProxy(f"http://127.0.0.1:{servers.free_port()}") as proxy:
        conn = _conn(proxy)
        conn.request("GET", "/")
        assert conn.getresponse().status == 502


# ------------------------------------------------------------------------ real S3 upstreams

# botocore's Config ``max_attempts`` counts retries (it adds 1 for the first try), unlike
# AWS_MAX_ATTEMPTS; ``total_max_attempts`` counts tries, so 1 means no retry at all.
NO_RETRY = Config(retries={"total_max_attempts": 1, "mode": "standard"})


@pytest.fixture(scope="module", params=list(servers.BACKENDS))
def s3(request: pytest.FixtureRequest) -> Iterator[LocalS3]:
    local = servers.start(request.param)
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def bucket(s3: LocalS3) -> str:
    name = f"f-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return name


def _via(s3: LocalS3, proxy: FaultProxy) -> LocalS3:
    """The same server, addressed through the proxy."""
    return LocalS3(backend=s3.backend, endpoint_url=proxy.endpoint_url, data_dir=None)


def test_strip_mode_defeats_if_none_match(
    s3: LocalS3, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SigV4 signs the conditional headers and SeaweedFS checks signatures: leave them out of
    # the signature, as a client of a store that ignores them could.
    monkeypatch.setattr(
        botocore.auth,
        "SIGNED_HEADERS_BLACKLIST",
        [*botocore.auth.SIGNED_HEADERS_BLACKLIST, "if-match", "if-none-match"],
    )
    with FaultProxy(s3.endpoint_url) as proxy:
        client = _via(s3, proxy).client(NO_RETRY)
        client.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
        with pytest.raises(
            ClientError,
            match=r"\((PreconditionFailed|ConditionalRequestConflict)\) when calling the PutObject",
        ) as info:
            client.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] in (412, 409)

        proxy.strip_conditional_headers = True
        client.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
        assert s3.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"
        assert proxy.requests.count(("PUT", f"/{bucket}/k")) == 3


def test_dropped_response_after_the_write_was_applied(s3: LocalS3, bucket: str) -> None:
    with FaultProxy(s3.endpoint_url) as proxy:
        client = _via(s3, proxy).client(NO_RETRY)
        proxy.drop_response("PUT", f"/{bucket}/lost")
        with pytest.raises(
            HTTPClientError, match="Connection was closed before we received"
        ) as info:
            client.put_object(Bucket=bucket, Key="lost", Body=b"applied", IfNoneMatch="*")
        assert isinstance(info.value, ConnectionClosedError)
        assert proxy.dropped == 1
        assert proxy.requests == [("PUT", f"/{bucket}/lost")], "botocore retried"
        got = s3.client().get_object(Bucket=bucket, Key="lost")
        assert got["Body"].read() == b"applied"
        # The same client carries on through the proxy once the fault is used up.
        assert client.get_object(Bucket=bucket, Key="lost")["Body"].read() == b"applied"


def test_a_retried_lost_create_looks_like_someone_elses(s3: LocalS3, bucket: str) -> None:
    """Why lost responses matter: botocore's own retry of an applied conditional create
    reports a conflict although the object is ours."""
    with FaultProxy(s3.endpoint_url) as proxy:
        one_retry = Config(retries={"total_max_attempts": 2, "mode": "standard"})
        client = _via(s3, proxy).client(one_retry)
        proxy.drop_response("PUT", f"/{bucket}/mine")
        with pytest.raises(
            ClientError,
            match=r"\((PreconditionFailed|ConditionalRequestConflict)\) when calling the PutObject",
        ) as info:
            client.put_object(Bucket=bucket, Key="mine", Body=b"ours", IfNoneMatch="*")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] in (412, 409)
        assert proxy.requests == [("PUT", f"/{bucket}/mine")] * 2
        assert s3.client().get_object(Bucket=bucket, Key="mine")["Body"].read() == b"ours"


def test_conditional_reads_and_streamed_bodies_pass_through(s3: LocalS3, bucket: str) -> None:
    with FaultProxy(s3.endpoint_url) as proxy:
        client = _via(s3, proxy).client(NO_RETRY)
        # A file-like body makes botocore send Expect: 100-continue.
        etag = client.put_object(Bucket=bucket, Key="k", Body=io.BytesIO(b"x" * 100_000))["ETag"]
        with pytest.raises(ClientError, match=r"\(304\) when calling the GetObject") as info:
            client.get_object(Bucket=bucket, Key="k", IfNoneMatch=etag)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
        head = client.head_object(Bucket=bucket, Key="k")
        assert head["ContentLength"] == 100_000 and head["ETag"] == etag
        assert head["ResponseMetadata"]["HTTPHeaders"].get("date")
        got = client.get_object(Bucket=bucket, Key="k", IfMatch=etag)
        assert got["Body"].read() == b"x" * 100_000


# ------------------------------------------------------------------- the chaos schedule


def _only(kind: str) -> Chaos:
    """A schedule that gives every request exactly this fault (latency: 30 ms on each)."""
    odds = dict.fromkeys(CHAOS_KINDS[1:], 0.0)
    if kind != "latency":
        odds[kind] = 1.0
    return Chaos(1, latency=1.0 if kind == "latency" else 0.0, max_latency=0.03, **odds)


@pytest.mark.parametrize(
    ("kind", "reaches_upstream", "status"),
    [
        ("latency", True, 200),
        ("reset", False, None),
        ("slowdown", False, 503),
        ("error500", False, 500),
        ("error500_applied", True, 500),
        ("lost", True, None),
        ("truncate", True, 200),
        ("flip", True, 200),
    ],
)
def test_each_chaos_fault_does_what_it_says(
    echo_proxy: FaultProxy, kind: str, reaches_upstream: bool, status: int | None
) -> None:
    echo_proxy.chaos = _only(kind)
    conn = _conn(echo_proxy)
    body = b"0123456789"
    conn.request("PUT", "/b/k", body=body, headers={"Content-Length": str(len(body))})
    if status is None:  # no answer: the connection reset, or closed with nothing
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            conn.getresponse().read()
    else:
        resp = conn.getresponse()
        answer = resp.read()
        assert resp.status == status
        if status == 503:
            assert b"<Code>SlowDown</Code>" in answer
        if status == 500:
            assert b"<Code>InternalError</Code>" in answer
    assert len(_Echo.seen) == (1 if reaches_upstream else 0)
    if reaches_upstream:
        sent = _Echo.seen[0]["body"]
        expected = {"truncate": "01234", "flip": "01234" + chr(ord("5") ^ 1) + "6789"}
        assert sent == expected.get(kind, "0123456789")
    assert echo_proxy.faults["requests"] == 1
    assert echo_proxy.faults[kind] == 1
    assert sum(echo_proxy.faults[k] for k in CHAOS_KINDS) == 1


def test_chaos_damages_only_bodies_on_the_paths_it_names(echo_proxy: FaultProxy) -> None:
    echo_proxy.chaos = dataclasses.replace(_only("flip"), damage_paths=("/data/",))
    for path in ("/b/shards/x", "/b/data/x"):
        conn = _conn(echo_proxy)
        conn.request("PUT", path, body=b"abcdef", headers={"Content-Length": "6"})
        assert conn.getresponse().status == 200
    conn = _conn(echo_proxy)
    conn.request("GET", "/b/data/x")
    assert conn.getresponse().status == 200
    assert [r["body"] for r in _Echo.seen] == ["abcdef", "abc" + chr(ord("d") ^ 1) + "ef", ""]
    assert echo_proxy.faults["flip"] == 1 and echo_proxy.faults["requests"] == 3
