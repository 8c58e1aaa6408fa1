"""Azurite for the tests that need an ``az://`` store, and a transport double that makes the
SDK meet what a healthy emulator never answers.

``azurite()`` is the process's Azurite, the ``azurite`` backend of ``tests.support.stores``
(the launcher in ``objmanifest.local.azurite``); ``azure_store(prefix)`` opens a store in
the test container.
``FlakyTransport`` sits under the SDK's pipeline (so the store's own retry policy, hooks
and error mapping all run above it) and, by plan, answers 503 ``ServerBusy`` or 500
``OperationTimedOut`` without forwarding, fails to connect, or forwards the request and then
loses its answer.
"""

from __future__ import annotations

import io
import threading
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

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
    request: Any, status: int, code: str, body: bytes | None = None
) -> RestRequestsTransportResponse:
    """An error answer of Azure's shape (or ``body``), without asking the server."""
    raw = requests.Response()
    raw.status_code = status
    raw.reason = code or "Bad Request"
    raw.url = request.url
    xml = f"<Error><Code>{code}</Code><Message>{code} (injected)</Message></Error>"
    raw.raw = io.BytesIO(body or xml.encode())
    raw.headers.update({"Content-Type": "application/xml", "Date": formatdate(usegmt=True)})
    if code:
        raw.headers["x-ms-error-code"] = code
    # What RequestsTransport.send makes of an answer to the SDK's requests.
    return RestRequestsTransportResponse(request=request, internal_response=raw)


def flaky_store(prefix: str, runtime: Runtime | None = None) -> tuple[AzureStore, FlakyTransport]:
    """A store whose requests go through a ``FlakyTransport``, with the store's own retry
    policy (on ``runtime``'s clock: pass one whose sleep does not wait)."""
    transport = FlakyTransport()
    return azure_store(prefix, transport=transport, runtime=runtime), transport
