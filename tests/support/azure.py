"""Azurite for the tests that need an ``az://`` store, and a transport double that makes the
SDK meet what a healthy emulator never answers.

``azurite()`` is the process's Azurite, the ``azurite`` backend of ``tests.support.stores``
(the launcher in ``objmanifest.local.azurite``); ``azure_store(prefix)`` opens a store in
the test container.
``FlakyTransport`` sits under the SDK's pipeline (so the store's own retry policy, hooks
and error mapping all run above it) and, by plan, answers 503 ``ServerBusy`` or 500
``OperationTimedOut`` without forwarding, fails to connect, or forwards the request and then
loses its answer. ``VersioningTransport`` adds the blob versioning Azurite lacks.
"""

from __future__ import annotations

import io
import itertools
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import requests
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import HttpTransport, RequestsTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse

from objmanifest.core.runtime import Runtime
from objmanifest.local.azurite import LocalAzurite
from objmanifest.store.azure import AzureStore, connect_azure
from tests.support.stores import BUCKET, running

CONTAINER = BUCKET


def azurite() -> LocalAzurite:
    """This process's Azurite (the ``azurite`` backend of the registry, with the test
    container in it)."""
    local = running("azurite").local
    assert isinstance(local, LocalAzurite)
    return local


def azure_store(prefix: str, **client: Any) -> AzureStore:
    """A store of the test container at ``prefix`` (``client``: ``connect_azure``'s)."""
    client.setdefault("connection_string", azurite().connection_string)
    return connect_azure(CONTAINER, prefix, **client)


@dataclass
class Plan:
    """What to do to the next ``times`` requests with ``method`` whose URL contains
    ``where``: ``busy`` (503 ServerBusy), ``timeout`` (500 OperationTimedOut), ``refused``
    (no connection: nothing sent) or ``lost`` (forwarded, applied, its answer lost)."""

    method: str
    where: str
    kind: str
    times: int = 1


class FlakyTransport(HttpTransport):  # type: ignore[type-arg]
    """requests underneath, with planned faults; ``sent`` counts what reached the server
    (``method``) and ``faults`` what was injected (``kind``)."""

    def __init__(self) -> None:
        self.inner = RequestsTransport()
        self.plans: list[Plan] = []
        self.sent: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self._lock = threading.Lock()

    def plan(self, method: str, where: str, kind: str, times: int = 1) -> None:
        assert kind in ("busy", "timeout", "refused", "lost", "garbage"), kind
        with self._lock:
            self.plans.append(Plan(method, where, kind, times))

    def _take(self, request: Any) -> str | None:
        with self._lock:
            for plan in self.plans:
                if plan.times and plan.method == request.method and plan.where in request.url:
                    plan.times -= 1
                    self.faults[plan.kind] += 1
                    return plan.kind
        return None

    def send(self, request: Any, **kwargs: Any) -> Any:
        kind = self._take(request)
        if kind == "refused":
            raise ServiceRequestError("connection refused (injected)")
        if kind in ("busy", "timeout"):
            status, code = (503, "ServerBusy") if kind == "busy" else (500, "OperationTimedOut")
            return _answer(request, status, code)
        if kind == "garbage":
            return _answer(request, 400, "", b"<html>a proxy's page, not Azure's</html>")
        response = self.inner.send(request, **kwargs)
        with self._lock:
            self.sent[request.method] += 1
        if kind == "lost":
            response.internal_response.close()
            raise ServiceResponseError("the connection broke before the answer (injected)")
        return response

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> FlakyTransport:
        self.inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.inner.__exit__(*args)


def _answer(
    request: Any,
    status: int,
    code: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> RestRequestsTransportResponse:
    """An error answer of Azure's shape (or ``body``, with ``headers``), without asking the
    server."""
    raw = requests.Response()
    raw.status_code = status
    raw.reason = code or "Bad Request"
    raw.url = request.url
    xml = f"<Error><Code>{code}</Code><Message>{code} (injected)</Message></Error>"
    raw.raw = io.BytesIO(body if body is not None else xml.encode())
    raw.headers.update({"Content-Type": "application/xml", "Date": formatdate(usegmt=True)})
    raw.headers.update(headers or {})
    if code:
        raw.headers["x-ms-error-code"] = code
    # What RequestsTransport.send makes of an answer to the SDK's requests.
    return RestRequestsTransportResponse(request=request, internal_response=raw)


@dataclass(frozen=True)
class KeptBlob:
    """One version of a blob, as Azure keeps it with blob versioning on."""

    version_id: str
    body: bytes
    etag: str
    last_modified: str


class VersioningTransport(FlakyTransport):
    """Azure's blob versioning, which Azurite 3.37 lacks, kept beside it: every Put Blob
    that lands is a version (its bytes, ETag and time, under a version id of Azure's form,
    the time it was written); a delete leaves the versions and no current one; a List Blobs
    with ``include=versions`` and a Get Blob of a ``versionid`` are answered from them in
    Azure's XML and headers. Everything else goes to Azurite as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, list[KeptBlob]] = {}
        """Blob name -> its versions, oldest first."""
        self.current: dict[str, str | None] = {}
        self._ids = itertools.count(1)

    @staticmethod
    def _name(path: str) -> str:
        return path.split("/", 3)[3]  # /ACCOUNT/CONTAINER/NAME

    def send(self, request: Any, **kwargs: Any) -> Any:
        url = urlsplit(request.url)
        query = parse_qs(url.query)
        if request.method == "GET" and "versionid" in query:
            return self._read(request, self._name(url.path), query["versionid"][0])
        include = ",".join(query.get("include", [])).split(",")
        if request.method == "GET" and query.get("comp") == ["list"] and "versions" in include:
            return self._listing(request, query.get("prefix", [""])[0])
        response = super().send(request, **kwargs)
        if request.method == "PUT" and "comp" not in query and response.status_code == 201:
            name = self._name(url.path)
            now = datetime.now(timezone.utc)
            version_id = f"{now:%Y-%m-%dT%H:%M:%S}.{next(self._ids) % 10**7:07d}Z"
            version = KeptBlob(
                version_id,
                bytes(request.content),
                response.headers["ETag"],
                response.headers["Last-Modified"],
            )
            with self._lock:
                self.kept.setdefault(name, []).append(version)
                self.current[name] = version_id
        elif request.method == "DELETE" and response.status_code == 202 and "comp" not in query:
            with self._lock:
                self.current[self._name(url.path)] = None
        return response

    def _read(self, request: Any, name: str, version_id: str) -> Any:
        found = next((v for v in self.kept.get(name, ()) if v.version_id == version_id), None)
        if found is None:
            return _answer(request, 404, "BlobNotFound")
        size = len(found.body)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
            "Content-Range": f"bytes 0-{max(size - 1, 0)}/{size}",
            "ETag": found.etag,
            "Last-Modified": found.last_modified,
            "x-ms-version-id": found.version_id,
            "x-ms-blob-type": "BlockBlob",
        }
        return _answer(request, 206, "", found.body, headers)

    def _listing(self, request: Any, prefix: str) -> Any:
        rows = []
        with self._lock:
            for name in sorted(n for n in self.kept if n.startswith(prefix)):
                for v in self.kept[name]:
                    current = "true" if self.current.get(name) == v.version_id else "false"
                    rows.append(
                        f"<Blob><Name>{escape(name)}</Name><VersionId>{v.version_id}</VersionId>"
                        f"<IsCurrentVersion>{current}</IsCurrentVersion><Properties>"
                        f"<Last-Modified>{v.last_modified}</Last-Modified>"
                        f"<Etag>{v.etag.strip(chr(34))}</Etag>"  # unquoted, as Azure lists it
                        f"<Content-Length>{len(v.body)}</Content-Length>"
                        "<Content-Type>application/octet-stream</Content-Type>"
                        "<BlobType>BlockBlob</BlobType></Properties></Blob>"
                    )
        xml = (
            '<?xml version="1.0" encoding="utf-8"?><EnumerationResults>'
            f"<Prefix>{escape(prefix)}</Prefix><Blobs>{''.join(rows)}</Blobs><NextMarker />"
            "</EnumerationResults>"
        )
        return _answer(request, 200, "", xml.encode())


def flaky_store(prefix: str, runtime: Runtime | None = None) -> tuple[AzureStore, FlakyTransport]:
    """A store whose requests go through a ``FlakyTransport``, with the store's own retry
    policy (on ``runtime``'s clock: pass one whose sleep does not wait)."""
    transport = FlakyTransport()
    return azure_store(prefix, transport=transport, runtime=runtime), transport
