"""Fixtures: real S3 servers and the in-process MemoryStore, one behaviour suite run
against each.

Backends come from ``OBJMANIFEST_TEST_BACKENDS`` (default ``memory,file,moto,seaweedfs``:
what a newcomer has without node; ``file`` is a directory of the run's). To
run the suite against any other S3 (LocalStack, MinIO, AWS), set
``OBJMANIFEST_TEST_ENDPOINT`` to its URL (and ``OBJMANIFEST_TEST_BUCKET``, default
``objmanifest-test``, which is created if missing); the backend is then called
``endpoint``. A server that fails to start is an error, never a skip.

``memory`` is a backend of the behaviour and conformance suites (tests marked
``behaviour`` or ``conformance``) only: the other tests drive other processes (the CLI,
agents in subprocesses) or the network (fault-injecting proxies), which an in-process store
cannot serve, so they are deselected there, as are behaviour tests marked ``s3_only``.

Under pytest-xdist (``-n N``, what ``scripts/test.sh`` runs) every worker runs its own moto
server (it lives in the worker's process, next to the tests that call it) but all of them
share one SeaweedFS: the controller starts it when the first worker asks for it, hands its
endpoint over through a directory of its own (``OBJMANIFEST_TEST_SHARED``), and stops it
when the run ends. Tests never share a prefix, so sharing a server shares nothing else.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

import objmanifest as om
from tests.support.stores import (
    KEEPS_VERSIONS,
    LAYOUT,
    SHARED_DIR,
    STORES,
    Server,
    SharedServers,
    backend_names,
    backends,
    lacks,
    layout_options,
    other_stores,
    running,
    stop_all,
)

# Hypothesis's per-example deadline (200 ms) is a timed assertion: a busy machine or a run
# beside other workers fails it. Its "ci" profile (loaded when CI is set) has none; outside
# CI the default profile loses it too. --hypothesis-profile still picks any other.
if settings.get_current_profile_name() == "default":
    settings.register_profile("objmanifest", deadline=None)
    settings.load_profile("objmanifest")


@pytest.fixture(autouse=True)
def _session_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``OBJMANIFEST_TEST_LAYOUT``, tasks created in this process take its layout."""
    if LAYOUT == "stage":
        return
    create = om.Task.create.__func__  # type: ignore[attr-defined]

    def create_in_layout(
        cls: Any, store: Any, task_id: str, stages: Any, *a: Any, **kw: Any
    ) -> Any:
        if "partitions" not in kw and "layout" not in kw:
            stages = list(stages) if not isinstance(stages, (str, bytes, dict)) else stages
            kw.update(layout_options(stages))
        return create(cls, store, task_id, stages, *a, **kw)

    monkeypatch.setattr(om.Task, "create", classmethod(create_in_layout))


_SHARED_KEY = pytest.StashKey[SharedServers]()


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller (``-n N``) serves the shared servers to its workers."""
    xdist_controller = not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"
    if xdist_controller and not os.environ.get("OBJMANIFEST_TEST_ENDPOINT"):
        shared = SharedServers()
        os.environ[SHARED_DIR] = str(shared.dir)  # the workers, spawned next, inherit it
        config.stash[_SHARED_KEY] = shared


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED_KEY, None)
    if shared is not None:
        shared.stop()
        os.environ.pop(SHARED_DIR, None)


def backend_of(item: pytest.Item) -> str | None:
    """The backend a test runs on: its ``server`` or ``backend`` parameter (a conformance
    test's may be ``(name, injection)``), or None."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name in ("server", "backend"):
        value = callspec.params.get(name)
        if value is not None:
            return str(value[0] if isinstance(value, tuple) else value)
    return None


LACKING = "lacks "
"""How the reason of a capability's strict xfail begins (the run's summary counts them)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run a test on ``memory`` only if it is a behaviour or conformance test that needs
    neither S3 itself nor processes of its own (see the module's docstring), on a store of
    another scheme (``file``, Azurite, fake-gcs-server) only if it is a behaviour or
    conformance test that does not need S3; a test of a face whose backend does not matter
    (``one_server``: the CLI, the MCP server, the web page's CLI) on the first S3 server only,
    or, in a run without one, on the first store of another scheme (``file``: the faces'
    suites without a server);
    a test of the versions a store keeps (``keeps_versions``) only where its store keeps them
    (``KEEPS_VERSIONS``: memory, with ``versioning=True``, the S3 servers and
    fake-gcs-server);
    under a shard layout other than the default, leave out the tests that name a stage's own
    shard. A test that ``needs`` a capability its backend's emulator lacks runs as a strict
    xfail."""
    first_s3 = next(iter(backends()), None)
    faces_on = first_s3 or next(iter(other_stores()), None)
    kept, dropped = [], []
    for item in items:
        on = backend_of(item)
        suite = bool(item.get_closest_marker("behaviour") or item.get_closest_marker("conformance"))
        s3_only = bool(item.get_closest_marker("s3_only"))
        if on == "memory":
            skip = not suite or s3_only or bool(item.get_closest_marker("processes"))
        elif on in STORES:
            face = bool(item.get_closest_marker("one_server")) and on == faces_on
            skip = s3_only or not (suite or face)
        else:
            once = item.get_closest_marker("one_server") and on not in (None, first_s3)
            skip = bool(once and not (suite and not s3_only))
        if LAYOUT != "stage" and item.get_closest_marker("stage_layout"):
            skip = True
        if item.get_closest_marker("keeps_versions") and on not in KEEPS_VERSIONS:
            skip = True
        (dropped if skip else kept).append(item)
        for mark in item.iter_markers("needs"):
            covered = lacks(on or "").get(mark.args[0])
            if covered is not None:
                reason = f"{LACKING}{mark.args[0]} on {on}: covered by {covered}"
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Count the tests that ran as strict xfails for a capability an emulator lacks, so that
    none of them passes unseen."""
    lacking = [
        getattr(report, "wasxfail", "")
        for report in terminalreporter.stats.get("xfailed", [])
        if getattr(report, "wasxfail", "").startswith(LACKING)
    ]
    if lacking:
        terminalreporter.section("capabilities the emulators lack (strict xfail)")
        for reason, count in sorted(Counter(lacking).items()):
            terminalreporter.line(f"{count:4d}  {reason}")


@pytest.fixture(scope="session", params=backend_names())
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    yield running(request.param)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_all()


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
def task(store: om.ObjectStore) -> om.Task:
    return om.Task.create(
        store, "job", stages=["collect", "write", "check"], lease_seconds=30, max_retries=2
    )
