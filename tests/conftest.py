"""Fixtures: real S3 servers and the in-process MemoryStore, one behaviour suite run
against each.

Backends come from ``OBJMANIFEST_TEST_BACKENDS`` (default ``memory,moto,seaweedfs``). To
run the suite against any other S3 (LocalStack, MinIO, AWS), set
``OBJMANIFEST_TEST_ENDPOINT`` to its URL (and ``OBJMANIFEST_TEST_BUCKET``, default
``objmanifest-test``, which is created if missing); the backend is then called
``endpoint``. A server that fails to start is an error, never a skip.

``memory`` is a backend of the behaviour and conformance suites (tests marked
``behaviour`` or ``conformance``) only: the other tests drive other processes (the CLI,
agents in subprocesses) or the network (fault-injecting proxies), which an in-process store
cannot serve, so they are deselected there, as are behaviour tests marked ``s3_only``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import rawstore

import objmanifest as om
from objmanifest import servers
from objmanifest.manifest import Manifest
from objmanifest.model import check_name
from objmanifest.runtime import DEFAULT as DEFAULT_RUNTIME

BUCKET = os.environ.get("OBJMANIFEST_TEST_BUCKET", "objmanifest-test")


class Warp:
    """Time for the memory backend, running ``factor`` times faster than the wall clock: the
    store's clock and the runtime's monotonic clock, sleeps and background intervals all
    agree, so leases expire (and are renewed) ``factor`` times sooner and the behaviour suite
    spends its waits in fractions of the time. One per session: every MemoryStore of a test
    shares it."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.start = time.monotonic()
        self.epoch = datetime.now(timezone.utc)
        self.runtime = om.Runtime(
            monotonic=self.monotonic,
            sleep=lambda seconds: time.sleep(seconds / factor),
            every=lambda job, interval, name: DEFAULT_RUNTIME.every(job, interval / factor, name),
        )

    def monotonic(self) -> float:
        return self.start + (time.monotonic() - self.start) * self.factor

    def clock(self) -> datetime:
        return self.epoch + timedelta(seconds=self.monotonic() - self.start)


WARP = Warp(float(os.environ.get("OBJMANIFEST_TEST_MEMORY_WARP", "10")))


def memory_store(prefix: str, skew: float | None = None) -> om.MemoryStore:
    """A MemoryStore of the test bucket on the session's warped time; or, with ``skew``, on
    this machine's wall clock shifted by ``skew`` seconds (a store whose clock is off)."""
    if skew is None:
        return om.MemoryStore(BUCKET, prefix, clock=WARP.clock, runtime=WARP.runtime)
    offset = timedelta(seconds=skew)
    return om.MemoryStore(BUCKET, prefix, clock=lambda: datetime.now(timezone.utc) + offset)


LAYOUT = os.environ.get("OBJMANIFEST_TEST_LAYOUT", "stage")
"""The shard layout of every task the tests create without choosing one: ``stage`` (one
shard per stage, the default), ``partitioned`` (every stage split into three partitions)
or ``task`` (one shard for the whole task)."""
if LAYOUT not in ("stage", "partitioned", "task"):
    raise pytest.UsageError(f"OBJMANIFEST_TEST_LAYOUT={LAYOUT!r}: use stage, partitioned or task")


def layout_options(stages: Any) -> dict[str, Any]:
    """What ``Task.create`` is given under the session's layout, for ``stages`` (nothing for
    stage lists a create would refuse anyway, so its error is the one tested)."""
    if LAYOUT == "stage" or isinstance(stages, (str, bytes, dict)):
        return {}
    names = list(stages)
    try:
        for name in names:
            check_name("stage", name)
    except ValueError:
        return {}
    if not names or len(set(names)) != len(names):
        return {}
    if LAYOUT == "task":
        return {"layout": "task"}
    return {"partitions": dict.fromkeys(names, 3)}


@pytest.fixture(autouse=True)
def _session_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``OBJMANIFEST_TEST_LAYOUT``, tasks created in this process take its layout."""
    if LAYOUT == "stage":
        return
    create = Manifest.create.__func__  # type: ignore[attr-defined]

    def create_in_layout(
        cls: Any, store: Any, task_id: str, stages: Any, *a: Any, **kw: Any
    ) -> Any:
        if "partitions" not in kw and "layout" not in kw:
            stages = list(stages) if not isinstance(stages, (str, bytes, dict)) else stages
            kw.update(layout_options(stages))
        return create(cls, store, task_id, stages, *a, **kw)

    monkeypatch.setattr(Manifest, "create", classmethod(create_in_layout))


def _names() -> list[str]:
    if os.environ.get("OBJMANIFEST_TEST_ENDPOINT"):
        return ["endpoint"]
    names = os.environ.get("OBJMANIFEST_TEST_BACKENDS", "memory,moto,seaweedfs")
    return [n.strip() for n in names.split(",") if n.strip()]


DIGESTS = os.environ.get("OBJMANIFEST_TEST_DIGESTS", "verified")
"""What ``OBJMANIFEST_TEST_ENDPOINT`` does with a body that does not match its digest:
``verified`` (refused, nothing changed: AWS, MinIO), ``unverified`` (stored as it arrived),
or ``refusal-breaks`` (refused, but the object it would have replaced reads as broken until
the next write: LocalStack 2026.3.0, see README "Integrity in transit")."""
if DIGESTS not in ("verified", "unverified", "refusal-breaks"):
    raise pytest.UsageError(
        f"OBJMANIFEST_TEST_DIGESTS={DIGESTS!r}: use verified, unverified or refusal-breaks"
    )


def verifies_digests(name: str) -> bool:
    """Whether the backend refuses a body that does not match its ``Content-MD5`` (README,
    "Integrity in transit"): MemoryStore and SeaweedFS do, the moto server stores whatever
    arrives; another endpoint as ``OBJMANIFEST_TEST_DIGESTS`` says."""
    if name == "endpoint":
        return DIGESTS != "unverified"
    return name != "moto"


def refusal_breaks(name: str) -> bool:
    """Whether a refused damaged write leaves the object it would replace unreadable."""
    return name == "endpoint" and DIGESTS == "refusal-breaks"


def backends() -> list[str]:
    """The names of the S3 servers the suites run against."""
    return [n for n in _names() if n != "memory"]


@dataclass
class Server:
    """A running S3 endpoint the tests can reach, with the environment to reach it."""

    name: str
    endpoint_url: str
    env: dict[str, str] = field(default_factory=dict)
    local: servers.LocalS3 | None = None

    def client(self):  # type: ignore[no-untyped-def]
        assert self.name != "memory", "an in-process store has no S3 client"
        return om.store.make_client(self.endpoint_url, region=self.env.get("AWS_DEFAULT_REGION"))

    def connect(self, prefix: str, endpoint_url: str | None = None) -> Any:
        if self.name == "memory":
            return memory_store(prefix)
        return om.connect(f"s3://{BUCKET}/{prefix}", endpoint_url=endpoint_url or self.endpoint_url)


_running: dict[str, Server] = {}


def _start(name: str) -> Server:
    if name == "memory":
        return Server(name, "")
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run a test on ``memory`` only if it is a behaviour or conformance test that does not
    need S3 itself (see the module's docstring); under a shard layout other than the
    default, leave out the tests that name a stage's own shard."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_memory = callspec is not None and callspec.params.get("server") == "memory"
        applies = (
            item.get_closest_marker("behaviour") or item.get_closest_marker("conformance")
        ) and not item.get_closest_marker("s3_only")
        other_layout = LAYOUT != "stage" and item.get_closest_marker("stage_layout")
        (dropped if (on_memory and not applies) or other_layout else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def running(name: str) -> Server:
    """The server called ``name``, started on first use and stopped when the session ends."""
    if name not in _running:
        _running[name] = _start(name)
    return _running[name]


@pytest.fixture(scope="session", params=_names())
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
def store(server: Server, prefix: str) -> Iterator[Any]:
    store = server.connect(prefix)
    yield store
    if server.name == "memory":  # this process holds the objects: free them
        for key, upload_id in list(store.list_uploads("")):
            store.abort_upload(key, upload_id)
        for key in list(store.list_keys("")):
            store.delete(key)


@pytest.fixture
def task(store: om.Store) -> om.Task:
    return om.Task.create(
        store, "job", stages=["collect", "write", "check"], lease_seconds=30, max_retries=2
    )


# -- raw objects -------------------------------------------------------------------------
# Tests that must reach objects behind the manifest's back (tampering, corrupting, deleting)
# go through ``rawstore``, one place that knows each backend.

raw_put = rawstore.put
raw_get = rawstore.get
raw_delete = rawstore.delete
store_date = rawstore.date
requests = rawstore.requests
