"""Repair from the versions a store keeps: where the bucket keeps object versions
(``MemoryStore(versioning=True)``, an S3 bucket with versioning enabled, a fake-gcs-server
bucket with object versioning on: a bucket of its own, so no other test runs on one), a
deleted or damaged shard, the index and an upload state are put back exactly as their last
sound version holds them, byte for byte, with the records they carried unflushed, and
every claim they held still valid; delete markers and damaged versions are passed over; a
version older than the object's journal is not restored (the journal rebuilds it, fenced);
a store without versions rebuilds from the journal as before and the report says why.
Through the API and the CLI (``repair``, ``--dry-run``, ``--json``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from tests.support.azure import VersioningTransport, azure_store
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import delete_markers, delete_version, gcs_of, kept, keys
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put
from tests.support.stores import (
    VERSIONED_BUCKET,
    Server,
    backend_names,
    versioned_store,
    versioned_url,
)
from tests.test_cli import make_cli
from tests.test_repair_damage import NESTED, busy, spoil, works_on


@pytest.fixture
def vstore(server: Server, prefix: str) -> Iterator[Any]:
    """A store whose bucket keeps every version of its objects."""
    store = versioned_store(server, prefix)
    yield store
    if server.name == "memory":  # this process holds the objects: free them
        for key in list(store.list_keys("")):
            store.delete(key)


def shard_of(task: om.Task) -> str:
    return engine(task).shard_key("collect", "a")


def doc(body: bytes) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(body)
    return parsed


def restored_exactly(store: Any, key: str, good: tuple[str, bytes]) -> dict[str, Any]:
    """The object at ``key`` is the kept version ``good`` put back byte for byte (the
    store's version before the newest holds exactly its bytes), one journal record later:
    the repair's own, which changed nothing. Its document now."""
    versions = kept(store, key)
    assert versions[1][1] == good[1]  # the put-back: the very bytes of the good version
    assert versions[1][0] != good[0]  # written again, a version of its own
    before, now = doc(good[1]), doc(raw_get(store, key))
    assert now["entries"] == before["entries"]
    assert now["journal_id"] == before["journal_id"]
    assert now["version"] == before["version"] + 1
    assert now["journal"][:-1] == before["journal"]  # nothing it carried is lost
    last = now["journal"][-1]
    assert (last["version"], last["command"], last.get("transitions", [])) == (
        before["version"] + 1,
        "repair",
        [],
    )
    return now


@pytest.mark.behaviour
@pytest.mark.keeps_versions
def test_a_deleted_shard_with_unflushed_records_is_restored_exactly_from_its_version(
    vstore: Any,
) -> None:
    """The case the journal cannot restore: the shard carried records no block holds yet
    (a's renewals after the last block). Restored from its last version, nothing is lost:
    the holder of a renews and finishes it, its history is whole, and a second repair
    finds nothing."""
    task, held = busy(vstore)
    key = shard_of(task)
    good = kept(vstore, key)[0]
    unflushed = doc(good[1])["journal"]
    assert unflushed and unflushed[0]["version"] > 1  # a block holds the first ones
    history = [(t.version, t.command) for t in task.history("a")]
    raw_delete(vstore, key)
    before = {k: raw_get(vstore, k) for k in keys(vstore, "job/")}
    versions = kept(vstore, key)

    dry = om.Task.open(vstore, "job").repair(dry_run=True)
    (obj,) = dry.objects
    assert (obj.key, obj.kind, obj.damage, obj.action) == (key, "shard", "deleted", "would restore")
    assert obj.source == "version" and obj.version is not None
    assert obj.version.version_id == good[0]
    assert obj.version.object_version == doc(good[1])["version"]
    assert obj.records == len(unflushed) and obj.versions_note == ""
    assert {k: raw_get(vstore, k) for k in keys(vstore, "job/")} == before
    assert kept(vstore, key) == versions  # a dry run writes nothing

    report = om.Task.open(vstore, "job").repair()
    (obj,) = report.objects
    assert (obj.action, obj.source, obj.moved_to) == ("restored", "version", None)
    assert obj.version is not None and obj.version.version_id == good[0]
    assert {e.file_id: (e.state, e.epoch) for e in obj.entries} == {
        fid: (e["state"], e["epoch"]) for fid, e in doc(good[1])["entries"].items()
    }
    restored_exactly(vstore, key, good)
    task = om.Task.open(vstore, "job")
    assert [(t.version, t.command) for t in task.history("a")] == history
    agent = task.agent("w")
    held = agent.renew(held)  # the claim it held is still valid: nothing was fenced
    agent.put(held, b"bytes of a")
    works_on(task)
    assert om.Task.open(vstore, "job").repair().clean


@pytest.mark.behaviour
@pytest.mark.keeps_versions
@pytest.mark.parametrize("how", ["not JSON", "nested thousands deep", "wrong shape", "twice"])
def test_a_damaged_shard_is_restored_from_its_last_good_version(vstore: Any, how: str) -> None:
    """Damage written over the shard (and, ``twice``: garbage, a delete, garbage nested
    deep again): the versions that do not decode and the delete marker (where the store
    keeps one) are passed over, the damaged bytes copied aside, and the last good version
    put back."""
    task, held = busy(vstore)
    key = shard_of(task)
    good = kept(vstore, key)[0]
    if how == "twice":
        raw_put(vstore, key, b"\x00\xffnot json at all")
        raw_delete(vstore, key)
        raw_put(vstore, key, NESTED)
        body: bytes | None = NESTED
        assert delete_markers(vstore, key) == (0 if gcs_of(vstore) else 1)  # GCS has none
    else:
        body = spoil(vstore, key, how)
    assert body is not None
    status = om.Task.open(vstore, "job").status()
    assert [(d.key, d.kind) for d in status.damaged] == [(key, "shard")]

    report = om.Task.open(vstore, "job").repair()
    (obj,) = report.objects
    assert (obj.damage, obj.action, obj.source) == ("corrupt", "restored", "version")
    assert obj.version is not None and obj.version.version_id == good[0]
    assert obj.moved_to is not None and raw_get(vstore, obj.moved_to) == body
    restored_exactly(vstore, key, good)
    task = om.Task.open(vstore, "job")
    held = task.agent("w").renew(held)
    task.agent("w").put(held, b"bytes of a")
    works_on(task)
    assert om.Task.open(vstore, "job").repair().clean


@pytest.mark.behaviour
@pytest.mark.keeps_versions
@pytest.mark.needs("version_expiry")
def test_a_kept_version_older_than_the_journal_is_not_restored(vstore: Any) -> None:
    """The versions after the last block expired (a lifecycle rule), then the shard was
    deleted: the newest version left is older than what the journal holds, so putting it
    back would undo changes the journal knows of. The shard is rebuilt from the journal
    instead, fenced, and the report says why."""
    task, held = busy(vstore)
    key = shard_of(task)
    blocks = [k for k in keys(vstore, "job/journal/") if "/shards/" in k]
    assert blocks
    raw_delete(vstore, key)
    expired = [vid for vid, body in kept(vstore, key) if doc(body)["version"] >= 16]
    for version_id in expired:
        delete_version(vstore, key, version_id)
    newest = kept(vstore, key)[0]
    assert doc(newest[1])["version"] < 16

    dry = om.Task.open(vstore, "job").repair(dry_run=True)
    (obj,) = dry.objects
    assert (obj.action, obj.source, obj.version) == ("would rebuild", "journal", None)
    assert f"version {newest[0]}" in obj.versions_note
    assert "older than its journal" in obj.versions_note
    report = om.Task.open(vstore, "job").repair()
    (obj,) = report.objects
    assert (obj.action, obj.source) == ("rebuilt", "journal")
    assert "older than its journal" in obj.versions_note
    task = om.Task.open(vstore, "job")
    with pytest.raises(om.LeaseLost):  # rebuilt from the journal: its claims are fenced
        task.agent("w").renew(held)
    works_on(task)


@pytest.mark.behaviour
@pytest.mark.keeps_versions
def test_the_index_and_an_upload_state_are_restored_from_their_versions(vstore: Any) -> None:
    """The index and a ready chunked entry's upload state, both deleted: each put back from
    its last version, byte for byte, nothing added to the index, the entry read whole."""
    task = om.Task.create(vstore, "job", stages=["collect", "write"])
    task.declare("big", "collect")
    task.declare("out", "write", depends_on=["big"], consumers=["checker"])
    agent = task.agent("w")
    claim = agent.claim("big")
    assert claim is not None
    data = bytes(range(256)) * (5 * 1024 * 1024 // 256) + b"tail"
    entry = agent.put(claim, data, part_size=5 * 1024 * 1024, threshold=5 * 1024 * 1024)
    assert entry.parts_key is not None
    index_key, state_key = engine(task).index_key, entry.parts_key
    goods = {k: kept(vstore, k)[0] for k in (index_key, state_key)}
    raw_delete(vstore, index_key)
    raw_delete(vstore, state_key)

    report = om.Task.open(vstore, "job").repair()
    found = {o.key: o for o in report.objects}
    assert set(found) == {index_key, state_key} and report.added == ()
    assert (found[index_key].kind, found[state_key].kind) == ("index", "upload state")
    for key, good in goods.items():
        obj = found[key]
        assert (obj.action, obj.source) == ("restored", "version")
        assert obj.version is not None and obj.version.version_id == good[0]
        assert kept(vstore, key)[1][1] == good[1]
    index = doc(raw_get(vstore, index_key))
    assert index["version"] == doc(goods[index_key][1])["version"] + 1
    task = om.Task.open(vstore, "job")
    assert task.entry("out").depends_on == ("big",)
    assert task.agent("r").consume("big") == data
    claim = task.agent("w").claim("out")
    assert claim is not None
    assert om.Task.open(vstore, "job").repair().clean


def test_a_sound_shard_written_meanwhile_is_left_alone(prefix: str) -> None:
    """Someone puts a sound shard back while repair reads the versions: the put-back is
    create-only, so theirs stays and the repair says it left the object alone (on memory,
    whose calls a hook can interleave)."""
    vstore = om.MemoryStore(VERSIONED_BUCKET, prefix, versioning=True)
    task, _ = busy(vstore)
    key = shard_of(task)
    older = kept(vstore, key)[3][1]
    raw_delete(vstore, key)

    def meanwhile(op: str, at: str) -> None:
        if op == "get_version" and at == key:
            vstore.faults.hooks.remove(meanwhile)
            vstore.backend.put(key, older)

    vstore.faults.hooks.append(meanwhile)
    report = om.Task.open(vstore, "job").repair()
    (obj,) = report.objects
    assert (obj.action, obj.source) == ("left alone", "version")
    assert raw_get(vstore, key) == older


@pytest.mark.skipif(
    "azurite" not in backend_names(), reason="OBJMANIFEST_TEST_BACKENDS does not name azurite"
)
def test_on_azure_a_damaged_shard_is_restored_from_its_blob_version(prefix: str) -> None:
    """Azurite implements no blob versioning; ``VersioningTransport`` keeps versions beside
    it as Azure does with versioning on (no delete markers: a deleted blob keeps its
    versions and has no current one). The store lists them and reads one through the SDK,
    and the shard, damaged and then deleted, comes back from its last good version."""
    transport = VersioningTransport()
    store = azure_store(prefix, transport=transport)
    task, held = busy(store)
    key = shard_of(task)
    name = store.full_key(key)
    good = transport.kept[name][-1]
    raw_put(store, key, NESTED)
    raw_delete(store, key)
    report = om.Task.open(store, "job").repair()
    (obj,) = report.objects
    assert (obj.damage, obj.action, obj.source) == ("deleted", "restored", "version")
    assert obj.version is not None and obj.version.version_id == good.version_id
    assert transport.kept[name][-2].body == good.body  # put back byte for byte
    assert doc(raw_get(store, key))["entries"] == doc(good.body)["entries"]
    task = om.Task.open(store, "job")
    task.agent("w").put(task.agent("w").renew(held), b"bytes of a")
    works_on(task)


@pytest.mark.behaviour
def test_without_kept_versions_a_deleted_shard_is_rebuilt_from_its_journal(
    store: om.ObjectStore,
) -> None:
    """A store that keeps no versions (memory and file:// never do; the test bucket of the
    S3 servers and Azurite's container have none): the journal rebuilds the shard, fenced,
    as before, and the report says no kept version was there."""
    task, held = busy(store)
    key = shard_of(task)
    raw_delete(store, key)
    report = om.Task.open(store, "job").repair()
    (obj,) = report.objects
    assert (obj.action, obj.source, obj.version) == ("rebuilt", "journal", None)
    assert "keeps no" in obj.versions_note, obj.versions_note
    with pytest.raises(om.LeaseLost):
        om.Task.open(store, "job").agent("w").renew(held)


@pytest.mark.s3_only
def test_repair_through_the_cli_restores_a_deleted_shard_from_its_version(
    server: Server, prefix: str, tmp_path: Path
) -> None:
    """As a user runs it: ``repair --dry-run --json`` names the version it would restore and
    writes nothing, ``repair`` says it restored the shard exactly from that version, and
    the step that held a claim before the shard was deleted puts its bytes with it."""
    cli = make_cli(server, prefix, tmp_path)
    cli.env["OBJMANIFEST_URL"] = versioned_url(server, prefix)
    cli.run("init", "collect", "write")
    cli.run("declare", "a", "--stage", "collect")
    cli.run("declare", "b", "--stage", "write", "--depends-on", "a")
    held = cli.json("claim", "a", "--agent", "fetcher")
    store = om.connect(cli.env["OBJMANIFEST_URL"], endpoint_url=server.endpoint_url)
    key = engine(om.Task.open(store, "job")).shard_key("collect", "a")
    good = kept(store, key)[0]
    raw_delete(store, key)

    dry = cli.json("repair", "--dry-run")
    (obj,) = dry["objects"]
    assert (obj["key"], obj["action"], obj["source"]) == (key, "would restore", "version")
    assert obj["version"]["version_id"] == good[0] and obj["versions_note"] == ""
    assert keys(store, key) == []
    text = cli.run("repair", "--dry-run").text
    assert f"from version {good[0]} of " in text and "dry run: nothing was written" in text

    done = cli.run("repair").text
    assert f"{key}: deleted (it does not exist): restored" in done
    assert f"from version {good[0]} of " in done and "exactly" in done
    assert kept(store, key)[1][1] == good[1]
    cli.run("put", "a", "-", "--agent", "fetcher", "--epoch", str(held["epoch"]), stdin=b"a!")
    assert cli.json("repair") == {"task_id": "job", "dry_run": False, "objects": [], "added": []}
