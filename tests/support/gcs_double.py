"""A test double of Google Cloud Storage's JSON API, served on loopback, that enforces what
fake-gcs-server does not: preconditions on compose and on reads, and the MD5/CRC32C an
upload carries. ``GCSStore`` reaches it over real HTTP, through the SDK and its session,
like any endpoint (``STORAGE_EMULATOR_HOST`` style, anonymous).

It models the calls ``GCSStore`` makes, as GCS answers them (docs.cloud.google.com/storage/
docs/json_api): multipart uploads with ``ifGenerationMatch`` (412 ``conditionNotMet``) and
their digests (400 ``Provided MD5 hash ... doesn't match``), object metadata and media reads
with ``ifGenerationNotMatch`` (304) and ``generation``, ranged reads (206, 416), listings
with a prefix, a delimiter and pages, compose with ``ifGenerationMatch`` and each source's
generation, deletes, a bucket's existence, and a ``Date`` on every answer. Faults can be
planned: an answer lost after the change was applied, an answer refused without applying it
(429, 503, 403 ...), a body damaged on its way in or out, a read that breaks off.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse

import google_crc32c


@dataclass
class _Object:
    body: bytes
    generation: int
    metadata: dict[str, str]
    content_type: str
    components: int = 1

    def resource(self, bucket: str, name: str) -> dict[str, Any]:
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": name,
            "id": f"{bucket}/{name}/{self.generation}",
            "generation": str(self.generation),
            "metageneration": "1",
            "size": str(len(self.body)),
            "md5Hash": base64.b64encode(hashlib.md5(self.body).digest()).decode(),
            "crc32c": _crc32c(self.body),
            "contentType": self.content_type,
            "etag": f"C{self.generation}=",
            "componentCount": self.components,
            **({"metadata": dict(self.metadata)} if self.metadata else {}),
        }


def _crc32c(body: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(body).digest()).decode()


@dataclass
class _Fault:
    method: str
    path: str
    kind: str  # "lose", "status", "damage", "cut"
    status: int = 0
    times: int = 1


@dataclass
class GCSDouble:
    """The double's state: buckets of objects, planned faults, and what it was asked."""

    buckets: dict[str, dict[str, _Object]] = field(default_factory=dict)
    faults: list[_Fault] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    """(METHOD kind) -> count: ``GET media``, ``GET meta``, ``POST upload``, ``POST compose``."""
    permissions: Counter[str] = field(default_factory=Counter)
    """The IAM permission each request needed, as GCS checks them (cloud.google.com/storage/
    docs/access-control/iam-json): an upload or compose that replaces an object needs
    ``storage.objects.delete`` besides ``create``; compose reads its sources."""
    date_offset: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _next_generation: int = 1_700_000_000_000_000
    fired: int = 0

    def __post_init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def create_bucket(self, name: str) -> None:
        with self.lock:
            self.buckets.setdefault(name, {})

    def plan(self, method: str, path: str, kind: str, status: int = 0, times: int = 1) -> None:
        """The next ``times`` requests of ``method`` whose path (with its query) contains
        ``path`` meet a fault: ``lose`` (applied, no answer), ``status`` (answered ``status``,
        not applied), ``damage`` (one byte of the body flipped: the request's, or the
        answer's for a request without one, a read), ``cut`` (a read's body breaks off after
        half of it)."""
        with self.lock:
            self.faults.append(_Fault(method, path, kind, status, times))

    def take(self, method: str, target: str, kinds: tuple[str, ...]) -> _Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.kind in kinds and fault.method == method and fault.path in target:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    self.fired += 1
                    return fault
        return None

    def generation(self) -> int:
        self._next_generation += 1
        return self._next_generation


_CONDITION_NOT_MET = "At least one of the pre-conditions you specified did not hold."


class _Answer(Exception):
    def __init__(self, status: int, message: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def _handler(double: GCSDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            return formatdate((timestamp or time.time()) + double.date_offset, usegmt=True)

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def _json(self, status: int, doc: Any) -> None:
            self._send(status, json.dumps(doc).encode(), {"Content-Type": "application/json"})

        def _serve(self, method: str) -> None:
            body = self._body()
            target = self.path
            fault = double.take(method, target, ("status",))
            if fault is not None:
                self._json(fault.status, _error(fault.status, "planned fault", "planned"))
                return
            damage = double.take(method, target, ("damage",))
            if damage is not None and body:
                body = _flip_media(body)
            damage_answer = damage is not None and not body
            lose = double.take(method, target, ("lose",))
            try:
                status, doc, headers, raw = _route(double, method, target, self.headers, body)
            except _Answer as a:
                if lose is not None:
                    self.close_connection = True
                    return
                if a.status == 304:
                    self._send(304)
                elif "alt=media" in target:  # as GCS answers a download: its words, as HTML
                    page = {"Content-Type": "text/html; charset=UTF-8"}
                    self._send(a.status, a.message.encode(), page)
                else:
                    self._json(a.status, _error(a.status, a.message, a.reason))
                return
            if lose is not None:  # applied, and its answer never arrives
                self.close_connection = True
                return
            if raw is not None:
                cut = double.take(method, target, ("cut",))
                if damage_answer and raw:
                    raw = raw[:-1] + bytes([raw[-1] ^ 0xFF])
                headers["Content-Length"] = str(len(raw))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw if cut is None else raw[: len(raw) // 2])
                if cut is not None:
                    self.close_connection = True
                return
            if doc is None:
                self._send(status)
            else:
                self._json(status, doc)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PUT(self) -> None:
            self._serve("PUT")

    return Handler


def _error(status: int, message: str, reason: str) -> dict[str, Any]:
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"domain": "global", "reason": reason, "message": message}],
        }
    }


def _flip_media(body: bytes) -> bytes:
    """One byte of the media (the last part of a multipart body) flipped."""
    at = body.rfind(b"\r\n--", 0, len(body) - 4) - 1
    if at <= 0:
        at = len(body) - 1
    return body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]


_OBJECT = re.compile(r"/storage/v1/b/([^/]+)/o/(.+?)(/compose)?$")
_MEDIA = re.compile(r"/download/storage/v1/b/([^/]+)/o/(.+)$")
_LIST = re.compile(r"/storage/v1/b/([^/]+)/o$")
_UPLOAD = re.compile(r"/upload/storage/v1/b/([^/]+)/o$")
_BUCKET = re.compile(r"/storage/v1/b/([^/]+)$")

Routed = tuple[int, Any, dict[str, str], bytes | None]


def _route(double: GCSDouble, method: str, target: str, headers: Any, body: bytes) -> Routed:
    url = urlparse(target)
    query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
    path = url.path
    with double.lock:
        if method == "POST" and path == "/storage/v1/b":
            double.permissions["storage.buckets.create"] += 1
            double.buckets.setdefault(json.loads(body)["name"], {})
            return 200, {"kind": "storage#bucket"}, {}, None
        if m := _BUCKET.fullmatch(path):
            double.permissions["storage.buckets.get"] += 1
            if m[1] not in double.buckets:
                raise _Answer(404, "The specified bucket does not exist.", "notFound")
            return 200, {"kind": "storage#bucket", "name": m[1]}, {}, None
        if m := _UPLOAD.fullmatch(path):
            double.requests["POST upload"] += 1
            return _upload(double, _bucket(double, m[1]), m[1], query, headers, body)
        if m := _LIST.fullmatch(path):
            double.permissions["storage.objects.list"] += 1
            return _list(_bucket(double, m[1]), m[1], query)
        if m := _MEDIA.fullmatch(path):
            double.requests["GET media"] += 1
            double.permissions["storage.objects.get"] += 1
            return _media(_bucket(double, m[1]), m[1], unquote(m[2]), query, headers)
        if m := _OBJECT.fullmatch(path):
            objects, name = _bucket(double, m[1]), unquote(m[2])
            if m[3]:
                double.requests["POST compose"] += 1
                double.permissions["storage.objects.create"] += 1
                double.permissions["storage.objects.get"] += 1  # its sources
                if name in objects:
                    double.permissions["storage.objects.delete"] += 1
                return _compose(double, objects, m[1], name, query, json.loads(body))
            if method == "DELETE":
                double.permissions["storage.objects.delete"] += 1
                if objects.pop(name, None) is None:
                    raise _Answer(404, f"No such object: {m[1]}/{name}", "notFound")
                return 204, None, {}, None
            double.permissions["storage.objects.get"] += 1
            if query.get("alt") == "media":
                double.requests["GET media"] += 1
                return _media(objects, m[1], name, query, headers)
            double.requests["GET meta"] += 1
            obj = _read(objects, m[1], name, query)
            return 200, obj.resource(m[1], name), {}, None
    raise _Answer(400, f"the double does not model {method} {path}", "invalid")


def _bucket(double: GCSDouble, name: str) -> dict[str, _Object]:
    if name not in double.buckets:
        raise _Answer(404, "The specified bucket does not exist.", "notFound")
    return double.buckets[name]


def _read(objects: dict[str, _Object], bucket: str, name: str, query: dict[str, str]) -> _Object:
    obj = objects.get(name)
    if obj is None or ("generation" in query and int(query["generation"]) != obj.generation):
        raise _Answer(404, f"No such object: {bucket}/{name}", "notFound")
    if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == obj.generation:
        raise _Answer(304)
    if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != obj.generation:
        raise _Answer(412, _CONDITION_NOT_MET, "conditionNotMet")
    return obj


def _media(
    objects: dict[str, _Object], bucket: str, name: str, query: dict[str, str], headers: Any
) -> Routed:
    obj = _read(objects, bucket, name, query)
    answer = {
        "Content-Type": obj.content_type,
        "X-Goog-Generation": str(obj.generation),
        "X-Goog-Hash": f"crc32c={_crc32c(obj.body)}",
    }
    wanted = headers.get("Range")
    if not wanted:
        return 200, None, answer, obj.body
    start_s, _, end_s = wanted.removeprefix("bytes=").partition("-")
    start, size = int(start_s), len(obj.body)
    if start >= size:
        raise _Answer(
            416, "The requested range cannot be satisfied.", "requestedRangeNotSatisfiable"
        )
    end = min(int(end_s) if end_s else size - 1, size - 1)
    answer["Content-Range"] = f"bytes {start}-{end}/{size}"
    answer.pop("X-Goog-Hash")
    return 206, None, answer, obj.body[start : end + 1]


def _condition(objects: dict[str, _Object], name: str, query: dict[str, str]) -> None:
    if "ifGenerationMatch" not in query:
        return
    want, obj = int(query["ifGenerationMatch"]), objects.get(name)
    if (obj.generation if obj is not None else 0) != want:
        raise _Answer(412, _CONDITION_NOT_MET, "conditionNotMet")


def _upload(
    double: GCSDouble,
    objects: dict[str, _Object],
    bucket: str,
    query: dict[str, str],
    headers: Any,
    body: bytes,
) -> Routed:
    if query.get("uploadType") != "multipart":
        raise _Answer(400, "the double models multipart uploads only", "invalid")
    boundary = headers.get("Content-Type", "").partition("boundary=")[2].strip('"')
    pieces = body.split(b"--" + boundary.encode())
    meta_part, media_part = pieces[1], pieces[2]
    resource = json.loads(meta_part.partition(b"\r\n\r\n")[2])
    head, _, media = media_part.partition(b"\r\n\r\n")
    media = media[:-2] if media.endswith(b"\r\n") else media
    content_type = "application/octet-stream"
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-type:"):
            content_type = line.partition(":")[2].strip()
    md5 = base64.b64encode(hashlib.md5(media).digest()).decode()
    if "md5Hash" in resource and resource["md5Hash"] != md5:
        raise _Answer(
            400,
            f'Provided MD5 hash "{resource["md5Hash"]}" doesn\'t match calculated MD5 hash '
            f'"{md5}".',
            "invalid",
        )
    if "crc32c" in resource and resource["crc32c"] != _crc32c(media):
        raise _Answer(
            400,
            f'Provided CRC32C "{resource["crc32c"]}" doesn\'t match calculated CRC32C '
            f'"{_crc32c(media)}".',
            "invalid",
        )
    name = resource["name"]
    double.permissions["storage.objects.create"] += 1
    if name in objects:
        double.permissions["storage.objects.delete"] += 1  # an overwrite
    _condition(objects, name, query)
    obj = _Object(media, double.generation(), resource.get("metadata") or {}, content_type)
    objects[name] = obj
    return 200, obj.resource(bucket, name), {}, None


def _compose(
    double: GCSDouble,
    objects: dict[str, _Object],
    bucket: str,
    name: str,
    query: dict[str, str],
    request: dict[str, Any],
) -> Routed:
    sources = request.get("sourceObjects", [])
    if not 1 <= len(sources) <= 32:
        raise _Answer(400, "The number of source components provided exceeds 32.", "invalid")
    parts: list[bytes] = []
    for source in sources:
        obj = objects.get(source["name"])
        pinned = source.get("generation")
        if obj is None or (pinned is not None and int(pinned) != obj.generation):
            raise _Answer(404, f"Object {source['name']} not found.", "notFound")
        wanted = (source.get("objectPreconditions") or {}).get("ifGenerationMatch")
        if wanted is not None and int(wanted) != obj.generation:
            raise _Answer(412, _CONDITION_NOT_MET, "conditionNotMet")
        parts.append(obj.body)
    _condition(objects, name, query)
    destination = request.get("destination") or {}
    obj = _Object(
        b"".join(parts),
        double.generation(),
        destination.get("metadata") or {},
        destination.get("contentType", "application/octet-stream"),
        components=len(parts),
    )
    objects[name] = obj
    return 200, obj.resource(bucket, name), {}, None


def _list(objects: dict[str, _Object], bucket: str, query: dict[str, str]) -> Routed:
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    limit = int(query.get("maxResults") or 1000)
    after = query.get("pageToken", "")
    rows: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for name in sorted(objects, key=lambda n: n.encode()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if delimiter and delimiter in rest:
            common = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if common not in seen:
                seen.add(common)
                rows.append((common, True))
            continue
        rows.append((name, False))
    rows = [row for row in rows if row[0] > after] if after else rows
    page, more = rows[:limit], len(rows) > limit
    doc: dict[str, Any] = {
        "kind": "storage#objects",
        "items": [objects[n].resource(bucket, n) for n, is_prefix in page if not is_prefix],
        "prefixes": [n for n, is_prefix in page if is_prefix],
    }
    if more:
        doc["nextPageToken"] = page[-1][0]
    return 200, doc, {}, None


def object_path(bucket: str, name: str) -> str:
    """The path part of an object's JSON API URL, to plan a fault on it."""
    return f"/b/{bucket}/o/{quote(name, safe='')}"
