"""No store outcome reaches a user: the public API driven over a store whose objects vanish
as they are read.

``NoSuchObject`` is the storage seam's word for a missing object, and every caller above
the store says what the absence means to it: a task that does not exist, data that is gone
(produced again), damage that ``repair`` rebuilds, a journal block a trim removed, a write
that did not land. Here a hook of ``FaultyStore`` deletes the object the ``n``-th read
(``get``, ``head``, ``open``) is about to read, for every ``n`` a whole run of the API
makes on memory and for a sample of them on a server; whatever a public call then raises
(or ``put_many`` returns) must be a public error, never a ``StoreOutcome`` or anything
else.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.store import FaultyStore, ObjectStore
from objmanifest.store.errors import StoreOutcome
from objmanifest.store.probe import PROBE_PREFIX, probe_store
from tests.support.stores import Server

pytestmark = [pytest.mark.behaviour]

MiB = 1024 * 1024
READS = ("get", "head", "open")
SAMPLED = 12
"""Runs on a server, each with a read of its own that meets nothing (memory: every read)."""
PARTS = 4
"""The reads are shared out among this many tests (so among the workers of a run)."""


class Vanishing:
    """Counts the reads of a store; the ``at``-th deletes its object just before it runs."""

    def __init__(self, store: FaultyStore, at: int | None = None) -> None:
        self.store = store
        self.at = at
        self.reads = 0
        self.vanished = ""
        self._lock = threading.Lock()

    def __call__(self, op: str, key: str) -> None:
        if op not in READS:
            return
        with self._lock:
            self.reads += 1
            hit = self.reads == self.at
        if hit:
            self.vanished = f"{op} {key}"
            self.store.inner.delete(key)


class Run:
    """One run of the API; ``escaped`` lists what a public call let out that is not a
    public error."""

    def __init__(self, store: ObjectStore, tmp: Path) -> None:
        self.store = store
        self.tmp = tmp
        self.escaped: list[str] = []

    def call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            result = call()
        except om.ObjManifestError:
            return None
        except Exception as e:  # what this test is for: nothing else gets out
            self.escaped.append(f"{what}: {type(e).__module__}.{type(e).__name__}: {e}")
            return None
        for item in result if isinstance(result, list) else ():
            if isinstance(item, BaseException) and not isinstance(item, om.ObjManifestError):
                self.escaped.append(f"{what} returned {type(item).__name__}: {item}")
        return result

    def drive(self) -> None:
        store, call = self.store, self.call
        call("probe_store", lambda: probe_store(store, PROBE_PREFIX + "vanishing"))
        task: om.Task | None = call(
            "Task.create",
            lambda: om.Task.create(store, "job", stages=["make", "use"], lease_seconds=30),
        )
        task = task or call("Task.open", lambda: om.Task.open(store, "job"))
        if task is None:
            return
        call("Task.list", lambda: om.Task.list(store))
        for i in range(34):  # a journal block of the shard and of the index (32 records)
            call("declare", lambda i=i: task.declare(f"f{i:02d}", "make"))
        call("declare", lambda: task.declare("u", "use", depends_on=["f00"]))
        maker, user = task.agent("maker"), task.agent("user")
        one = call("claim", lambda: maker.claim("f00"))
        if one is not None:
            call("put", lambda: maker.put(one, b"small bytes"))
        big = call("claim", lambda: maker.claim("f01"))
        if big is not None:
            body = random.Random(1).randbytes(5 * MiB + 1000)
            call("put chunked", lambda: maker.put(big, body, part_size=5 * MiB))
        claims = [c for c in (call("claim", lambda f=f: maker.claim(f)) for f in ("f02", "f03"))]
        claims = [c for c in claims if c is not None]
        call("put_many", lambda: maker.put_many(claims, [b"two", b"three"][: len(claims)]))
        call("consume", lambda: user.consume("f00"))
        call("consume dest", lambda: user.consume("f01", self.tmp / "f01"))
        call("consume", lambda: user.consume("f02"))
        for file_id in ("f00", "f01", "u"):
            call("entry", lambda f=file_id: task.entry(f))
            call("history", lambda f=file_id: task.history(f))
            call("lineage", lambda f=file_id: task.lineage(f))
        call("entries", task.entries)
        call("status", task.status)
        call("log", lambda: list(task.log()))
        call("is_current", task.is_current)
        call("archive", lambda: task.archive(older_than=0))
        call("entry archived", lambda: task.entry("f00"))
        call("consume archived", lambda: user.consume("f00"))
        call("trim_journal", lambda: task.trim_journal(keep_versions=1))
        call("dropped", task.dropped)
        call("log after trim", lambda: list(task.log()))
        call("repair dry", lambda: task.repair(dry_run=True))
        call("repair", task.repair)
        call("reap", task.reap)
        call("sweep_uploads", task.sweep_uploads)
        call("gc", task.gc)
        call("undeclare", lambda: task.undeclare("f10"))
        call("migrate", task.migrate)
        call("Task.open", lambda: om.Task.open(store, "job"))
        call("delete", lambda: task.delete(force=True))
        call("Task.delete_by_id", lambda: om.Task.delete_by_id(store, "job", force=True))


def run(server: Server, prefix: str, tmp: Path, at: int | None) -> tuple[Vanishing, Run]:
    store = FaultyStore(server.connect(prefix))
    vanishing = Vanishing(store, at)
    store.faults.hooks.append(vanishing)
    api = Run(store, tmp)
    try:
        api.drive()
    finally:
        for key, upload_id in list(store.inner.list_uploads("")):
            store.inner.abort_upload(key, upload_id)
        for key in list(om.store.list_keys(store.inner, "")):
            store.inner.delete(key)
    return vanishing, api


@pytest.mark.parametrize("part", range(PARTS))
def test_no_store_outcome_escapes_a_public_call_whatever_object_vanishes(
    server: Server, prefix: str, tmp_path: Path, part: int
) -> None:
    whole, api = run(server, f"{prefix}-whole", tmp_path, None)
    assert api.escaped == []
    assert whole.reads > 100  # the run reads what a task is made of
    ats = list(range(1, whole.reads + 1))[part::PARTS]
    if server.name != "memory":
        ats = sorted(random.Random(prefix).sample(ats, SAMPLED // PARTS))
    escaped: list[str] = []
    for at in ats:
        vanishing, api = run(server, f"{prefix}-{at}", tmp_path, at)
        escaped += [f"read {at} ({vanishing.vanished}) -> {e}" for e in api.escaped]
    assert escaped == []


def test_the_run_notices_an_outcome_that_escapes(
    server: Server, prefix: str, tmp_path: Path
) -> None:
    """The check above can fail: a read whose absence no caller says in its own words is
    caught (a store outcome raised where a task's header is read)."""
    store = FaultyStore(server.connect(prefix))

    def outcome(op: str, key: str) -> None:
        if op == "get" and key == "job/task.json":
            raise StoreOutcome(f"{key}: an outcome nobody translated")

    api = Run(store, tmp_path)
    api.call("Task.create", lambda: om.Task.create(store, "job", stages=["make"]))
    store.faults.hooks.append(outcome)
    api.call("Task.open", lambda: om.Task.open(store, "job"))
    assert api.escaped == [
        "Task.open: objmanifest.store.errors.StoreOutcome: job/task.json: an outcome nobody "
        "translated"
    ]
