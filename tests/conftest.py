"""Fixtures: real S3 servers, one behaviour suite run against each.

Backends come from ``OBJMANIFEST_TEST_BACKENDS`` (default ``moto,seaweedfs``). To run the
suite against any other S3 (LocalStack, MinIO, AWS), set ``OBJMANIFEST_TEST_ENDPOINT`` to
its URL (and ``OBJMANIFEST_TEST_BUCKET``, default ``objmanifest-test``, which is created if
missing); the backend is then called ``endpoint``. A server that fails to start is an
error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import pytest

import objmanifest as om
from objmanifest import servers

BUCKET = os.environ.get("OBJMANIFEST_TEST_BUCKET", "objmanifest-test")


def _backends() -> list[str]:
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


@pytest.fixture(scope="session", params=_backends())
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    name = request.param
    if name not in _running:
        _running[name] = _start(name)
    yield _running[name]


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


# -- raw objects -------------------------------------------------------------------------
# Tests that must reach objects behind the manifest's back (tampering, corrupting, deleting)
# go through these, so there is one place to point them at another storage backend.


def raw_put(store: om.Store, key: str, body: bytes) -> None:
    """Write ``key`` (relative to the store's prefix) unconditionally."""
    store.client.put_object(Bucket=store.bucket, Key=store.full_key(key), Body=body)


def raw_get(store: om.Store, key: str) -> bytes:
    """The bytes of ``key`` as the store has them."""
    return store.client.get_object(Bucket=store.bucket, Key=store.full_key(key))["Body"].read()


def raw_delete(store: om.Store, key: str) -> None:
    store.client.delete_object(Bucket=store.bucket, Key=store.full_key(key))


def store_date(store: om.Store) -> datetime:
    """The store's clock, from the ``Date`` of a fresh response (whole seconds)."""
    r = store.client.list_objects_v2(Bucket=store.bucket, MaxKeys=1)
    return parsedate_to_datetime(r["ResponseMetadata"]["HTTPHeaders"]["date"])


@contextlib.contextmanager
def requests(store: om.Store) -> Iterator[Counter[str]]:
    """Count the S3 operations the store's client sends while the block runs."""
    seen: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        seen[model.name] += 1

    events = store.client.meta.events
    events.register("before-call.s3", count)
    try:
        yield seen
    finally:
        events.unregister("before-call.s3", count)
