"""The conformance suite: every promise of the storage seam, one suite for every backend.

Each test gets a fresh ``ObjectStore`` under a prefix of its own, from ``MemoryStore``, from
every store of another scheme the run has (``file://``, Azurite, fake-gcs-server) and from
every S3 server (moto and SeaweedFS, or the endpoint named by ``OBJMANIFEST_TEST_ENDPOINT``),
and holds it to the promises of ``objmanifest.store.base`` with exact assertions. A backend
that answers differently has a bug in its implementation, never a reason to loosen a test
here. Faults are staged on every backend by ``FaultyStore``, the wrapper around any store
(``MemoryStore`` is it around the in-process backend), and on an S3 server also by a
``FaultProxy`` in front of it. What is S3's own (MD5 part ETags, the multipart ETag, the
5 MiB minimum part, the wire) is in ``test_conformance_s3.py``. A test of a capability an
emulator does not enforce is marked ``needs(CAPABILITY)`` and runs there as a strict xfail.

    bash scripts/test.sh -m conformance
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from datetime import datetime, timedelta, timezone

import pytest

from objmanifest.core import checksum
from objmanifest.errors import InvalidInput, ObjManifestError, ReadBrokeOff, StoreError
from objmanifest.store import (
    CREATE,
    OVERWRITE,
    Blob,
    FaultyStore,
    Head,
    Listed,
    MemoryStore,
    ObjectStore,
    PutMode,
    completed_from,
    get_if_any,
)
from objmanifest.store.errors import (
    NoSuchObject,
    OutcomeUnknown,
    PartsRejected,
    PreconditionFailed,
    UploadGone,
)
from tests.support.conformance import (
    MEMORY_BUCKET,
    PART,
    STALE,
    THREADS,
    Backend,
    MiB,
    assert_own_stream,
    data,
    faulted,
    fresh_store,
    make_backend,
    md5,
)
from tests.support.stores import backends, other_stores

pytestmark = [pytest.mark.conformance, pytest.mark.behaviour]


@pytest.fixture(scope="session", params=["memory", *other_stores(), *backends()])
def backend(request: pytest.FixtureRequest) -> Backend:
    return make_backend(request)


@pytest.fixture
def store(backend: Backend, prefix: str) -> Iterator[ObjectStore]:
    yield from fresh_store(backend, prefix)


# -- objects -----------------------------------------------------------------------------------


def test_put_get_head_and_open_agree_on_bytes_etag_and_metadata(store: ObjectStore) -> None:
    body = data(10_000)
    meta = {"owner": "agent-1", "stage": "collect", "epoch": "3"}
    etag = store.put("a/one", body, metadata=meta, content_type="application/json")
    assert checksum.bare_etag(etag)
    assert store.get("a/one") == Blob(body, etag, meta)
    assert store.head("a/one") == Head(etag, len(body), meta)
    stream = store.open("a/one")
    try:
        assert stream.read() == body
        assert stream.read() == b""
    finally:
        stream.close()

    # Without metadata there is none; a file object is a body too; a new body, a new ETag.
    second = data(3_000, seed=1)
    etag2 = store.put("a/one", io.BytesIO(second))
    assert etag2 != etag
    assert store.get("a/one") == Blob(second, etag2, {})
    assert store.head("a/one") == Head(etag2, len(second), {})


def test_an_empty_object(store: ObjectStore) -> None:
    etag = store.put("empty", b"", mode=CREATE)
    assert store.get("empty") == Blob(b"", etag, {})
    assert store.head("empty") == Head(etag, 0, {})
    stream = store.open("empty")
    assert stream.read() == b""
    stream.close()


def test_missing_objects_are_no_such_object(store: ObjectStore) -> None:
    store.put("there", b"x")
    for call in (
        lambda: store.get("missing"),
        lambda: store.get("missing", if_none_match=STALE),
        lambda: store.head("missing"),
        lambda: store.open("missing"),
        lambda: store.open("missing", (0, 1)),
        lambda: store.head("there/"),
        lambda: store.head("ther"),
    ):
        with pytest.raises(NoSuchObject) as info:
            call()
        assert type(info.value) is NoSuchObject
        assert not isinstance(info.value, ObjManifestError)  # an outcome, not a user's error
        assert info.value.address in (store.describe(k) for k in ("missing", "there/", "ther"))
        assert str(info.value) == f"{info.value.address} does not exist"


def test_delete_removes_the_object_and_a_missing_key_is_fine(store: ObjectStore) -> None:
    store.put("doomed", b"bytes")
    store.put("kept", b"bytes")
    assert store.delete("doomed") is None
    with pytest.raises(NoSuchObject):
        store.get("doomed")
    with pytest.raises(NoSuchObject):
        store.head("doomed")
    store.delete("doomed")  # again: nothing there, no error
    store.delete("never/was")
    assert list(store.list("")) == [Listed("kept")]


def test_overwrite_always_replaces(store: ObjectStore) -> None:
    first = store.put("k", b"one")
    second = store.put("k", b"two", mode=OVERWRITE)
    third = store.put("k", b"three")  # OVERWRITE is the default
    assert len({first, second, third}) == 3
    assert store.get("k") == Blob(b"three", third, {})


def test_create_writes_only_where_nothing_is(store: ObjectStore) -> None:
    etag = store.put("once", b"first", mode=CREATE, metadata={"who": "a"})
    with pytest.raises(PreconditionFailed):
        store.put("once", b"second", mode=CREATE, metadata={"who": "b"})
    assert store.get("once") == Blob(b"first", etag, {"who": "a"})
    # The same bytes again are refused too: the condition is on the key, not the content.
    with pytest.raises(PreconditionFailed):
        store.put("once", b"first", mode=CREATE)
    store.delete("once")
    again = store.put("once", b"third", mode=CREATE)
    assert store.get("once") == Blob(b"third", again, {})


def test_update_needs_the_current_etag(store: ObjectStore) -> None:
    v1 = store.put("doc", b"v1")
    v2 = store.put("doc", b"v2", mode=PutMode.update(v1))
    assert store.get("doc") == Blob(b"v2", v2, {})
    with pytest.raises(PreconditionFailed):  # v1 is stale now
        store.put("doc", b"v3", mode=PutMode.update(v1))
    with pytest.raises(PreconditionFailed):
        store.put("doc", b"v3", mode=PutMode.update(STALE))
    assert store.get("doc") == Blob(b"v2", v2, {})
    v3 = store.put("doc", b"v3", mode=PutMode.update(v2), metadata={"version": "3"})
    assert store.get("doc") == Blob(b"v3", v3, {"version": "3"})

    # A missing object is a lost race too (AWS answers 404 there, SeaweedFS 412).
    with pytest.raises(PreconditionFailed):
        store.put("never", b"x", mode=PutMode.update(v3))
    store.delete("doc")
    with pytest.raises(PreconditionFailed):
        store.put("doc", b"v4", mode=PutMode.update(v3))
    with pytest.raises(NoSuchObject):
        store.get("doc")
    with pytest.raises(NoSuchObject):
        store.get("never")


def test_get_if_none_match_sends_nothing_while_unchanged(store: ObjectStore) -> None:
    v1 = store.put("watched", b"v1", metadata={"n": "1"})
    assert store.get("watched", if_none_match=v1) is None
    assert store.get("watched", if_none_match=checksum.bare_etag(v1)) is None
    assert store.get("watched", if_none_match=STALE) == Blob(b"v1", v1, {"n": "1"})
    v2 = store.put("watched", b"v2", metadata={"n": "2"})
    assert store.get("watched", if_none_match=v1) == Blob(b"v2", v2, {"n": "2"})
    assert store.get("watched", if_none_match=v2) is None


def test_get_if_any_answers_none_for_a_missing_object_and_the_blob_otherwise(
    store: ObjectStore,
) -> None:
    etag = store.put("present", b"here", metadata={"n": "1"})
    assert get_if_any(store, "present") == Blob(b"here", etag, {"n": "1"})
    assert get_if_any(store, "absent") is None
    store.delete("present")
    assert get_if_any(store, "present") is None


# -- races between threads ---------------------------------------------------------------------


def test_concurrent_creates_of_one_key_have_exactly_one_winner(store: ObjectStore) -> None:
    for round_ in range(2):
        key = f"contended-{round_}"
        start = threading.Barrier(THREADS)

        def create(i: int, key: str = key, start: threading.Barrier = start) -> str | None:
            body = f"writer {i}".encode()
            start.wait()
            try:
                return store.put(key, body, mode=CREATE, metadata={"writer": str(i)})
            except PreconditionFailed:
                return None

        with ThreadPoolExecutor(THREADS) as pool:
            outcomes = list(pool.map(create, range(THREADS)))
        winners = [(i, etag) for i, etag in enumerate(outcomes) if etag is not None]
        assert len(winners) == 1, outcomes
        ((winner, etag),) = winners
        assert store.get(key) == Blob(f"writer {winner}".encode(), etag, {"writer": str(winner)})


def test_concurrent_read_modify_update_loses_no_increment(store: ObjectStore) -> None:
    per_thread = 5
    store.put("counter", b"0", mode=CREATE)
    start = threading.Barrier(THREADS)

    def increment(i: int) -> int:
        start.wait()
        done = 0
        while done < per_thread:
            blob = store.get("counter")
            assert blob is not None
            try:
                store.put("counter", b"%d" % (int(blob.body) + 1), mode=PutMode.update(blob.etag))
            except PreconditionFailed:  # another thread wrote first: read again
                continue
            done += 1
        return done

    with ThreadPoolExecutor(THREADS) as pool:
        assert list(pool.map(increment, range(THREADS))) == [per_thread] * THREADS
    final = store.get("counter")
    assert final is not None and final.body == b"%d" % (THREADS * per_thread)
    assert store.head("counter").etag == final.etag


# -- lost answers --------------------------------------------------------------------------------


@faulted
@pytest.mark.parametrize("kind", ["overwrite", "create", "update"])
def test_a_write_whose_answer_is_lost_is_outcome_unknown_and_applied(
    backend: Backend, store: ObjectStore, prefix: str, kind: str
) -> None:
    key = f"lost-{kind}"
    mode = {"overwrite": OVERWRITE, "create": CREATE}.get(kind)
    if mode is None:
        mode = PutMode.update(store.put(key, b"before"))
    body = data(50_000, seed=7)
    with backend.faulty(prefix) as faulty:
        faulty.lose("put", key)
        with pytest.raises(OutcomeUnknown):
            faulty.store.put(key, body, mode=mode, metadata={"kind": kind})
        assert faulty.fired() == 1
    blob = store.get(key)
    assert blob is not None
    assert (blob.body, blob.metadata) == (body, {"kind": kind})
    assert store.head(key) == Head(blob.etag, len(body), {"kind": kind})


@faulted
def test_a_multipart_completion_whose_answer_is_lost_is_outcome_unknown_and_applied(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    part = data(1000, seed=3)
    with backend.faulty(prefix) as faulty:
        upload_id = faulty.store.create_upload("big")
        etag = faulty.store.upload_part("big", upload_id, 1, part)
        faulty.lose("complete_upload", "big")
        with pytest.raises(OutcomeUnknown):
            faulty.store.complete_upload("big", upload_id, [etag])
        assert faulty.fired() == 1
    blob = store.get("big")
    assert blob is not None and blob.body == part
    assert completed_from(store.head("big"), upload_id, [etag]) is True
    assert list(store.list_uploads("")) == []


@faulted
def test_a_delete_whose_answer_is_lost_is_a_store_error_and_applied(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    """Not ``OutcomeUnknown``, which no caller of a delete expects (``gc`` would let it out):
    a ``StoreError`` on every backend (found by the simulation, seed 0:
    ``tests/support/sim.py``)."""
    store.put("doomed", b"bytes")
    with backend.faulty(prefix) as faulty:
        faulty.lose("delete", "doomed")
        with pytest.raises(StoreError) as raised:
            faulty.store.delete("doomed")
        assert faulty.fired() == 1
    assert "doomed" in str(raised.value)
    with pytest.raises(NoSuchObject):
        store.head("doomed")


# -- bodies damaged on their way ----------------------------------------------------------------


@faulted
@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("kind", ["overwrite", "create", "update"])
def test_a_whole_object_damaged_on_its_way_is_refused_and_sent_again(
    backend: Backend, store: ObjectStore, prefix: str, kind: str, how: str
) -> None:
    """Every whole-object write carries its Content-MD5: a store that verifies it refuses
    the damaged body (nothing stored), and the store layer sends it again, with the same
    condition. The wrapper refuses it as such a store does; the moto server behind the proxy
    does not verify: it stores what arrived (docs/chunked.md)."""
    key = f"damaged-{kind}-{how}"
    mode = {"overwrite": OVERWRITE, "create": CREATE}.get(kind)
    if mode is None:
        mode = PutMode.update(store.put(key, b"before"))
    body = data(20_000, seed=5)
    with backend.faulty(prefix) as faulty:
        faulty.damage("put", key, how, 2)
        etag = faulty.store.put(key, body, mode=mode, metadata={"kind": kind})
        fired = faulty.fired()
        verifies = faulty.verifies
    blob = store.get(key)
    assert blob is not None
    if verifies:
        assert fired == 2  # two damaged sends refused, the third landed
        assert (blob.body, blob.etag, blob.metadata) == (body, etag, {"kind": kind})
        assert store.head(key).etag == etag
    else:
        assert fired == 1  # taken as it arrived: nothing told the client
        assert blob.body != body and checksum.bare_etag(etag) == md5(blob.body)


@faulted
def test_a_body_damaged_at_every_send_is_given_up_and_nothing_is_stored(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    before = store.put("always", b"before")
    with backend.faulty(prefix) as faulty:
        faulty.damage("put", "always", "flip", 100)
        breaks = faulty.refusal_breaks
        if not faulty.verifies:
            faulty.store.put("always", b"after", mode=PutMode.update(before))
            assert store.get("always").body != b"after"  # type: ignore[union-attr]
            return
        with pytest.raises(StoreError, match="4 times as damaged on its way"):
            faulty.store.put("always", b"after", mode=PutMode.update(before))
        assert faulty.fired() == 4
    if breaks:  # LocalStack: the old bytes are gone, its ETag stays
        with pytest.raises(StoreError, match="broke off"):
            store.get("always")
        assert store.head("always").etag == before
        return
    assert store.get("always") == Blob(b"before", before, {})


# -- reads ---------------------------------------------------------------------------------------


def test_ranged_reads_return_exactly_the_range(store: ObjectStore) -> None:
    body = data(300_000, seed=11)
    n = len(body)
    store.put("ranged", body)
    ranges = [(0, 1), (0, n), (1, n), (n - 1, n), (12_345, 54_321), (99, 100), (0, 0), (7, 7)]
    ranges.append((n - 10, n + 1000))  # an end past the end is the end
    for start, end in ranges:
        stream = store.open("ranged", (start, end))
        try:
            assert_own_stream(stream)
            assert stream.read() == body[start:end], (start, end)
            assert stream.read() == b""
        finally:
            stream.close()
    for start, end in [(n, n + 10), (n + 5, n + 6), (n, n)]:  # nothing there to read
        with pytest.raises(StoreError):
            store.open("ranged", (start, end)).read()
    with pytest.raises(NoSuchObject):
        store.open("missing", (3, 3))


def test_a_whole_open_streams_everything_in_chunks(store: ObjectStore) -> None:
    body = data(MiB + 17, seed=5)
    store.put("whole", body)
    stream = store.open("whole")
    assert_own_stream(stream)
    chunks = []
    try:
        while chunk := stream.read(64 * 1024):
            assert len(chunk) <= 64 * 1024
            chunks.append(chunk)
        assert stream.read(64 * 1024) == b""
    finally:
        stream.close()
    assert len(chunks) >= 17
    assert b"".join(chunks) == body


@faulted
@pytest.mark.parametrize("how", ["chunks", "all-at-once"])
@pytest.mark.parametrize("byte_range", [None, (1000, 201_000)], ids=["whole", "ranged"])
def test_a_read_that_breaks_off_raises_read_broke_off(
    backend: Backend,
    store: ObjectStore,
    prefix: str,
    how: str,
    byte_range: tuple[int, int] | None,
) -> None:
    body = data(400_000, seed=13)
    store.put("fragile", body)
    expected = body if byte_range is None else body[byte_range[0] : byte_range[1]]
    received = bytearray()
    with backend.faulty(prefix) as faulty:
        faulty.cut("fragile", len(expected))
        stream = faulty.store.open("fragile", byte_range)
        assert_own_stream(stream)
        try:
            with pytest.raises(ReadBrokeOff) as info:
                if how == "all-at-once":
                    received += stream.read()
                while chunk := stream.read(16 * 1024):
                    received += chunk
        finally:
            stream.close()
        assert faulty.fired() == 1
        assert isinstance(info.value, StoreError)
        assert len(received) <= len(expected) // 2
        assert bytes(received) == expected[: len(received)]
        # The next read through the same store is whole again.
        again = faulty.store.open("fragile", byte_range)
        try:
            assert again.read() == expected
        finally:
            again.close()


# -- listing ---------------------------------------------------------------------------------------


def put_many(store: ObjectStore, keys: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: store.put(key, key.encode()), keys))


def test_list_pages_through_more_than_a_thousand_keys_and_prefixes(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    # 1100 "subfolders" with one object each: more than one S3 page (1000) of keys, and of
    # common prefixes with a delimiter.
    many = [f"many/{i:04d}/obj" for i in range(1100)]
    near = ["many", "manyx/obj", "many.json"]  # not under "many/"
    put_many(store, many + near)
    backend.connect(f"{prefix}-sibling").put("many/0000/obj", b"another store's")
    backend.connect("").put(f"{prefix}.json", b"beside the store's prefix")

    assert list(store.list("many/")) == [Listed(key) for key in many]
    rolled = list(store.list("many/", delimiter="/"))
    assert rolled == [Listed(f"many/{i:04d}/", True) for i in range(1100)]
    everything = list(store.list(""))
    assert everything == [Listed(key) for key in sorted(many + near)]
    assert len({row.key for row in everything}) == len(everything)


def test_list_with_a_delimiter_rolls_up_subfolders(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    keys = [
        "tasks/a/task.json",
        "tasks/a/shards/s1.json",
        "tasks/a/shards/s2.json",
        "tasks/b/task.json",
        "tasks/c/d/e",
        "tasks/index.json",
        "tasks/zz",
        "tasksx/other",
        "top",
    ]
    put_many(store, keys)
    backend.connect(f"{prefix}-sibling").put("tasks/q/task.json", b"another store's")
    expected = {
        ("tasks/", "/"): [
            Listed("tasks/a/", True),
            Listed("tasks/b/", True),
            Listed("tasks/c/", True),
            Listed("tasks/index.json"),
            Listed("tasks/zz"),
        ],
        ("", "/"): [Listed("tasks/", True), Listed("tasksx/", True), Listed("top")],
        ("tasks", "/"): [Listed("tasks/", True), Listed("tasksx/", True)],
        ("tasks/a/", "/"): [Listed("tasks/a/shards/", True), Listed("tasks/a/task.json")],
        ("tasks/c/", "/"): [Listed("tasks/c/d/", True)],
        ("tasks/a/shards/", "/"): [
            Listed("tasks/a/shards/s1.json"),
            Listed("tasks/a/shards/s2.json"),
        ],
        ("nothing/", "/"): [],
        ("tasks/a/", None): [Listed(k) for k in sorted(keys) if k.startswith("tasks/a/")],
        ("", None): [Listed(k) for k in sorted(keys)],
    }
    for (under, delimiter), rows in expected.items():
        assert list(store.list(under, delimiter)) == rows, (under, delimiter)
    with backend.small_pages(store):
        for (under, delimiter), rows in expected.items():
            assert list(store.list(under, delimiter)) == rows, (under, delimiter, "small pages")


# -- multipart uploads -------------------------------------------------------------------------


def test_multipart_upload_round_trip(backend: Backend, store: ObjectStore) -> None:
    """Parts stored, listed with the ETags their uploads answered, invisible until the
    completion makes them one object, which says it was made by that upload."""
    parts = [data(PART, seed=21), data(PART, seed=22), data(1000, seed=23)]
    upload_id = store.create_upload("mp/object")
    etags = [store.upload_part("mp/object", upload_id, n, p) for n, p in enumerate(parts, 1)]
    assert len(set(etags)) == 3 and all(checksum.bare_etag(e) == e for e in etags)
    listed = {n: {etag: len(p)} for n, (etag, p) in enumerate(zip(etags, parts, strict=True), 1)}
    assert store.list_parts("mp/object", upload_id) == listed
    with backend.small_pages(store):
        assert store.list_parts("mp/object", upload_id) == listed
    assert list(store.list_uploads("mp/")) == [("mp/object", upload_id)]
    with pytest.raises(NoSuchObject):  # nothing is visible before completion
        store.head("mp/object")

    store.complete_upload("mp/object", upload_id, etags, mode=CREATE)
    blob = store.get("mp/object")
    assert blob is not None
    assert blob.body == b"".join(parts)
    head = store.head("mp/object")
    assert (head.etag, head.size, head.metadata) == (blob.etag, 2 * PART + 1000, {})
    assert completed_from(head, upload_id, etags) is True
    assert completed_from(head, "another-upload", etags[:2]) is False
    assert list(store.list_uploads("")) == []
    assert store.abort_upload("mp/object", upload_id) is False
    assert list(store.list("mp/")) == [Listed("mp/object")]


def one_part_upload(store: ObjectStore, key: str, body: bytes) -> tuple[str, str]:
    upload_id = store.create_upload(key)
    return upload_id, store.upload_part(key, upload_id, 1, body)


@pytest.mark.needs("conditional_completion")
def test_a_completion_where_an_object_exists_is_refused(store: ObjectStore) -> None:
    etag = store.put("taken", b"first", metadata={"who": "first"})
    upload_id, part = one_part_upload(store, "taken", b"second")
    with pytest.raises(PreconditionFailed):
        store.complete_upload("taken", upload_id, [part])  # CREATE is the default
    with pytest.raises(PreconditionFailed):
        store.complete_upload("taken", upload_id, [part], mode=CREATE)
    assert store.get("taken") == Blob(b"first", etag, {"who": "first"})


def test_a_completion_naming_a_part_not_stored_is_parts_rejected(store: ObjectStore) -> None:
    body = data(PART, seed=31)  # part 1 may not be the last: at least 5 MiB
    upload_id, part = one_part_upload(store, "parts", body)
    with pytest.raises(PartsRejected):
        store.complete_upload("parts", upload_id, [md5(b"other bytes")])
    with pytest.raises(PartsRejected):  # part 2 was never uploaded
        store.complete_upload("parts", upload_id, [part, part])
    with pytest.raises(NoSuchObject):
        store.head("parts")
    # The upload is still open: completing it with the right part works.
    assert list(store.list_uploads("parts")) == [("parts", upload_id)]
    store.complete_upload("parts", upload_id, [part])
    blob = store.get("parts")
    assert blob is not None and blob.body == body
    assert completed_from(store.head("parts"), upload_id, [part]) is True


def test_an_aborted_upload_is_gone(store: ObjectStore) -> None:
    upload_id, part = one_part_upload(store, "aborted", b"bytes")
    assert store.abort_upload("aborted", upload_id) is True
    assert store.abort_upload("aborted", upload_id) is False
    with pytest.raises(UploadGone):
        store.upload_part("aborted", upload_id, 2, b"more")
    with pytest.raises(UploadGone):
        store.list_parts("aborted", upload_id)
    with pytest.raises(UploadGone):
        store.complete_upload("aborted", upload_id, [part])
    assert list(store.list_uploads("")) == []
    with pytest.raises(NoSuchObject):
        store.head("aborted")


def test_list_uploads_lists_open_uploads_under_the_prefix(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    done, done_part = one_part_upload(store, "up/done", b"done")
    aborted = store.create_upload("up/aborted")
    open_ids = {
        ("up/a", store.create_upload("up/a")),
        ("up/b/deep", store.create_upload("up/b/deep")),
        ("up/c", store.create_upload("up/c")),
        ("up/c", store.create_upload("up/c")),  # a second upload of one key
        ("up/d", store.create_upload("up/d")),
    }
    outside = ("upx", store.create_upload("upx"))
    other = backend.connect(f"{prefix}-sibling")
    other_id = other.create_upload("up/a")
    try:
        store.complete_upload("up/done", done, [done_part])
        assert store.abort_upload("up/aborted", aborted) is True

        for pages in (nullcontext(), backend.small_pages(store)):
            with pages:
                listed = list(store.list_uploads("up/"))
                assert sorted(listed) == sorted(open_ids)
                assert len(listed) == len(open_ids)
                assert sorted(store.list_uploads("")) == sorted(open_ids | {outside})
                assert list(store.list_uploads("up/b/")) == [
                    next(u for u in open_ids if u[0] == "up/b/deep")
                ]
                assert list(store.list_uploads("none/")) == []
    finally:
        other.abort_upload("up/a", other_id)


# -- the clock ---------------------------------------------------------------------------------


def test_now_works_on_a_fresh_store_with_no_objects(store: ObjectStore) -> None:
    assert list(store.list("")) == []
    first = store.now()
    assert first.tzinfo is not None and first.utcoffset() == timedelta(0)
    # As close to this machine's clock as a signed request must be (SigV4 allows 15 minutes).
    assert abs(first - datetime.now(timezone.utc)) < timedelta(minutes=15)
    assert store.now() >= first


def test_memory_now_is_the_injected_clock(prefix: str) -> None:
    times = iter(
        [
            datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
            datetime(2001, 1, 1, tzinfo=timezone.utc),
        ]
    )
    store = MemoryStore(MEMORY_BUCKET, prefix, clock=lambda: next(times))
    assert store.now() == datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert store.now() == datetime(2001, 1, 1, tzinfo=timezone.utc)  # whatever it says


def test_memory_cut_fault_is_for_reads_only(prefix: str) -> None:
    store = MemoryStore(MEMORY_BUCKET, prefix)
    for op in ("get", "put", None):
        with pytest.raises(ValueError, match="open"):
            store.faults.add(op, "k", effect="cut")
    store.put("k", b"0123456789")
    store.faults.add("open", "k", effect="cut")
    stream = store.open("k")
    assert stream.read(3) == b"012"
    assert stream.read(100) == b"34"  # up to the break: half of the bytes
    with pytest.raises(ReadBrokeOff):
        stream.read(1)
    with pytest.raises(ReadBrokeOff):
        stream.read()
    assert store.open("k").read() == b"0123456789"  # once


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"op": "explode"}, "no store call is named 'explode'"),
        ({"op": "PUT"}, "no store call is named 'PUT'"),
        ({"op": "put", "effect": "explode"}, "no fault effect is named 'explode'"),
        ({"op": "put", "times": -5}, "times is how many calls to fault: 1 or more, not -5"),
        ({"op": "put", "times": 0}, "1 or more, not 0"),
        ({"op": "put", "times": True}, "1 or more, not True"),
        ({"op": "put", "times": 1.5}, "1 or more, not 1.5"),
        ({"op": "put", "key": 7}, "key is a part of the keys to fault"),
    ],
)
def test_memory_faults_that_would_never_fire_are_refused(
    prefix: str, kw: dict[str, object], says: str
) -> None:
    store = MemoryStore(MEMORY_BUCKET, prefix)
    with pytest.raises(InvalidInput, match=re.escape(says)):
        store.faults.add(**kw)  # type: ignore[arg-type]
    assert store.faults.planned == []
    store.put("k", b"x")  # nothing planned: it lands


def test_through_the_wrapper_a_failed_call_is_not_applied_and_every_call_is_seen(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    """``fail`` stops a call before it reaches the backend; hooks see every call first (and
    one that raises stops it there); ``calls`` counts each by its name: on every backend."""
    faulty = FaultyStore(backend.connect(prefix))
    seen: list[tuple[str, str]] = []
    faulty.faults.hooks.append(lambda op, key: seen.append((op, key)))
    faulty.faults.add("put", "a/", effect="fail")
    faulty.faults.add(None, "b", effect="fail", times=2)  # any call on b, twice
    with pytest.raises(StoreError, match="injected fault") as failed:
        faulty.put("a/k", b"never")
    assert failed.value.args[0] == f"could not put {store.describe('a/k')}: injected fault"
    with pytest.raises(NoSuchObject):
        store.head("a/k")  # not applied
    store.put("b", b"there")
    with pytest.raises(StoreError, match="injected"):
        faulty.delete("b")
    with pytest.raises(StoreError, match="injected"):
        faulty.get("b")
    assert faulty.get("b") == store.get("b")  # the two faults are used up
    etag = faulty.put("a/k", b"now")
    assert store.get("a/k") == Blob(b"now", etag, {})
    assert list(faulty.list_keys("a/")) == ["a/k"]
    upload_id = faulty.create_upload("c")
    assert faulty.abort_upload("c", upload_id) is True

    def refuse(op: str, key: str) -> None:
        if op == "delete":
            raise StoreError(f"refused {key} (a hook of its own)")

    faulty.faults.hooks.append(refuse)
    with pytest.raises(StoreError, match="a hook of its own"):
        faulty.delete("a/k")
    assert store.head("a/k").etag == etag  # the backend never saw it
    assert seen == [
        ("put", "a/k"),
        ("delete", "b"),
        ("get", "b"),
        ("get", "b"),
        ("put", "a/k"),
        ("list", "a/"),
        ("create_upload", "c"),
        ("abort_upload", "c"),
        ("delete", "a/k"),
    ]
    assert faulty.faults.calls == {
        "put": 2,
        "delete": 1,
        "get": 2,
        "list": 1,
        "create_upload": 1,
        "abort_upload": 1,
    }
    assert (faulty.url, faulty.describe("x")) == (store.url, store.describe("x"))


@pytest.mark.parametrize("op", ["get", "head", "open", "list", "list_uploads"])
def test_through_the_wrapper_a_read_whose_answer_is_lost_is_a_store_error(
    backend: Backend, store: ObjectStore, prefix: str, op: str
) -> None:
    """Reads have no outcome to find out: a lost answer is a ``StoreError`` naming the
    object, whether the object is there or not, on every backend."""
    faulty = FaultyStore(backend.connect(prefix))
    store.put("k", b"bytes")
    reads: dict[str, Callable[[str], object]] = {
        "get": faulty.get,
        "head": faulty.head,
        "open": lambda key: faulty.open(key).read(),
        "list": lambda key: list(faulty.list(key)),
        "list_uploads": lambda key: list(faulty.list_uploads(key)),
    }
    for key in ("k", "missing"):
        faulty.faults.add(op, key, effect="lose")
        with pytest.raises(StoreError, match="answer lost") as lost:
            reads[op](key)
        assert type(lost.value) is StoreError and store.describe(key) in str(lost.value)
    assert faulty.faults.calls[op] == 2
