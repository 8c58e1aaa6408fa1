"""``FileStore`` (``file:///DIR``) on its own: keys mapped to paths (properties: injective,
reversible, listed in key order, listings as ``MemoryStore`` gives them), racing writers in
threads and in processes, a writer killed at every step of a put, stale temporary files
swept, multipart uploads as part files, and the store's clock being the filesystem's.

The conformance and behaviour suites hold it to the seam's promises with every backend;
``tests/test_file_store_hostile.py`` has hostile directories, URLs and special files.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.errors import StoreError
from objmanifest.store import (
    CREATE,
    Blob,
    Head,
    Listed,
    MemoryStore,
    PutMode,
    completed_from,
    file_io,
)
from objmanifest.store.errors import NoSuchObject, PartsRejected, PreconditionFailed, UploadGone
from objmanifest.store.file import FileStore
from objmanifest.store.file_paths import MAX_KEY_BYTES, object_names, read_name
from objmanifest.store.file_root import STALE_AFTER, Directory

WORKER = Path(__file__).parent / "workers" / "file_store.py"
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    directory = tmp_path / "store"
    directory.mkdir()
    return directory


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(str(root))


def fresh_store(under: Path) -> FileStore:
    """A store in a new directory (hypothesis runs many examples in one test)."""
    base = under / uuid.uuid4().hex
    base.mkdir()
    return FileStore(str(base))


# -- keys to paths -----------------------------------------------------------------------------

TRICKY = [
    "x",
    "x/y",
    "x.json/y",
    "x.json",
    "x0",
    ".hidden",
    "a/.hidden/b",
    ".",
    "..",
    "a/./b",
    "a/../b",
    "a//b",
    "a/",
    "/a",
    "//",
    "%",
    "%2E",
    "=",
    "a=",
    "a=/b",
    "+",
    "a+",
    "a+/b",
    "lost+found",
    "\x00",
    "a\nb",
    "tab\there",
    "\x7f",
    "é",
    "e\u0301",
    "😀/😀",
    "a" * 240,
    "a" * 241,
    "a" * 500 + "/b",
    "%" * 300,
    "é" * 300,
    "a" * 238 + "%",
    "😀" * 200,
    "a" * 1023 + "b",
]


def test_every_name_a_key_maps_to_is_a_valid_name_no_dotfile_and_no_longer_than_255() -> None:
    for key in TRICKY:
        names = object_names(key)
        for name in names:
            assert 0 < len(name) <= 255, (key, name)
            assert b"/" not in name and b"\x00" not in name, (key, name)
            assert not name.startswith(b"."), (key, name)
            assert read_name(name) is not None, (key, name)
    assert len({tuple(object_names(key)) for key in TRICKY}) == len(TRICKY)


def test_tricky_keys_live_side_by_side_and_list_in_key_order(store: FileStore) -> None:
    for key in TRICKY:
        store.put(key, key.encode("utf-8"), metadata={"k": str(len(key))})
    assert [row.key for row in store.list("")] == sorted(TRICKY)
    for key in TRICKY:
        assert store.get(key) == Blob(
            key.encode("utf-8"), f'"{checksum.of_bytes(key.encode())}"', {"k": str(len(key))}
        )
    # Nothing of the store's own is in the key space, nor a key outside the directory.
    assert sorted(os.listdir(store.root)) == sorted(
        {os.fsdecode(object_names(key)[0]) for key in TRICKY} | {".objmanifest"}
    )


segment = st.one_of(
    st.text(st.sampled_from(list("ab.%=+~ \x00\n\x7fé😀/")), max_size=6),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=6),
    st.text(st.sampled_from(list("a%é")), min_size=200, max_size=320),
)
keys = (
    st.lists(segment, min_size=1, max_size=4)
    .map("/".join)
    .filter(lambda key: 0 < len(key.encode("utf-8")) <= MAX_KEY_BYTES)
)


@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.sets(keys, min_size=1, max_size=12),
    st.lists(st.one_of(keys, st.sampled_from(["", "a", "a/", "%", "."])), max_size=4),
)
def test_keys_round_trip_and_list_as_memory_lists_them(
    tmp_path: Path, written: set[str], prefixes: list[str]
) -> None:
    """Injective (every key keeps its own object), reversible (a listing gives the keys
    back) and in key order; prefix and delimiter listings equal ``MemoryStore``'s."""
    store = fresh_store(tmp_path)
    reference = MemoryStore(f"file-reference-{uuid.uuid4().hex}")
    for key in written:
        store.put(key, key.encode("utf-8"))
        reference.put(key, key.encode("utf-8"))
    assert [row.key for row in store.list("")] == sorted(written)
    for key in written:
        assert store.get(key).body == key.encode("utf-8")  # type: ignore[union-attr]
    for prefix in ["", *prefixes, *(k[: len(k) // 2] for k in written)]:
        for delimiter in (None, "/", "a", "é/"):
            assert list(store.list(prefix, delimiter)) == list(reference.list(prefix, delimiter))


def test_an_empty_directory_left_behind_is_not_a_common_prefix(store: FileStore) -> None:
    store.put("a/b/c", b"x")
    store.put("a/d", b"y")
    store.delete("a/b/c")
    assert not (Path(store.root) / "a=" / "b=").exists()  # removed with its last object
    os.makedirs(Path(store.root) / "a=" / "e=" / "f=")  # as a delete racing a write leaves it
    assert list(store.list("a/", "/")) == [Listed("a/d")]
    assert list(store.list("")) == [Listed("a/d")]
    store.delete("a/d")
    assert list(store.list("", "/")) == []


def test_a_write_makes_again_a_directory_a_delete_removes_while_it_makes_it(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete of the last object beside a new one removes the directories it left empty;
    a write making those directories at that moment finds a parent gone under it (as gc
    sweeping a stage while agents write there does). The write makes them again."""
    store.put("pipe/data/old", b"x")
    store.delete("pipe/data/old")  # "pipe=" and "pipe=/data=" are gone now
    parent = b"pipe="  # made in the store's directory, as the write walks down to its own
    real_mkdir = os.mkdir
    removed: list[bytes] = []

    def mkdir_as_a_delete_races_it(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        if os.fsencode(path) == parent and not removed:  # a delete removes it, left empty
            os.rmdir(path, dir_fd=dir_fd)
            removed.append(parent)

    monkeypatch.setattr(os, "mkdir", mkdir_as_a_delete_races_it)
    etag = store.put("pipe/data/collect/new", b"body")
    monkeypatch.undo()
    assert removed == [parent]
    assert store.get("pipe/data/collect/new") == Blob(b"body", etag, {})


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_store_whose_directory_is_gone_says_so_and_never_reads_as_empty(
    root: Path, how: str
) -> None:
    """The store's directory removed, or emptied (a share unmounted leaves its mount point
    empty), under a running store: every call says the store is gone and how to fix it; a
    read never answers "no such object" and a listing never answers nothing, which would
    show a task as undeclared and a stage as empty."""
    store = FileStore(str(root))
    task = om.Task.create(store, "job", stages=["a"])
    task.declare("x", "a")
    agent = task.agent("p")
    store.put("obj", b"body")
    if how == "removed":
        subprocess.run(["rm", "-rf", str(root)], check=True)
    else:
        for child in root.iterdir():
            subprocess.run(["rm", "-rf", str(child)], check=True)
    calls: dict[str, Any] = {
        "get": lambda: store.get("obj"),
        "get a missing key": lambda: store.get("never"),
        "head": lambda: store.head("obj"),
        "open": lambda: store.open("obj"),
        "list": lambda: list(store.list("")),
        "put": lambda: store.put("new", b"x"),
        "create": lambda: store.put("new", b"x", mode=CREATE),
        "update": lambda: store.put("obj", b"y", mode=PutMode.update('"abc"')),
        "delete": lambda: store.delete("obj"),
        "multipart": lambda: store.create_upload("big"),
        "entry": lambda: task.entry("x"),
        "claim": lambda: agent.claim("x"),
        "declare": lambda: task.declare("y", "a"),
        "status": lambda: task.status(),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError, match="no longer holds the store") as raised:
            call()
        assert str(root) in str(raised.value), name
        assert "restore or remount it" in str(raised.value), name
    assert not os.path.exists(root / ".objmanifest")  # nothing made again behind the user


def test_a_failure_to_look_at_the_stores_directory_is_not_taken_for_it_gone(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a missing ``.objmanifest/`` means the store is gone: a look at it that fails
    otherwise (EIO, ESTALE, a soft NFS mount's timeout) leaves a missing object missing."""
    reserved = store.directory.reserved
    real_stat = os.stat

    def failing_on_the_reserved_directory(path: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fsencode(path) == reserved:
            raise OSError(errno.EIO, "Input/output error")
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", failing_on_the_reserved_directory)
    with pytest.raises(NoSuchObject):
        store.get("never")
    assert list(store.list("")) == []


def test_a_store_restored_under_a_running_process_is_locked_through_its_new_lock_file(
    root: Path,
) -> None:
    """A thread keeps its description of the lock file; once the store's directory is
    removed and made again (restored, remounted), that file is gone and its locks exclude
    nobody: the next lock is taken through the lock file now at the path."""
    store = FileStore(str(root))
    store.put("k", b"v0")  # a replace: under the lock, so this thread opened the lock file
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir()
    restored = FileStore(str(root))  # the store made again at the same path
    etag = restored.put("k", b"v1", mode=CREATE)
    assert store.put("k", b"v2", mode=PutMode.update(etag))  # locks through `store`
    held = os.fstat(store.locks._description().fd)
    assert held.st_nlink > 0
    assert held.st_ino == os.stat(restored.directory.locks).st_ino
    assert restored.get("k") == Blob(b"v2", store.head("k").etag, {})


# -- objects --------------------------------------------------------------------------------


def test_the_etag_is_the_checksum_of_the_body_and_a_stream_is_digested_as_written(
    store: FileStore,
) -> None:
    body = os.urandom(3 * 1024 * 1024 + 5)
    streamed = store.put("big", io.BytesIO(body), metadata={"m": "1"})
    assert streamed == f'"{checksum.of_bytes(body)}"'
    assert store.head("big") == Head(streamed, len(body), {"m": "1"})
    assert store.head("big").completed_upload is None
    assert store.put("small", body[:10]) == f'"{checksum.of_bytes(body[:10])}"'
    assert store.put("empty", b"") == f'"{checksum.of_bytes(b"")}"'
    assert store.put("empty stream", io.BytesIO()) == f'"{checksum.of_bytes(b"")}"'
    stream = store.open("big", (1000, 2000))
    assert stream.read() == body[1000:2000]
    stream.close()
    assert store.get("big", if_none_match=streamed) is None


def test_an_object_an_earlier_release_wrote_with_its_md5_etag_is_read_and_updated(
    store: FileStore,
) -> None:
    """Earlier releases gave an object the MD5 of its body as its ETag; the ETag is opaque,
    so such a file keeps answering conditions on it, and its next version gets a checksum."""
    body = b'{"old": "version"}'
    path = store.object_path("doc")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(file_io.header_bytes(md5(body), {}) + body)
    old = f'"{md5(body)}"'
    assert store.get("doc") == Blob(body, old, {})
    assert store.get("doc", if_none_match=old) is None
    with pytest.raises(PreconditionFailed):
        store.put("doc", b"new", mode=PutMode.update(f'"{checksum.of_bytes(body)}"'))
    assert store.put("doc", b"new", mode=PutMode.update(old)) == f'"{checksum.of_bytes(b"new")}"'
    assert store.get("doc") == Blob(b"new", f'"{checksum.of_bytes(b"new")}"', {})


def test_a_large_header_is_read_whole(store: FileStore) -> None:
    metadata = {f"key-{i}": "v" * 100 for i in range(200)}  # 20 KB of metadata
    etag = store.put("meta", b"body", metadata=metadata)
    assert store.head("meta") == Head(etag, 4, metadata)
    assert store.get("meta") == Blob(b"body", etag, metadata)
    assert store.open("meta").read() == b"body"


DAMAGE = {
    "emptied": lambda whole: b"",
    "overwritten": lambda whole: b"{ not json",
    "cut in its header": lambda whole: whole[:40],
    "cut in its body": lambda whole: whole[: len(whole) - 3],
}
"""A file of the store's tree damaged by hand: each reads as an object of all its bytes."""


def damage_by_hand(store: FileStore, key: str, damage: str) -> bytes:
    """The file of ``key`` damaged as ``DAMAGE[damage]`` says, in place; its bytes now."""
    path = store.object_path(key)
    with open(path, "rb") as f:
        broken = DAMAGE[damage](f.read())
    with open(path, "wb") as f:
        f.write(broken)
    return broken


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_objects_file_reads_as_a_damaged_object(store: FileStore, damage: str) -> None:
    """A file whose header was damaged or cut short reads as an object whose bytes are the
    whole file (its ETag their checksum), as a damaged object reads on any store, and is
    replaced only over that ETag."""
    store.put("k", b'{"a": 1}', metadata={"m": "1"})
    broken = damage_by_hand(store, "k", damage)
    if damage == "cut in its body":  # the header is sound: a shorter body, its ETag as it was
        assert store.get("k").body == b'{"a":'  # type: ignore[union-attr]
        return
    etag = f'"{checksum.of_bytes(broken)}"'
    assert store.get("k") == Blob(broken, etag, {})
    assert store.head("k") == Head(etag, len(broken), {})
    assert store.open("k").read() == broken
    assert store.get("k", if_none_match=etag) is None
    with pytest.raises(PreconditionFailed):
        store.put("k", b"new", mode=PutMode.update(f'"{checksum.of_bytes(b"other")}"'))
    store.put("k", b"new", mode=PutMode.update(etag))
    assert store.get("k").body == b"new"  # type: ignore[union-attr]


@pytest.mark.parametrize("damage", ["emptied", "overwritten", "cut in its header"])
def test_a_damaged_shard_is_reported_and_repaired_and_damaged_data_fails_its_checksum(
    store: FileStore, damage: str
) -> None:
    """By hand on the directory: a shard whose file is damaged is named by ``status`` and
    rebuilt by ``repair`` (its bytes kept aside); a data file damaged so sends its entry back
    to be produced again (``ChecksumMismatch``), never a bare error that leaves it ready."""
    task = om.Task.create(store, "job", stages=["a"])
    task.declare_many([("d", "a"), ("e", "a")])
    producer = task.agent("p")
    claim = producer.claim("d")
    assert claim is not None
    entry = producer.put(claim, b"the data of d")
    assert entry.key is not None
    damage_by_hand(store, entry.key, damage)
    with pytest.raises(om.ChecksumMismatch, match="'d'"):
        task.agent("c").consume("d")
    assert task.entry("d").state is om.State.failed

    shard = next(row.key for row in store.list("job/shards/"))
    broken = damage_by_hand(store, shard, damage)
    fresh = om.Task.open(store, "job")
    assert [(d.key, d.kind) for d in fresh.status().damaged] == [(shard, "shard")]
    report = fresh.repair()
    [rebuilt] = report.objects
    assert (rebuilt.key, rebuilt.action) == (shard, "rebuilt")
    assert rebuilt.moved_to is not None and store.get(rebuilt.moved_to).body == broken  # type: ignore[union-attr]
    assert fresh.status().damaged == []
    assert {fresh.entry("d").state, fresh.entry("e").state} <= {om.State.failed, om.State.pending}


# -- races between threads and processes ------------------------------------------------------


def worker(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> list[str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.splitlines()


@pytest.mark.heavy
def test_concurrent_creates_from_processes_have_exactly_one_winner_each(
    root: Path, store: FileStore
) -> None:
    keys = [f"race/{i}" for i in range(20)]
    go = root.parent / "go"
    processes = [worker(root, "create", str(go), *keys) for _ in range(6)]
    time.sleep(0.5)  # not a timed assertion: the racers start together once it exists
    go.touch()
    outputs = [finish(p) for p in processes]
    for key in keys:
        winners = [p.pid for p, out in zip(processes, outputs, strict=False) if f"won {key}" in out]
        assert len(winners) == 1, (key, outputs)
        assert store.get(key).body == str(winners[0]).encode()  # type: ignore[union-attr]
    assert list(os.scandir(store.directory.tmp)) == []  # every temporary file went


@pytest.mark.heavy
def test_read_modify_update_from_threads_of_several_processes_loses_no_increment(
    root: Path, store: FileStore
) -> None:
    store.put("counter", b"0", mode=CREATE)
    go = root.parent / "go"
    processes = [worker(root, "increment", str(go), "counter", "3", "15") for _ in range(3)]
    done = [0] * 3

    def here(i: int) -> None:  # threads of this process too
        while not go.exists():
            time.sleep(0.001)
        while done[i] < 15:
            blob = store.get("counter")
            assert blob is not None
            try:
                store.put("counter", b"%d" % (int(blob.body) + 1), mode=PutMode.update(blob.etag))
            except PreconditionFailed:
                continue
            done[i] += 1

    with ThreadPoolExecutor(3) as pool:
        mine = [pool.submit(here, i) for i in range(3)]
        time.sleep(0.5)
        go.touch()
        for future in mine:
            future.result()
    assert [finish(p) for p in processes] == [["done 45"]] * 3
    assert store.get("counter").body == b"%d" % (4 * 45)  # type: ignore[union-attr]


def test_threads_updating_different_keys_do_not_wait_for_each_other(store: FileStore) -> None:
    """Each key has a lock of its own: a thread holding one does not stop another key."""
    store.put("held", b"0")
    store.put("free", b"0")
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with store.locked(["held"]):
            inside.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait()
    try:
        etag = store.head("free").etag
        store.put("free", b"1", mode=PutMode.update(etag))  # would hang if it waited
        blocked = threading.Thread(target=lambda: store.put("held", b"1"))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive()  # waits for the holder, a thread of the same process
    finally:
        release.set()
        holder.join()
    blocked.join()
    assert store.get("held").body == b"1"  # type: ignore[union-attr]


# -- a writer killed at every step ------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("mode", ["update", "create"])
def test_a_writer_killed_at_any_step_leaves_a_whole_object_and_no_lock(
    root: Path, store: FileStore, mode: str
) -> None:
    """Killed (SIGKILL) just before each system call of a put in turn: the object is then
    the old version or the new one, whole, with the ETag of its bytes; its lock went with
    the process (the next update does not wait); what it left in ``tmp/`` is swept."""
    old = b"old version " * 1000
    if mode == "update":
        store.put("doc", old)
    for step in range(1, 100):
        new = b"new version %d " % step * 1000
        process = worker(root, "killed", mode, "doc", new.decode(), str(step))
        out, err = process.communicate(timeout=120)
        if process.returncode == 0:
            assert out.startswith("done"), out
            assert int(out.split()[1]) < step  # every step was tried
            break
        assert process.returncode == -9, err
        try:
            blob = store.get("doc")
        except NoSuchObject:
            assert mode == "create"
            continue
        assert blob is not None and blob.body in (old, new), step
        assert blob.etag == f'"{checksum.of_bytes(blob.body)}"'
        assert store.head("doc") == Head(blob.etag, len(blob.body), {})
        if mode == "create":
            assert blob.body == new
            store.delete("doc")
        else:
            store.put("doc", old, mode=PutMode.update(blob.etag))  # not held by the dead
    else:
        raise AssertionError("the put never finished")
    assert step > 8  # the steps between "written" and "in place" were all tried
    left = list(os.scandir(store.directory.tmp))
    assert store.directory.sweep(time.time() + STALE_AFTER + 1) == len(left)
    assert list(os.scandir(store.directory.tmp)) == []
    assert [row.key for row in store.list("")] == ["doc"]


def test_stale_temporary_files_are_swept_when_the_clock_is_read(store: FileStore) -> None:
    tmp = Path(os.fsdecode(store.directory.tmp))
    stale, fresh, gone_upload = tmp / "stale", tmp / "fresh", tmp / "removed-upload"
    stale.write_bytes(b"left by a writer that died")
    fresh.write_bytes(b"being written")
    gone_upload.mkdir()
    (gone_upload / "1.0123").write_bytes(b"part")
    long_ago = time.time() - STALE_AFTER - 60
    for path in (stale, gone_upload):
        os.utime(path, (long_ago, long_ago))
    store.now()  # the first look at the clock sweeps (no sweep was ever recorded)
    assert sorted(p.name for p in tmp.iterdir()) == ["fresh"]
    stale.write_bytes(b"again")
    os.utime(stale, (long_ago, long_ago))
    FileStore(store.root).now()  # a sweep was recorded a moment ago: none is due
    assert sorted(p.name for p in tmp.iterdir()) == ["fresh", "stale"]


# -- multipart uploads ----------------------------------------------------------------------------


def test_multipart_parts_are_files_completed_create_only(store: FileStore) -> None:
    upload = store.create_upload("mp")
    first = store.upload_part("mp", upload, 1, b"a" * 1000)
    again = store.upload_part("mp", upload, 1, b"b" * 999)  # kept beside the first
    last = store.upload_part("mp", upload, 2, io.BytesIO(b"tail").getvalue())
    assert store.list_parts("mp", upload) == {1: {first: 1000, again: 999}, 2: {last: 4}}
    with pytest.raises(PartsRejected):
        store.complete_upload("mp", upload, [first, md5(b"never sent")])
    with pytest.raises(UploadGone):
        store.complete_upload("other", upload, [first, last])  # an upload of another key
    store.complete_upload("mp", upload, [again, last])  # no 5 MiB minimum here
    blob = store.get("mp")
    assert blob is not None and blob.body == b"b" * 999 + b"tail"
    assert checksum.bare_etag(blob.etag) == checksum.multipart_etag([again, last])
    assert store.head("mp").completed_upload == upload  # recorded in the object's header
    assert completed_from(store.head("mp"), "another", [again, last]) is False
    assert list(store.list_uploads("")) == []
    second = store.create_upload("mp")
    part = store.upload_part("mp", second, 1, b"late")
    with pytest.raises(PreconditionFailed):
        store.complete_upload("mp", second, [part])
    assert store.get("mp") == blob
    assert list(store.list_uploads("m")) == [("mp", second)]
    assert store.abort_upload("mp", second) is True
    assert store.abort_upload("mp", second) is False


@pytest.mark.parametrize("upload_id", ["../../mp", "", "a/b", ".", "x" * 200, "\x00"])
def test_an_upload_id_the_store_never_made_is_gone(store: FileStore, upload_id: str) -> None:
    with pytest.raises(UploadGone):
        store.upload_part("mp", upload_id, 1, b"x")
    with pytest.raises(UploadGone):
        store.list_parts("mp", upload_id)
    with pytest.raises(UploadGone):
        store.complete_upload("mp", upload_id, [md5(b"x")])
    assert store.abort_upload("mp", upload_id) is False
    assert sorted(os.listdir(store.root)) == [".objmanifest"]


def test_a_part_number_out_of_range_is_refused(store: FileStore) -> None:
    upload = store.create_upload("mp")
    for number in (0, -1, 10_001):
        with pytest.raises(StoreError, match="part numbers are 1 to 10000"):
            store.upload_part("mp", upload, number, b"x")


# -- the clock -------------------------------------------------------------------------------------


def test_the_clock_is_the_filesystems_not_the_processs(root: Path, store: FileStore) -> None:
    """A process whose wall clock is an hour ahead (libfaketime) reads the store's time
    from the filesystem: the time the kernel (on NFS, the server) stamps on a file."""
    found = sorted(glob.glob(FAKETIME_GLOB))
    if not found:  # a missing tool must not turn this test into a silent pass
        pytest.fail(f"libfaketime is not installed (no {FAKETIME_GLOB}): install `faketime`")
    env = {
        **os.environ,
        "LD_PRELOAD": found[0],
        "FAKETIME": "+1h",
        "FAKE_UTIME": "1",  # utime(NULL) is the kernel's, as on NFS it is the server's
        "NO_FAKE_STAT": "1",
    }
    out = subprocess.run(
        [sys.executable, str(WORKER), str(root), "now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    store_time, its_wall_clock = float(out[1]), float(out[2])
    assert abs(its_wall_clock - time.time() - 3600) < 60  # the process's clock is skewed
    assert abs(store_time - time.time()) < 60  # the store's is not
    assert abs(store.now().timestamp() - store_time) < 60


def test_now_advances_between_looks_at_the_filesystem(store: FileStore) -> None:
    first = store.now()
    second = store.now()
    assert second >= first
    stamped = os.stat(store.directory.clock).st_mtime
    assert stamped <= first.timestamp() < stamped + 1


def test_the_clock_keeps_the_filesystems_fractions_of_a_second(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's time is the clock file's mtime to the nanosecond, not cut to whole
    seconds as a ``Date`` header is: processes on one share then agree within
    milliseconds, not within a second (claims stamped before their declarations)."""
    monkeypatch.setattr(Directory, "time", lambda self: 1_800_000_000.75)
    stores = [FileStore(str(root)) for _ in range(2)]
    times = [s.now().timestamp() for s in stores]
    assert all(1_800_000_000.75 <= t < 1_800_000_000.8 for t in times), times


@pytest.mark.parametrize("refusal", ["read-only mount", "may not write", "clock only"])
def test_a_process_that_may_write_nothing_reads_by_its_own_clock(
    root: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    """On a read-only mount, or for a user who may write neither the clock file nor
    ``tmp/``, the clock file cannot be stamped: reads (``status`` among them) go on by this
    machine's clock, where they failed before. A process that may write ``tmp/`` (and so
    commit) but not the clock file is refused the time, never given its own clock to judge a
    lease by."""
    task = om.Task.create(FileStore(str(root)), "job", stages=["a"], lease_seconds=60)
    task.declare("x", "a")
    real_utime, real_access = os.utime, os.access
    code = errno.EROFS if refusal == "read-only mount" else errno.EACCES

    def refused(path: Any, *args: Any, **kwargs: Any) -> None:
        if "dir_fd" in kwargs or os.fsdecode(path).startswith(str(root)):  # the store's files
            raise OSError(code, os.strerror(code), path)
        real_utime(path, *args, **kwargs)

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if refusal == "may not write" and os.fsdecode(path).startswith(str(root)):
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "utime", refused)
    monkeypatch.setattr(os, "access", access)
    reader = om.Task.open(FileStore(str(root)), "job")
    if refusal == "clock only":
        with pytest.raises(om.AccessDenied, match="clock"):
            reader.status()
        return
    assert abs(reader.store.now().timestamp() - time.time()) < 60
    assert reader.status().stages["a"]["pending"] == 1
    assert reader.entry("x").state is om.State.pending


def test_a_chunked_entry_streams_its_parts_into_part_files(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suites run every store inside a ``FaultyStore``, which reads bodies whole: here
    the data path streams a file's parts (``PartStream``) into the store itself."""
    streamed: list[int] = []
    write_stream = file_io.write_stream

    def spy(fd: int, body: Any, length: int) -> str:
        streamed.append(length)
        return write_stream(fd, body, length)

    monkeypatch.setattr(file_io, "write_stream", spy)
    source = tmp_path / "big.bin"
    data = os.urandom(11 * 1024 * 1024 + 7)
    source.write_bytes(data)
    task = om.Task.create(store, "job", stages=["make"], lease_seconds=60)
    task.declare("big", "make")
    agent = task.agent("maker")
    claim = agent.claim("big")
    assert claim is not None
    entry = agent.put(claim, source, part_size=5 * 1024 * 1024, threshold=1024 * 1024)
    assert entry.state is om.State.ready and entry.size == len(data)
    head = store.head(entry.key or "")
    assert head.size == len(data) and head.completed_upload is not None
    got = tmp_path / "got.bin"
    task.agent("reader").consume("big", dest=got)
    assert got.read_bytes() == data
    assert list(store.list_uploads("")) == []
    assert sorted(streamed) == [1024 * 1024 + 7, 5 * 1024 * 1024, 5 * 1024 * 1024]
