"""gc: what it removes (each kind), what it never touches, --dry-run, and a gc loop run
during a pipeline with fenced holders and failed puts, on every backend."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core.model import Stored
from objmanifest.data import transfer
from objmanifest.store import PROBE_PREFIX
from objmanifest.store.errors import NoSuchObject
from tests.support.breaking import BreakingFile
from tests.support.internals import engine
from tests.support.rawstore import put as raw_put

pytestmark = pytest.mark.behaviour


def data_keys(task: om.Task) -> set[str]:
    return {row.key for row in task.store.list(engine(task).layout.data_prefix)}


def exists(task: om.Task, key: str) -> bool:
    try:
        task.store.head(key)
        return True
    except NoSuchObject:
        return False


def failed_put(task: om.Task, agent: om.Agent, file_id: str) -> str:
    """A holder that wrote its bytes and gave up before making the entry ready."""
    claim = agent.claim(file_id)
    assert claim is not None
    key = engine(task).layout.data(claim.stage, claim.file_id, claim.epoch)
    transfer.upload(task.store, key, b"abandoned " + file_id.encode())
    agent.fail(claim, "gave up")
    return key


def produce(agent: om.Agent, file_id: str, body: bytes) -> om.Entry:
    claim = agent.claim(file_id)
    assert claim is not None
    return agent.put(claim, body)


def removed(report: om.GcReport, kind: str) -> set[str]:
    return {i.key for i in report.by_kind()[kind]}  # type: ignore[index]


# -- each kind ---------------------------------------------------------------------------


def test_gc_removes_data_of_fenced_holders_and_keeps_referenced_and_live(task: om.Task) -> None:
    p = task.agent("p")
    task.declare_many([("a", "collect"), ("b", "collect"), ("c", "collect")])
    stale_a = failed_put(task, p, "a")
    ready_a = produce(p, "a", b"A")
    stale_b = failed_put(task, p, "b")
    live = p.claim("b")  # the live holder writes its key, not yet ready
    assert live is not None
    live_key = engine(task).layout.data("collect", "b", live.epoch)
    transfer.upload(task.store, live_key, b"B")
    other = engine(task).layout.beside(
        engine(task).layout.data("collect", "c", 1), "feedfacefeedface"
    )
    produce(p, "c", b"C")  # same epoch, another key of that holder: garbage once ready
    transfer.upload(task.store, other, b"C2")

    report = task.gc()
    assert removed(report, "fenced_data") == {stale_a, stale_b, other}
    assert report.bytes_freed == sum(len(b) for b in (b"abandoned a", b"abandoned b", b"C2"))
    assert data_keys(task) == {ready_a.key, live_key, task.entry("c").key}
    assert p.put(live, b"B").key == live_key  # the live holder finishes on its own key
    c = task.agent("c")
    assert [c.consume(f) for f in ("a", "b", "c")] == [b"A", b"B", b"C"]
    assert task.gc().removed == []


def test_gc_aborts_unadoptable_uploads_and_removes_fenced_upload_objects(task: om.Task) -> None:
    p = task.agent("p")
    task.declare_many([("a", "collect"), ("b", "collect")])
    claim = p.claim("a")
    assert claim is not None
    orphan = engine(task).layout.data("collect", "a", claim.epoch)
    task.store.create_upload(orphan)  # its starter died before recording it
    p.fail(claim, "died")
    claim = p.claim("b")
    assert claim is not None
    completed = engine(task).layout.data("collect", "b", claim.epoch)
    upload_id = task.store.create_upload(completed)
    etag = task.store.upload_part(completed, upload_id, 1, b"fenced parts")
    task.store.complete_upload(completed, upload_id, [etag])
    p.fail(claim, "fenced")
    produce(p, "a", b"A")
    produce(p, "b", b"B")

    report = task.gc()
    assert removed(report, "upload") == {orphan}
    assert removed(report, "fenced_upload_object") == {completed}
    assert list(task.store.list_uploads(engine(task).layout.data_prefix)) == []
    assert not exists(task, completed)
    c = task.agent("c")
    assert (c.consume("a"), c.consume("b")) == (b"A", b"B")


def test_gc_removes_finished_probe_objects_and_reports_unknown_keys(task: om.Task) -> None:
    done = PROBE_PREFIX + "0" * 32
    running = PROBE_PREFIX + "1" * 32
    task.store.put(done, b"current:nonce")
    task.store.put(running, b"create:nonce")
    task.declare("a", "collect")
    strange = [
        f"{engine(task).layout.data_prefix}collect/no-epoch",
        f"{engine(task).layout.root}notes.txt",
        engine(task).layout.data("collect", "ghost", 1),  # no such entry (archived, perhaps)
        engine(task).layout.data("collect", "a", 7),  # an epoch its entry never had
    ]
    for key in strange:
        raw_put(task.store, key, b"not ours")

    report = task.gc()
    assert removed(report, "probe") == {done}
    assert not exists(task, done) and exists(task, running)
    kept = {k.key: k.reason for k in report.kept}
    assert set(kept) >= {running, *strange}
    assert (
        kept[engine(task).layout.data("collect", "ghost", 1)]
        == "its entry is not in the live shard"
    )
    assert all(exists(task, key) for key in strange)
    task.store.delete(running)


def test_gc_dry_run_removes_nothing_and_reports_the_same(task: om.Task) -> None:
    p = task.agent("p")
    task.declare_many([("a", "collect"), ("b", "collect")])
    stale = failed_put(task, p, "a")
    claim = p.claim("b")
    assert claim is not None
    orphan = engine(task).layout.data("collect", "b", claim.epoch)
    task.store.create_upload(orphan)
    p.fail(claim, "died")
    produce(p, "a", b"A")
    task.store.put(PROBE_PREFIX + "2" * 32, b"current:x")
    before = (data_keys(task), list(task.store.list_uploads(engine(task).layout.data_prefix)))

    dry = task.gc(dry_run=True)
    assert dry.dry_run and removed(dry, "fenced_data") == {stale}
    assert removed(dry, "upload") == {orphan} and len(removed(dry, "probe")) == 1
    assert (
        data_keys(task),
        list(task.store.list_uploads(engine(task).layout.data_prefix)),
    ) == before
    assert exists(task, PROBE_PREFIX + "2" * 32)

    real = task.gc()
    assert {(i.kind, i.key, i.size) for i in real.removed} == {
        (i.kind, i.key, i.size) for i in dry.removed
    }
    assert real.bytes_freed == dry.bytes_freed > 0


def test_gc_removes_consumed_data_only_when_asked_and_marks_it(task: om.Task) -> None:
    p, c = task.agent("p"), task.agent("c")
    task.declare_many([("a", "collect"), ("b", "collect")])
    a = produce(p, "a", b"A" * 10)
    produce(p, "b", b"B")
    assert c.consume("a") == b"A" * 10
    assert task.gc().removed == []  # not asked
    assert task.gc(consumed_older_than=3600).removed == []  # not old enough
    assert removed(task.gc(consumed_older_than=0, dry_run=True), "consumed_data") == {a.key}
    assert exists(task, a.key or "")

    report = task.gc(consumed_older_than=0)
    assert removed(report, "consumed_data") == {a.key}
    assert report.bytes_freed == 10
    entry = task.entry("a")
    assert entry.state is om.State.consumed and entry.data_removed_at is not None
    assert entry.checksum == a.checksum  # the proof of what it was stays
    assert not exists(task, a.key or "")
    with pytest.raises(om.DataRemoved, match="'a' was consumed and its data was removed"):
        c.consume("a")
    assert task.history("a")[-1].command == "drop-data"
    assert c.consume("b") == b"B"  # ready entries are never touched
    assert removed(task.gc(consumed_older_than=0), "consumed_data") == {task.entry("b").key}
    # A removal that failed after the mark is finished by the next run, asked or not.
    c_entry = task.entry("b")
    raw_put(task.store, c_entry.key or "", b"B")
    assert c_entry.data_removed_at is not None
    assert removed(task.gc(), "consumed_data") == {c_entry.key}
    with pytest.raises(om.InvalidInput, match="consumed_older_than"):
        task.gc(consumed_older_than=-1)


# -- a gc loop during a pipeline ----------------------------------------------------------


def wait_expired(task: om.Task, claim: om.Claim) -> None:
    """Until the store's clock is past the lease and its margin (as test_behaviour does)."""
    while task.store.now() <= claim.lease_expires_at + timedelta(seconds=2.2):
        time.sleep(0.25)


def body_of(file_id: str) -> bytes:
    return f"the bytes of {file_id}\n".encode() * 3


def test_gc_in_a_loop_during_a_pipeline_keeps_every_entry_and_removes_the_garbage(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "pipe", stages=["collect"], lease_seconds=1, max_retries=50)
    ids = [f"f{i:02d}" for i in range(16)]
    task.declare_many([(f, "collect") for f in ids])

    # A zombie: its lease runs out, someone else takes the entry over, then it writes.
    zombie = task.agent("zombie")
    zclaim = zombie.claim("f00")
    assert zclaim is not None
    wait_expired(task, zclaim)
    task.reap()

    stop = threading.Event()
    errors: list[BaseException] = []
    reports: list[om.GcReport] = []
    consumed: dict[str, bytes] = {}
    lock = threading.Lock()
    failed_once: set[str] = set()

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # reported by the main thread; the others stop
                errors.append(e)
                stop.set()

        return run

    def producer(name: str) -> None:
        agent = task.agent(name)
        while not stop.is_set():
            claim = agent.claim(stage="collect")
            if claim is None:
                if all(e.state in (om.State.ready, om.State.consumed) for e in task.entries()):
                    return
                time.sleep(0.05)  # polling: the other producer holds what is left
                continue
            try:
                with lock:
                    first = claim.file_id not in failed_once and int(claim.file_id[1:]) % 3 == 0
                    failed_once.add(claim.file_id)
                key = engine(task).layout.data("collect", claim.file_id, claim.epoch)
                if first:  # a failed put: bytes written, then given up
                    transfer.upload(task.store, key, b"junk")
                    if int(claim.file_id[1:]) % 2 == 0:
                        task.store.create_upload(engine(task).layout.beside(key, "2"))
                    agent.fail(claim, "failed put")
                else:
                    agent.put(claim, body_of(claim.file_id))
            except om.LeaseLost:
                pass  # fenced: someone else produces it

    def consumer() -> None:
        agent = task.agent("reader")
        while not stop.is_set():
            entries = task.entries()
            for e in entries:
                if e.state is om.State.ready and int(e.file_id[1:]) % 2 == 0:
                    data = agent.consume(e.file_id)
                    with lock:
                        consumed[e.file_id] = data
            with lock:
                if len(consumed) == len(ids) // 2:
                    return
            time.sleep(0.05)  # polling for entries made ready

    def collector() -> None:
        while not stop.is_set():
            reports.append(task.gc())

    workers = [
        threading.Thread(target=guarded(lambda: producer("p1"))),
        threading.Thread(target=guarded(lambda: producer("p2"))),
        threading.Thread(target=guarded(consumer)),
    ]
    gc_thread = threading.Thread(target=guarded(collector))
    for t in [*workers, gc_thread]:
        t.start()
    # the zombie writes while the pipeline runs, and is refused
    zkey = engine(task).layout.data("collect", "f00", zclaim.epoch)
    transfer.upload(task.store, zkey, b"zombie bytes")
    with pytest.raises(om.LeaseLost):
        zombie.put(zclaim, b"zombie bytes again")
    for t in workers:
        t.join(timeout=300)
    stop.set()
    gc_thread.join(timeout=300)
    assert errors == []
    assert reports, "gc ran during the pipeline"

    final = task.gc()
    entries = {e.file_id: e for e in task.entries()}
    assert {e.state for e in entries.values()} <= {om.State.ready, om.State.consumed}
    assert data_keys(task) == {e.key for e in entries.values()}  # the garbage is gone
    assert list(task.store.list_uploads(engine(task).layout.data_prefix)) == []
    removed_all = {i.key for r in [*reports, final] for i in r.removed}
    assert zkey in removed_all or not exists(task, zkey)
    assert any(i.kind == "fenced_data" for r in [*reports, final] for i in r.removed)

    reader = task.agent("reader")
    check = task.agent("check")
    for file_id, entry in sorted(entries.items()):
        if entry.state is om.State.consumed:
            assert consumed[file_id] == body_of(file_id)
            assert reader.consume(file_id) == body_of(file_id)  # read again, verified
        else:
            assert check.consume(file_id) == body_of(file_id)
    assert task.gc().removed == []


# -- what a later holder may adopt ----------------------------------------------------------

MiB = 1024 * 1024
PART = 5 * MiB


def test_gc_keeps_an_upload_and_a_completed_object_a_later_holder_may_adopt(
    task: om.Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunked data outlives its holder: an earlier epoch's key recorded in the open upload
    state is kept while the entry may still be made ready with it."""
    data = random.Random(7).randbytes(PART + 11)  # two parts
    first = task.agent("first")
    task.declare_many([("big", "collect"), ("open", "collect")])

    # A holder that completed its upload and died before making the entry ready.
    claim = first.claim("big")
    assert claim is not None
    real_finish = om.Agent._finish

    def die(self: om.Agent, c: om.Claim, stored: Stored) -> om.Entry:
        raise om.StoreError("the producer died before its finish")

    monkeypatch.setattr(om.Agent, "_finish", die)
    with pytest.raises(om.StoreError, match="died before its finish"):
        first.put(claim, data, part_size=PART, threshold=MiB)
    monkeypatch.setattr(om.Agent, "_finish", real_finish)
    completed = engine(task).layout.data("collect", "big", claim.epoch)
    assert exists(task, completed)
    first.fail(claim, "died")

    # A holder that died in the middle: its upload stays open for the next one.
    claim = first.claim("open")
    assert claim is not None
    broken = BreakingFile(data, PART + 5, "the producer died")
    with pytest.raises(OSError, match="the producer died"):
        first.put(claim, broken, part_size=PART, threshold=MiB, concurrency=1)
    first.fail(claim, "died")
    open_key = engine(task).layout.data("collect", "open", claim.epoch)

    assert task.gc().removed == []
    second = task.agent("second")
    again = {f: second.claim(f) for f in ("big", "open")}
    assert all(c is not None and c.epoch == 2 for c in again.values())
    assert task.gc().removed == []  # writing at epoch 2: epoch 1's recorded key still kept
    assert exists(task, completed)
    assert len(list(task.store.list_uploads(engine(task).layout.data_prefix))) == 1
    for file_id, c in again.items():
        assert c is not None
        entry = second.put(c, data, part_size=PART, threshold=MiB)
        assert entry.key == {"big": completed, "open": open_key}[file_id]  # adopted
    assert task.gc().removed == []
    reader = task.agent("reader")
    assert reader.consume("big") == data and reader.consume("open") == data
