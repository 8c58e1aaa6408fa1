"""The servers and stores the suites run against: which backends (``backends``), starting
each once per process (``running``) or sharing one between xdist workers (``SharedServers``),
the MemoryStore on warped time (``memory_store``), the session's shard layout
(``layout_options``) and what each backend does with a damaged body (``verifies_digests``).
The fixtures built on them are in ``tests/conftest.py``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from google.api_core.exceptions import Conflict

import objmanifest as om
from objmanifest.core.names import check_name
from objmanifest.core.runtime import DEFAULT as DEFAULT_RUNTIME
from objmanifest.local import fakegcs, servers
from objmanifest.local.azurite import start_azurite
from objmanifest.store.gcs_client import make_gcs_client

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


class ManualClock:
    """A store clock the test moves by hand (``MemoryStore(clock=...)``)."""

    def __init__(self, now: datetime = datetime(2030, 1, 1, tzinfo=timezone.utc)) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


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


def backend_names() -> list[str]:
    if os.environ.get("OBJMANIFEST_TEST_ENDPOINT"):
        return ["endpoint"]
    names = os.environ.get("OBJMANIFEST_TEST_BACKENDS", "memory,file,moto,seaweedfs")
    return [n.strip() for n in names.split(",") if n.strip()]


DIGESTS = os.environ.get("OBJMANIFEST_TEST_DIGESTS", "verified")


"""What ``OBJMANIFEST_TEST_ENDPOINT`` does with a body that does not match its digest:
``verified`` (refused, nothing changed: AWS, MinIO), ``unverified`` (stored as it arrived),
or ``refusal-breaks`` (refused, but the object it would have replaced reads as broken until
the next write: LocalStack 2026.3.0, see docs/chunked.md, "Integrity in transit")."""


if DIGESTS not in ("verified", "unverified", "refusal-breaks"):
    raise pytest.UsageError(
        f"OBJMANIFEST_TEST_DIGESTS={DIGESTS!r}: use verified, unverified or refusal-breaks"
    )


def verifies_digests(name: str) -> bool:
    """Whether the backend refuses a body that does not match its ``Content-MD5``
    (docs/chunked.md, "Integrity in transit"): MemoryStore and SeaweedFS do, the moto server
    stores whatever arrives; another endpoint as ``OBJMANIFEST_TEST_DIGESTS`` says."""
    if name == "endpoint":
        return DIGESTS != "unverified"
    return name != "moto"


def refusal_breaks(name: str) -> bool:
    """Whether a refused damaged write leaves the object it would replace unreadable."""
    return name == "endpoint" and DIGESTS == "refusal-breaks"


S3_SERVERS = ("moto", "seaweedfs", "endpoint")
"""The backends that speak the S3 API (a test of S3 itself, marked ``s3_only``, runs on
these alone)."""

STORES = ("file", "azurite", "fakegcs", "gcs-endpoint")
"""The backends of the other URL schemes: ``file://`` (a directory, no server), ``az://``
on Azurite and ``gs://`` on fake-gcs-server (CI starts both; a newcomer without node runs
memory, file, moto and SeaweedFS), or on the GCS JSON API emulator already running at
``OBJMANIFEST_TEST_GCS_ENDPOINT`` (``gcs-endpoint``: Google's storage-testbench; not run by
CI)."""


VERSIONED_BUCKET = f"{BUCKET}-versions"
"""A bucket that keeps every version of its objects: one of its own, so no other test runs
on a versioned bucket."""

_versioned: set[str] = set()


KEEPS_VERSIONS = ("memory", *S3_SERVERS, "fakegcs", "gcs-endpoint")
"""The backends whose test stores can keep object versions (``versioned_store``): memory
(``versioning=True``), the S3 servers (moto and SeaweedFS implement bucket versioning),
fake-gcs-server (object versioning in its memory backend) and storage-testbench (which
keeps the generations an overwrite replaced in every bucket, but not the one a delete
removes: docs/testing.md, "Other stores"). Azurite implements no blob versioning (Azure's
versions are tested through ``tests/support/azure.py``'s ``VersioningTransport``),
``file://`` keeps none."""


def versioned_url(server: Server, prefix: str) -> str:
    """The URL of ``prefix`` in the versioned bucket of an S3 server or of fake-gcs-server
    (made, and its versioning enabled, on first use)."""
    if server.scheme == "gs":
        if server.name not in _versioned:
            server.local.create_bucket(VERSIONED_BUCKET, versioning=True)
            _versioned.add(server.name)
        return f"gs://{VERSIONED_BUCKET}/{prefix}"
    if server.name not in _versioned:
        client = server.client()
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=VERSIONED_BUCKET)
        client.put_bucket_versioning(
            Bucket=VERSIONED_BUCKET, VersioningConfiguration={"Status": "Enabled"}
        )
        _versioned.add(server.name)
    return f"s3://{VERSIONED_BUCKET}/{prefix}"


def versioned_store(server: Server, prefix: str) -> Any:
    """A store at ``prefix`` whose bucket keeps every version of its objects, on the
    backends that can (``KEEPS_VERSIONS``): the tests marked ``keeps_versions``."""
    if server.name == "memory":
        return om.MemoryStore(
            VERSIONED_BUCKET, prefix, clock=WARP.clock, runtime=WARP.runtime, versioning=True
        )
    return om.connect(versioned_url(server, prefix), endpoint_url=server.endpoint_url)


def backends() -> list[str]:
    """The names of the S3 servers the suites run against."""
    return [n for n in backend_names() if n in S3_SERVERS]


def other_stores() -> list[str]:
    """The backends of the run that are neither in-process nor S3 (``STORES``)."""
    return [n for n in backend_names() if n in STORES]


@dataclass
class Server:
    """A backend the tests can reach: an S3 endpoint, or a store of another scheme, with the
    environment a process needs to reach it.

    ``scheme`` is the URL scheme of its stores; ``root`` the directory under which each
    prefix of a ``file`` backend is a store of its own (``LACKS`` says what its emulator
    does not enforce)."""

    name: str
    endpoint_url: str
    env: dict[str, str] = field(default_factory=dict)
    local: Any = None
    scheme: str = "s3"
    root: str = ""
    bucket: str = BUCKET

    @property
    def s3(self) -> bool:
        """Whether it speaks the S3 API (a boto3 client, a fault proxy in front of it)."""
        return self.scheme == "s3"

    def client(self):  # type: ignore[no-untyped-def]
        assert self.s3, f"{self.name} is no S3 server: it has no S3 client"
        return om.store.make_client(self.endpoint_url, region=self.env.get("AWS_DEFAULT_REGION"))

    def url(self, prefix: str) -> str:
        """The URL of the store at ``prefix`` (for ``file``, its directory, made if need be)."""
        if self.scheme == "file":
            directory = Path(self.root, prefix)
            directory.mkdir(parents=True, exist_ok=True)
            return f"file://{directory}"
        return f"{self.scheme}://{self.bucket}/{prefix}"

    def open(self, prefix: str) -> Any:
        """The backend's own store at ``prefix``, as ``om.connect`` opens it."""
        if self.scheme == "file":
            return om.connect(self.url(prefix))
        return om.connect(self.url(prefix), endpoint_url=self.endpoint_url)

    def connect(self, prefix: str, endpoint_url: str | None = None) -> Any:
        """The store at ``prefix`` a test runs on: an S3 store (through ``endpoint_url``, a
        proxy, if given), or, for the other backends, their store inside a ``FaultyStore``
        (as ``MemoryStore`` is one), whose hooks count and hold its calls (``rawstore``,
        ``tests/support/backends.py``)."""
        if self.name == "memory":
            return memory_store(prefix)
        if not self.s3:
            return om.store.FaultyStore(self.open(prefix))
        return om.connect(self.url(prefix), endpoint_url=endpoint_url or self.endpoint_url)


CAPABILITIES: dict[str, str] = {
    "conditional_completion": "a multipart completion refused where an object exists",
    "version_expiry": "one kept version of an object removed for good, as a lifecycle "
    "rule's expiry does",
}
"""Capabilities of the seam a test may be marked as needing (``needs(CAPABILITY)``), each
with what it is."""

LACKS: dict[str, dict[str, str]] = {
    "fakegcs": {
        "conditional_completion": "tests/test_gcs_store.py::"
        "test_concurrent_create_only_completions_have_exactly_one_winner (the GCS double, "
        "which enforces ifGenerationMatch on compose as GCS does)",
        "version_expiry": "the same test on memory and the S3 servers (fake-gcs-server "
        "v1.54's delete ignores generation=: it removes the live object instead; what the "
        "test checks is repair's choice, the same on every store)",
    },
}
"""Backend -> the capabilities its emulator does not enforce, each with the test that
covers that capability instead (a transport double that enforces it, or the real service).
A test that needs one runs there as a strict xfail: it must fail, so an emulator that
learns the capability is noticed; the run's summary counts them."""


def lacks(backend: str) -> dict[str, str]:
    """The capabilities ``backend`` lacks (``LACKS``)."""
    return LACKS.get(backend, {})


_running: dict[str, Server] = {}


SHARED = ("seaweedfs",)


"""Servers the xdist workers of one run share (see the module's docstring)."""


SHARED_DIR = "OBJMANIFEST_TEST_SHARED"


_SHARED_WAIT = 180.0


class SharedServers:
    """The controller's side: a thread that starts a shared server once a worker asks for
    it (``NAME.want`` appears in the directory) and publishes ``NAME.json`` (its endpoint
    and environment) or ``NAME.error``; ``stop`` ends the thread and the servers."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="objmanifest-tests-"))
        self.started: list[servers.LocalS3] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="shared-servers", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        waiting = list(SHARED)
        while waiting and not self._done.wait(0.05):
            for name in [n for n in waiting if (self.dir / f"{n}.want").exists()]:
                waiting.remove(name)
                try:
                    local = servers.start(name)
                except Exception as e:
                    (self.dir / f"{name}.error").write_text(f"{type(e).__name__}: {e}")
                    continue
                self.started.append(local)
                ready = {"endpoint_url": local.endpoint_url, "env": local.env()}
                (self.dir / f"{name}.tmp").write_text(json.dumps(ready))
                (self.dir / f"{name}.tmp").rename(self.dir / f"{name}.json")

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        for local in self.started:
            local.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _shared(name: str, directory: Path) -> Server:
    """A worker's side: ask the controller for ``name`` and wait until it runs."""
    with contextlib.suppress(FileExistsError):
        (directory / f"{name}.want").touch(exist_ok=False)
    deadline = time.monotonic() + _SHARED_WAIT
    while not (directory / f"{name}.json").exists():
        error = directory / f"{name}.error"
        if error.exists():
            raise servers.LocalServerError(f"the shared {name} did not start: {error.read_text()}")
        if time.monotonic() > deadline:
            raise servers.LocalServerError(f"the shared {name} did not start in {_SHARED_WAIT}s")
        time.sleep(0.05)
    ready = json.loads((directory / f"{name}.json").read_text())
    return Server(name, ready["endpoint_url"], ready["env"])


def _azurite() -> Server:
    """Azurite on loopback (installed by scripts/test.sh), with the test container."""
    local = start_azurite()
    service = BlobServiceClient.from_connection_string(local.connection_string)
    with contextlib.suppress(ResourceExistsError):
        service.create_container(BUCKET)
    return Server("azurite", local.account_url, local.env(), local, scheme="az")


def start_fakegcs() -> Server:
    """fake-gcs-server of this process (it starts in a tenth of a second), its bucket made."""
    local = fakegcs.start_fakegcs()
    local.create_bucket(BUCKET)
    return Server("fakegcs", local.endpoint_url, local.env(), local, scheme="gs")


@dataclass
class GCSEndpoint:
    """A GCS JSON API emulator someone else runs (storage-testbench), reached anonymously as
    ``STORAGE_EMULATOR_HOST`` says: its buckets are made here, it is not stopped here."""

    endpoint_url: str

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def create_bucket(self, name: str, *, versioning: bool = False) -> None:
        """Create ``name`` (keeping every generation, if ``versioning``); one that exists
        is fine (xdist workers share the emulator)."""
        client = make_gcs_client(self.endpoint_url).client
        bucket = client.bucket(name)
        bucket.versioning_enabled = versioning
        with contextlib.suppress(Conflict):
            client.create_bucket(bucket)

    def stop(self) -> None:
        pass


def gcs_endpoint() -> Server:
    """The emulator at ``OBJMANIFEST_TEST_GCS_ENDPOINT``, its bucket made."""
    url = os.environ.get("OBJMANIFEST_TEST_GCS_ENDPOINT")
    if not url:
        raise pytest.UsageError(
            "the gcs-endpoint backend needs OBJMANIFEST_TEST_GCS_ENDPOINT, the URL of a GCS "
            "JSON API emulator such as storage-testbench (http://127.0.0.1:9000)"
        )
    local = GCSEndpoint(url)
    local.create_bucket(BUCKET)
    return Server("gcs-endpoint", url, local.env(), local, scheme="gs")


STARTS: dict[str, Callable[[], Server]] = {
    "file": lambda: Server(
        "file", "", scheme="file", root=tempfile.mkdtemp(prefix="objmanifest-file-store-")
    ),
    "azurite": _azurite,
    "fakegcs": start_fakegcs,
    "gcs-endpoint": gcs_endpoint,
}
"""How each backend that is neither in-process nor S3 is started (``STORES``): a server of
its own and its container or bucket made, or, for ``file``, a directory of this process's
(every prefix a store of its own under it, which other processes reach through the URL)."""


def _start(name: str) -> Server:
    if name == "memory":
        return Server(name, "", scheme="memory")
    if name in STARTS:
        server = STARTS[name]()
        os.environ.update(server.env)
        return server
    if name in STORES:
        raise pytest.UsageError(f"the {name} backend is not wired into the test suites yet")
    shared_dir = os.environ.get(SHARED_DIR)
    if name in SHARED and shared_dir:
        server = _shared(name, Path(shared_dir))
    elif name == "endpoint":
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


def running(name: str) -> Server:
    """The server called ``name``, started on first use and stopped when the session ends."""
    if name not in _running:
        _running[name] = _start(name)
    return _running[name]


def stop_all() -> None:
    """Stop the servers this process started, and remove the directory of its ``file``
    stores (the session's end)."""
    for server in _running.values():
        if server.local is not None:
            server.local.stop()
        if server.scheme == "file" and server.root:
            shutil.rmtree(server.root, ignore_errors=True)
    _running.clear()
