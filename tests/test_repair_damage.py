"""Every damage the docs say ``repair`` handles, made and repaired, on every backend and
under every shard layout: a shard or the index deleted, cut short, not JSON, nested
thousands deep, or of the wrong shape; a journal block garbled or deleted (alone, and with
its shard lost too); a ready chunked entry's upload state garbled or deleted. For each:
``status`` names it (but for journal blocks, which only ``repair`` reads), ``repair
--dry-run`` names it and writes nothing, ``repair`` mends it, a second ``repair`` finds
nothing, and the task works on."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from objmanifest.store.memory import MemoryStore
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import keys
from tests.support.rawstore import put as raw_put

pytestmark = pytest.mark.behaviour

MiB = 1024 * 1024
NESTED = b'{"x":' * 50_000

DAMAGE: dict[str, Callable[[bytes], bytes | None]] = {
    "deleted": lambda body: None,
    "cut short": lambda body: body[: len(body) // 2],
    "not JSON": lambda body: b"\x00\xffnot json at all",
    "nested thousands deep": lambda body: NESTED,
    "wrong shape": lambda body: json.dumps({"schema_version": 2, "entries": 5}).encode(),
    "a block of nothing": lambda body: json.dumps({"schema_version": 1, "records": 5}).encode(),
}


def spoil(store: om.ObjectStore, key: str, how: str) -> bytes | None:
    """Damage ``key`` as ``how`` says; the bytes now there (None: deleted)."""
    body = DAMAGE[how](raw_get(store, key))
    if body is None:
        raw_delete(store, key)
    else:
        raw_put(store, key, body)
    return body


def busy(store: om.ObjectStore) -> tuple[om.Task, om.Claim]:
    """A task whose shard of ``a`` (whatever the layout) has a journal block: ``a`` held
    and renewed past a block, ``b`` ready, ``c`` pending behind ``b``."""
    task = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=600)
    task.declare("a", stage="collect")
    task.declare("b", stage="collect")
    task.declare("c", stage="write", depends_on=["b"])
    agent = task.agent("w")
    made = agent.claim("b")
    assert made is not None
    agent.put(made, b"bytes of b")
    claim = agent.claim("a")
    assert claim is not None
    for _ in range(BLOCK + 4):
        claim = agent.renew(claim)
    task.flush_journal()
    claim = agent.renew(claim)  # knows the block stored: drops its records from the shard
    return task, claim


def works_on(task: om.Task) -> None:
    """The task still runs end to end: what the repair fenced is produced again, b is
    consumed, c produced from it, a finished."""
    worker = task.agent("after")
    if task.entry("b").state is not om.State.ready:  # its ready was lost with the journal
        claim = worker.claim("b")
        assert claim is not None
        worker.put(claim, b"bytes of b")
    assert task.agent("reader").consume("b") == b"bytes of b"
    for file_id in ("c", "a"):
        if task.entry(file_id).state in (om.State.pending, om.State.failed):
            claim = worker.claim(file_id)
            assert claim is not None
            worker.put(claim, f"bytes of {file_id}".encode())
    assert task.status().damaged == []


def check_repaired(task: om.Task, key: str, kind: str, damage: str) -> om.ObjectRepair:
    before = {k: raw_get(task.store, k) for k in keys(task.store, "job/")}
    dry = om.Task.open(task.store, "job").repair(dry_run=True)
    named = [o for o in dry.objects if o.key == key]
    assert [(o.kind, o.damage) for o in named] == [(kind, damage)], dry
    assert {k: raw_get(task.store, k) for k in keys(task.store, "job/")} == before
    report = om.Task.open(task.store, "job").repair()
    (obj,) = [o for o in report.objects if o.key == key]
    assert obj.action in ("rebuilt", "recorded as lost"), obj
    again = om.Task.open(task.store, "job").repair()
    assert again.clean, again
    return obj


@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("which", ["shard", "index"])
def test_a_damaged_shard_or_index_is_named_by_status_and_repaired(
    store: om.ObjectStore, which: str, how: str
) -> None:
    task, held = busy(store)
    key = engine(task).shard_key("collect", "a") if which == "shard" else engine(task).index_key
    body = spoil(store, key, how)
    reopened = om.Task.open(store, "job")
    if body is not None:
        status = reopened.status()  # names it, and counts what it can
        assert [(d.key, d.kind) for d in status.damaged] == [(key, which)]
        assert not status.finished
    damage = "deleted" if body is None else "corrupt"
    obj = check_repaired(reopened, key, which, damage)
    if body is not None:
        assert obj.moved_to is not None and raw_get(store, obj.moved_to) == body
    task = om.Task.open(store, "job")
    if which == "shard":
        # Rebuilt from its journal and the index, every old claim is fenced.
        with pytest.raises(om.LeaseLost):
            task.agent("w").renew(held)
    works_on(task)


@pytest.mark.parametrize("how", ["not JSON", "a block of nothing", "deleted"])
@pytest.mark.parametrize("shard_lost", [False, True])
def test_a_damaged_journal_block_is_named_by_repair_and_said_lost(
    store: om.ObjectStore, how: str, shard_lost: bool
) -> None:
    task, held = busy(store)
    shard_key = engine(task).shard_key("collect", "a")
    blocks = sorted(k for k in keys(store, "job/journal/") if "/shards/" in k and "-" in k)
    (block,) = [k for k in blocks if k.endswith(f"-{BLOCK:012d}.json") and "000000000001-" in k]
    assert om.Task.open(store, "job").repair(dry_run=True).clean
    if how == "deleted":
        # A block deleted between two others: the shard carries its next versions.
        for _ in range(2 * BLOCK):
            held = task.agent("w").renew(held)
        task.flush_journal()
    body = spoil(store, block, how)
    if body is not None:
        with pytest.raises(om.CorruptShard, match="journal"):
            om.Task.open(store, "job").log()
    if shard_lost:
        raw_delete(store, shard_key)
    obj = check_repaired(om.Task.open(store, "job"), block, "journal block", damage_of(how))
    assert obj.action == "recorded as lost" and obj.records == BLOCK
    if body is not None:
        assert obj.moved_to is not None and raw_get(store, obj.moved_to) == body
    task = om.Task.open(store, "job")
    said = [d for d in task.dropped("a") if d.cause == "damage"]
    assert [(d.first, d.last) for d in said] == [(1, BLOCK)]
    assert "lost with a damaged journal block" in said[0].line()
    task.log()  # readable again
    task.lineage("c")
    if shard_lost:
        with pytest.raises(om.LeaseLost):
            task.agent("w").renew(held)
    works_on(task)


def damage_of(how: str) -> str:
    return "deleted" if how == "deleted" else "corrupt"


@pytest.mark.parametrize("how", ["not JSON", "nested thousands deep", "deleted"])
def test_a_ready_chunked_entrys_damaged_upload_state_is_rebuilt_from_its_data(
    store: om.ObjectStore, how: str
) -> None:
    task = om.Task.create(store, "job", stages=["collect"])
    task.declare("big", stage="collect")
    agent = task.agent("w")
    claim = agent.claim("big")
    assert claim is not None
    data = bytes(range(256)) * (5 * MiB // 256) + b"tail"
    entry = agent.put(claim, data, part_size=5 * MiB, threshold=5 * MiB)
    assert entry.is_chunked and entry.parts_key is not None
    key = entry.parts_key
    body = spoil(store, key, how)
    status = om.Task.open(store, "job").status()
    assert [(d.key, d.kind) for d in status.damaged] == [(key, "upload state")]
    # Meanwhile a reader still gets verified bytes: the parts checked together.
    assert om.Task.open(store, "job").agent("early", role="r").consume("big") == data
    obj = check_repaired(om.Task.open(store, "job"), key, "upload state", damage_of(how))
    assert obj.action == "rebuilt" and obj.records == 2
    if body is not None:
        assert obj.moved_to is not None and raw_get(store, obj.moved_to) == body
    task = om.Task.open(store, "job")
    assert task.status().damaged == []
    assert task.entry("big").state is om.State.consumed
    assert task.agent("early").consume("big") == data  # the queue's consumer reads again


def test_an_upload_state_is_not_rebuilt_over_data_that_does_not_verify(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "job", stages=["collect"])
    task.declare("big", stage="collect")
    agent = task.agent("w")
    claim = agent.claim("big")
    assert claim is not None
    data = b"x" * (5 * MiB + 10)
    entry = agent.put(claim, data, part_size=5 * MiB, threshold=5 * MiB)
    assert entry.parts_key is not None and entry.key is not None
    raw_delete(store, entry.parts_key)
    raw_put(store, entry.key, b"y" * len(data))  # the data rotted too
    report = om.Task.open(store, "job").repair()
    (obj,) = report.objects
    assert (obj.kind, obj.action) == ("upload state", "left alone")
    assert "do not make the entry's checksum" in obj.not_restored[0]
    with pytest.raises(om.ChecksumMismatch, match="checked together"):
        om.Task.open(store, "job").agent("r").consume("big")
    assert om.Task.open(store, "job").entry("big").state is om.State.failed


def beside(task: om.Task, stage: str, file_id: str) -> str:
    """Another file id whose entry would live in the same shard as ``file_id``'s."""
    home = engine(task).shard_key(stage, file_id)
    return next(
        f"{file_id}-{n}"
        for n in range(10_000)
        if engine(task).shard_key(stage, f"{file_id}-{n}") == home
    )


def test_a_deleted_shard_is_damage_a_declare_refuses_and_repair_rebuilds_it(
    task: om.Task,
) -> None:
    """A shard deleted after its entry was produced: status names it as damage (its full
    address, the repair), a declare into it refuses instead of starting a new shard over
    what the index says it held, a read names it too, and repair rebuilds it."""
    task.declare("f", "collect")
    agent = task.agent("p")
    claim = agent.claim("f")
    assert claim is not None
    agent.put(claim, b"hi")
    key = engine(task).shard_key("collect", "f")
    raw_delete(task.store, key)
    status = task.status()
    assert [(d.key, d.kind) for d in status.damaged] == [(key, "shard")]
    note = status.damaged[0]
    assert note.address == task.store.describe(key) and "objmanifest repair" in note.fix
    assert "it was deleted" in note.problem and "'f'" in note.problem
    assert [(n.file_id, n.reason) for n in status.unfinished] == [
        ("f", f"its shard {key} is damaged: run `objmanifest repair`")
    ]
    for file_id in ("f", beside(task, "collect", "f")):
        with pytest.raises(om.CorruptShard, match="objmanifest repair") as caught:
            task.declare(file_id, "collect")
        assert caught.value.address == task.store.describe(key)
        assert "declare" not in str(caught.value).split("otherwise")[1].split(";")[0]
    with pytest.raises(om.CorruptShard, match="it was deleted"):
        task.entry("f")
    assert keys(task.store, key) == []  # nothing papered over
    report = task.repair()
    assert [(r.key, r.damage, r.action) for r in report.objects] == [(key, "deleted", "rebuilt")]
    assert task.entry("f").state is om.State.pending  # its records went with the object
    assert task.status().damaged == []
    task.declare(beside(task, "collect", "f"), "collect")


def test_a_first_declaration_interrupted_before_its_shard_is_finished_by_a_rerun(
    task: om.Task,
) -> None:
    """The index written, the new shard not: nothing shows the shard was ever written, so
    it is no damage, and the same declaration again finishes it."""
    task.declare("a", "collect")
    raw_delete(task.store, engine(task).shard_key("collect", "a"))  # as if never written
    status = task.status()
    assert status.damaged == []
    assert [n.reason for n in status.unfinished] == [
        "declared, not yet in its shard: rerun the declare"
    ]
    task.declare("a", "collect", consumers=[])
    assert task.entry("a").state is om.State.pending and task.status().unfinished == []


def test_a_corrupt_retention_marker_is_named_copied_aside_and_written_again(
    task: om.Task,
) -> None:
    """A retention marker that does not decode, its shard deleted too: status names both,
    ``log`` says which object by its address and how to repair it, and repair copies the
    marker aside, writes it again from the blocks there are and rebuilds the shard."""
    task.declare("f", "collect")
    agent = task.agent("p")
    claim = agent.claim("f")
    assert claim is not None
    agent.put(claim, b"hi")
    key = engine(task).shard_key("collect", "f")
    marker = engine(task).layout.journal_retention(key)
    raw_put(task.store, marker, b"[]")
    raw_delete(task.store, key)
    status = task.status()
    found = {(d.key, d.kind) for d in status.damaged}
    assert found == {(key, "shard"), (marker, "retention marker")}
    note = next(d for d in status.damaged if d.kind == "retention marker")
    assert note.address == task.store.describe(marker) and "not a JSON object" in note.problem
    with pytest.raises(om.CorruptShard) as caught:
        task.log()
    assert caught.value.address == task.store.describe(marker)
    assert "objmanifest repair" in str(caught.value)
    dry = task.repair(dry_run=True)
    assert {(r.key, r.action) for r in dry.objects} == {
        (marker, "would rebuild"),
        (key, "would rebuild"),
    }
    assert raw_get(task.store, marker) == b"[]"  # a dry run changes nothing
    report = task.repair()
    done = {r.key: r for r in report.objects}
    assert done[marker].action == "rebuilt" and done[key].action == "rebuilt"
    moved = done[marker].moved_to
    assert moved is not None and raw_get(task.store, moved) == b"[]"
    assert task.status().damaged == []
    assert task.log()  # readable again
    assert task.repair().objects == ()


@pytest.mark.parametrize(
    "body",
    [b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", b'{"x": 1'],
    ids=["nested-50000-deep", "not-json"],
)
def test_a_corrupt_archive_object_is_named_and_rebuilt_from_the_journal(
    task: om.Task, body: bytes
) -> None:
    """An archive object that does not decode: status names it, every read of the entries
    it holds (show, consume, lineage, gc) names it and the repair, and repair copies it
    aside and writes its entries again from their journal records, so gc frees their data."""
    task.declare("q1", "collect")
    agent = task.agent("p")
    claim = agent.claim("q1")
    assert claim is not None
    agent.put(claim, b"hi")
    task.agent("c").consume("q1")
    before = task.entry("q1")
    archived = task.archive(older_than=0)
    [key] = archived.objects
    raw_put(task.store, key, body)
    fresh = om.Task.open(task.store, task.task_id)  # reads it anew
    assert [(d.key, d.kind) for d in fresh.status().damaged] == [(key, "archive object")]
    address = task.store.describe(key)
    for read in (
        lambda: fresh.entry("q1"),
        lambda: fresh.agent("c").consume("q1"),
        lambda: fresh.lineage("q1"),
        lambda: fresh.gc(consumed_older_than=0),
    ):
        with pytest.raises(om.CorruptShard) as caught:
            read()
        assert caught.value.address == address and "objmanifest repair" in str(caught.value)
    report = fresh.repair()
    [done] = [r for r in report.objects if r.kind == "archive object"]
    assert (done.key, done.damage, done.action) == (key, "corrupt", "rebuilt")
    assert done.moved_to is not None and raw_get(task.store, done.moved_to) == body
    assert keys(task.store, key) == []
    again = om.Task.open(task.store, task.task_id)
    entry = again.entry("q1")
    assert (entry.state, entry.checksum, entry.key, entry.epoch) == (
        om.State.consumed,
        before.checksum,
        before.key,
        before.epoch,
    )
    assert again.status().damaged == []
    freed = again.gc(consumed_older_than=0)
    assert [i.key for i in freed.removed] == [before.key]
    assert again.repair().objects == ()


@pytest.mark.parametrize("stages", [["a"], ["a", "b"]], ids=["one-stage", "two-stages"])
def test_a_one_shard_task_whose_shard_and_index_are_both_lost(stages: list[str]) -> None:
    """On a task of one shard the index alone says each entry's stage, and the index is
    rebuilt from the shard: with both lost, a task of one stage gets every entry the
    journal's blocks kept back; with more stages the entries are reported lost, to be
    declared again, never to be found by repairing again."""
    store = MemoryStore(f"repair-one-shard-{uuid.uuid4().hex}", "p")
    om.Task.create(store, "job", stages=stages, layout="task")
    ids = [f"f{n:02d}" for n in range(2 * BLOCK)]
    for n, file_id in enumerate(ids):
        om.Task.open(store, "job").declare(file_id, stages[n % len(stages)])
    task = om.Task.open(store, "job")
    for key in (engine(task).shard_key(stages[0], ids[0]), engine(task).layout.index):
        raw_put(store, key, b'{"x":' * 50_000)
    report = task.repair()
    assert {o.action for o in report.objects} == {"rebuilt"}
    totals = om.Task.open(store, "job").status().totals
    if len(stages) == 1:
        assert totals["pending"] >= BLOCK - 1  # what a stored block held
        return
    assert totals["pending"] == 0
    lost = [e for o in report.objects for e in o.entries if e.state == "lost"]
    assert len(lost) >= BLOCK - 1
    assert all("declare it again" in e.rule and "repair again" not in e.rule for e in lost)
