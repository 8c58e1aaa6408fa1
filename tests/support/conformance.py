"""What the conformance suites share: data and digests, the ``Backend`` a test runs on and
how it plans faults there (``FaultyStore`` around any store, a ``FaultProxy`` in front of an
S3 server), and the fixtures that hand each test a fresh store.

``tests/test_conformance.py`` holds what every store must do; ``tests/test_conformance_s3.py``
what is S3's own (part ETags that are MD5s, the multipart ETag, the 5 MiB minimum part, the
wire), run on the backends with S3's semantics (``MemoryStore`` and the S3 servers).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from objmanifest.store import (
    ByteStream,
    FaultyStore,
    MemoryStore,
    ObjectStore,
    S3Store,
    make_client,
)
from tests.support.faults import FaultProxy
from tests.support.stores import (
    BUCKET,
    Server,
    backends,
    other_stores,
    refusal_breaks,
    running,
    verifies_digests,
)

MEMORY_BUCKET = "conformance"
MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part (but the last)
THREADS = 8
STALE = '"00000000000000000000000000000000"'
# botocore's ``total_max_attempts`` counts tries: 1 is no retry, so a lost answer reaches us.
NO_RETRY: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}


def data(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


INJECTIONS = ("wrapper", "proxy")
"""How faults reach a backend: ``FaultyStore`` around its store (every backend), or a
``FaultProxy`` between an S3 store and its server (servers only)."""


def faulted(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` on every backend through the wrapper, and on every S3 server through the
    proxy too (``backend.injection`` says which)."""
    cases = [
        ("memory", "wrapper"),
        *((n, "wrapper") for n in other_stores()),
        *((n, how) for n in backends() for how in INJECTIONS),
    ]
    return pytest.mark.parametrize(
        "backend", cases, indirect=True, ids=["-".join(case) for case in cases]
    )(test)


@dataclass
class Faulty:
    """A store whose next calls can be made to fail the way a network fails them."""

    store: ObjectStore
    lose: Callable[[str, str], None]
    """``lose(op, key)``: the next ``op`` ("put", "complete_upload" or "delete") of ``key`` is
    applied and its answer lost."""
    cut: Callable[[str, int], None]
    """``cut(key, size)``: the body of the next read of ``key`` (``size`` bytes) breaks off
    after half of them."""
    fired: Callable[[], int]
    """How many planned faults took effect."""
    damage: Callable[[str, str, str, int], None]
    """``damage(op, key, how, times)``: the bodies of the next ``times`` ``op`` ("put" or
    "upload_part") of ``key`` are damaged on their way in (``how``: "flip" or "truncate")."""
    verifies: bool
    """Whether a whole object damaged on its way is refused (and sent again): always through
    the wrapper; through the proxy, as the server does (``verifies_digests``)."""
    refusal_breaks: bool = False
    """Whether a refused damaged write leaves the object it would replace unreadable."""


@dataclass
class Backend:
    """One implementation of the seam: ``MemoryStore``, an S3 server or a store of another
    scheme, and how ``faulty`` plans faults on it (``INJECTIONS``)."""

    name: str
    server: Server | None = None
    injection: str = "wrapper"
    _client: Any = field(default=None, repr=False)

    def connect(self, prefix: str) -> ObjectStore:
        """A new store at ``prefix`` (with a clock of its own). The stores of one server
        share one boto3 client: making a client takes longer than most tests here."""
        if self.server is None:
            return MemoryStore(MEMORY_BUCKET, prefix)
        if not self.server.s3:
            return self.server.open(prefix)
        if self._client is None:
            self._client = self.server.client()
        return S3Store(self._client, BUCKET, prefix)

    @contextmanager
    def faulty(self, prefix: str) -> Iterator[Faulty]:
        """The store at ``prefix``, with faults that can be planned: ``FaultyStore`` around
        it (``MemoryStore`` is that already), or a ``FaultProxy`` (and a client that does
        not retry) in front of a server."""
        if self.injection == "wrapper":
            wrapped = (
                MemoryStore(MEMORY_BUCKET, prefix)
                if self.server is None
                else FaultyStore(self.connect(prefix))
            )
            faults = wrapped.faults

            def lose(op: str, key: str) -> None:
                faults.add(op, key, effect="lose")

            def cut(key: str, size: int) -> None:
                faults.add("open", key, effect="cut")

            def fired() -> int:
                return sum(1 - fault.times for fault in faults.planned)

            def damage(op: str, key: str, how: str, times: int) -> None:
                for _ in range(times):  # one fault each: ``fired`` counts faults used up
                    faults.add(op, key, effect=how)  # type: ignore[arg-type]

            yield Faulty(wrapped, lose, cut, fired, damage, verifies=True)
            return
        assert self.server is not None and self.server.s3, "a proxy stands in front of S3"

        with FaultProxy(self.server.endpoint_url) as proxy:
            through = S3Store(make_client(proxy.endpoint_url, **NO_RETRY), BUCKET, prefix)
            methods = {
                "put": ("PUT", ""),
                "complete_upload": ("POST", "?uploadId="),
                "delete": ("DELETE", ""),
            }

            def lose_s3(op: str, key: str) -> None:
                method, query = methods[op]
                proxy.drop_response(method, f"/{BUCKET}/{through.full_key(key)}{query}")

            def cut_s3(key: str, size: int) -> None:
                proxy.cut_response("GET", f"/{BUCKET}/{through.full_key(key)}", size // 2)

            def damage_s3(op: str, key: str, how: str, times: int) -> None:
                path = f"/{BUCKET}/{through.full_key(key)}"
                proxy.damage_request("PUT", path, times, how, once=False)

            def fired_s3() -> int:
                return proxy.dropped + proxy.cut + len(proxy.damaged)

            yield Faulty(
                through,
                lose_s3,
                cut_s3,
                fired_s3,
                damage_s3,
                verifies=verifies_digests(self.name),
                refusal_breaks=refusal_breaks(self.name),
            )

    @contextmanager
    def small_pages(self, store: ObjectStore) -> Iterator[None]:
        """List in pages of two (keys, uploads, parts), to go through every page boundary
        without thousands of objects. A ``MemoryStore`` has no pages: nothing changes."""
        if not isinstance(store, S3Store):
            yield
            return
        limits = {"ListObjectsV2": "MaxKeys", "ListMultipartUploads": "MaxUploads"}
        limits["ListParts"] = "MaxParts"

        def limit(params: dict[str, Any], model: Any, **_: Any) -> None:
            if model.name in limits:
                params[limits[model.name]] = 2

        events = store.client.meta.events
        events.register("provide-client-params.s3", limit)
        try:
            yield
        finally:
            events.unregister("provide-client-params.s3", limit)


def assert_own_stream(stream: object) -> None:
    """The stream is our ``ByteStream``, not something of the backend's client library."""
    assert isinstance(stream, ByteStream)
    module = type(stream).__module__
    assert not module.startswith(
        ("botocore", "boto3", "urllib3", "s3transfer", "azure", "google", "requests")
    ), module


def make_backend(request: pytest.FixtureRequest) -> Backend:
    """A backend by name; a test marked ``faulted`` names how its faults reach it too."""
    name, injection = request.param if isinstance(request.param, tuple) else (request.param, "")
    server = None if name == "memory" else running(name)
    return Backend(name, server, injection or "wrapper")


def fresh_store(backend: Backend, prefix: str) -> Iterator[ObjectStore]:
    """A fresh store under a prefix of its own; its unfinished uploads are aborted after."""
    fresh = backend.connect(prefix)
    yield fresh
    for key, upload_id in list(fresh.list_uploads("")):
        fresh.abort_upload(key, upload_id)
