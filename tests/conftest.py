"""Fixtures: real S3 servers, one behaviour suite run against each.

Backends come from ``OBJMANIFEST_TEST_BACKENDS`` (default ``moto,seaweedfs``). To run the
suite against any other S3 (LocalStack, MinIO, AWS), set ``OBJMANIFEST_TEST_ENDPOINT`` to
its URL (and ``OBJMANIFEST_TEST_BUCKET``, default ``objmanifest-test``, which is created if
missing); the backend is then called ``endpoint``. A server that fails to start is an
error, never a skip.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import objmanifest as om
from objmanifest import servers

BUCKET = os.environ.get("OBJMANIFEST_TEST_BUCKET", "objmanifest-test")


def backends() -> list[str]:
    """The names of the S3 servers the suites run against."""
    if os.environ.get("OBJMANIFEST_TEST_ENDPOINT"):
        return ["endpoint"]
    names = os.environ.get("OBJMANIFEST_TEST_BACKENDS", "moto,seaweedfs")
    return [n.strip() for n in names.split(",") if n.strip()]


@dataclass
class Server:
    """A running S3 endpoint the tests can reach, with the environment to reach it."""

    name: str
    endpoint_url: str
    env: dict[str, str] = field(default_factory=dict)
    local: servers.LocalS3 | None = None

    def client(self):  # type: ignore[no-untyped-def]
        return om.store.make_client(self.endpoint_url, region=self.env.get("AWS_DEFAULT_REGION"))

    def connect(self, prefix: str, endpoint_url: str | None = None) -> om.Store:
        return om.connect(f"s3://{BUCKET}/{prefix}", endpoint_url=endpoint_url or self.endpoint_url)


_running: dict[str, Server] = {}
_moto_serialised = False


def serialise_moto_writes() -> None:
    """Make the in-process moto apply object writes one at a time, as S3 does.

    moto checks a write's ``If-Match`` / ``If-None-Match`` and then applies it with no lock
    between, and its server runs each request in a thread of its own: two racing
    conditional writes can both pass (two creates of one key both win about once in a
    hundred 8-thread races). The race tests are about our code, not moto's, so every
    write to an object (put, copy, delete, multipart completion) holds one lock here.
    """
    global _moto_serialised
    if _moto_serialised:
        return
    from moto.s3.responses import S3Response

    lock = threading.RLock()
    for name in ("put_object", "copy_object", "delete_object", "_key_response_post"):
        original = getattr(S3Response, name)

        @functools.wraps(original)
        def one_at_a_time(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return _original(self, *args, **kwargs)

        setattr(S3Response, name, one_at_a_time)
    _moto_serialised = True


def _start(name: str) -> Server:
    if name == "endpoint":
        endpoint = os.environ["OBJMANIFEST_TEST_ENDPOINT"]
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", servers.LOCAL_ACCESS_KEY),
            "AWS_SECRET_ACCESS_KEY": os.environ.get(
                "AWS_SECRET_ACCESS_KEY", servers.LOCAL_SECRET_KEY
            ),
            "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", servers.LOCAL_REGION),
        }
        server = Server(name, endpoint, env)
    else:
        if name == "moto":
            serialise_moto_writes()
        local = servers.start(name)
        server = Server(name, local.endpoint_url, local.env(), local)
    os.environ.update({k: v for k, v in server.env.items() if k != "AWS_ENDPOINT_URL"})
    client = server.client()
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except client.exceptions.BucketAlreadyExists:
        pass
    return server


def running(name: str) -> Server:
    """The server called ``name``, started on first use and stopped when the session ends."""
    if name not in _running:
        _running[name] = _start(name)
    return _running[name]


@pytest.fixture(scope="session", params=backends())
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    yield running(request.param)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for server in _running.values():
        if server.local is not None:
            server.local.stop()


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(server: Server, prefix: str) -> om.Store:
    return server.connect(prefix)


@pytest.fixture
def task(store: om.Store) -> om.Task:
    return om.Task.create(
        store, "job", stages=["collect", "write", "check"], lease_seconds=30, max_retries=2
    )
