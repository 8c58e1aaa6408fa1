"""The conformance suite's part that is S3's own: part ETags that are the MD5 of the part,
the multipart ETag (the MD5 of the parts' MD5s, and their count), the 5 MiB minimum part, a
part stored as it arrived, the store's clock asked under the prefix, the answers each S3
store gives differently, and what goes on the wire. It runs on the backends with S3's
semantics: ``MemoryStore`` (which holds them) and every S3 server.

    bash scripts/test.sh tests/test_conformance_s3.py
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from objmanifest.core import checksum
from objmanifest.errors import StoreError
from objmanifest.store import CREATE, Blob, Head, ObjectStore, PutMode, S3Store, make_client
from objmanifest.store.errors import NoSuchObject, PreconditionFailed
from objmanifest.store.s3_client import CONTINUE_THRESHOLD
from tests.support.conformance import (
    INJECTIONS,
    PART,
    STALE,
    Backend,
    data,
    fresh_store,
    make_backend,
    md5,
)
from tests.support.stores import BUCKET, Server, backends, running

pytestmark = [pytest.mark.conformance, pytest.mark.behaviour]


def s3_faulted(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` on memory through the wrapper, and on every S3 server through the
    wrapper and the proxy."""
    cases = [("memory", "wrapper"), *((n, how) for n in backends() for how in INJECTIONS)]
    return pytest.mark.parametrize(
        "backend", cases, indirect=True, ids=["-".join(case) for case in cases]
    )(test)


@pytest.fixture(scope="session", params=["memory", *backends()])
def backend(request: pytest.FixtureRequest) -> Backend:
    return make_backend(request)


@pytest.fixture(scope="session", params=backends())
def s3_server(request: pytest.FixtureRequest) -> Server:
    return running(request.param)


@pytest.fixture
def store(backend: Backend, prefix: str) -> Iterator[ObjectStore]:
    yield from fresh_store(backend, prefix)


def test_part_etags_are_md5s_and_the_object_has_the_multipart_etag(
    backend: Backend, store: ObjectStore
) -> None:
    parts = [data(PART, seed=21), data(PART, seed=22), data(1000, seed=23)]
    upload_id = store.create_upload("mp/object")
    etags = [store.upload_part("mp/object", upload_id, n, p) for n, p in enumerate(parts, 1)]
    assert etags == [md5(p) for p in parts]  # bare: no quotes
    assert store.list_parts("mp/object", upload_id) == {
        n: {md5(p): len(p)} for n, p in enumerate(parts, 1)
    }
    store.complete_upload("mp/object", upload_id, etags, mode=CREATE)
    implied = checksum.multipart_etag(etags)
    assert implied is not None and implied.endswith("-3")
    blob = store.get("mp/object")
    assert blob is not None and checksum.bare_etag(blob.etag) == implied
    assert store.head("mp/object") == Head(blob.etag, 2 * PART + 1000, {})


@s3_faulted
def test_a_part_damaged_on_its_way_is_stored_with_the_etag_of_what_arrived(
    backend: Backend, store: ObjectStore, prefix: str
) -> None:
    """A part carries no digest header: the store keeps what arrived, and its ETag (the MD5
    of those bytes) is how the sender sees the damage and sends the part again."""
    part = data(PART, seed=9)
    with backend.faulty(prefix) as faulty:
        upload_id = faulty.store.create_upload("big")
        faulty.damage("upload_part", "big", "flip", 1)
        damaged = faulty.store.upload_part("big", upload_id, 1, part)
        assert faulty.fired() == 1
        assert damaged != md5(part) and checksum.is_md5(damaged)
        etag = faulty.store.upload_part("big", upload_id, 1, io.BytesIO(part).getvalue())
        assert etag == md5(part)
        faulty.store.complete_upload("big", upload_id, [etag])
    assert store.get("big").body == part  # type: ignore[union-attr]


def test_a_small_part_before_the_last_is_refused_at_completion(store: ObjectStore) -> None:
    upload_id = store.create_upload("small")
    first = store.upload_part("small", upload_id, 1, data(1000, seed=41))
    last = store.upload_part("small", upload_id, 2, data(1000, seed=42))
    with pytest.raises(StoreError) as info:
        store.complete_upload("small", upload_id, [first, last])
    assert "5 MiB" in str(info.value)
    with pytest.raises(NoSuchObject):
        store.head("small")


def test_s3_now_is_the_servers_date_asked_under_the_prefix_only(
    s3_server: Server, prefix: str
) -> None:
    store = s3_server.connect(prefix)
    sent: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        sent.append((model.name, dict(params)))

    def server_date() -> datetime:
        response = s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/", MaxKeys=1)
        return parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])

    store.client.meta.events.register("provide-client-params.s3", record)
    try:
        before = server_date()
        now = store.now()
        after = server_date()
        assert sent == [("ListObjectsV2", {"Bucket": BUCKET, "Prefix": f"{prefix}/", "MaxKeys": 1})]
        again = store.now()  # the clock is known now: no second question
        assert len(sent) == 1
    finally:
        store.client.meta.events.unregister("provide-client-params.s3", record)
    # Date has whole seconds and is stamped before the answer leaves the server.
    assert before - timedelta(seconds=1) <= now <= after + timedelta(seconds=2)
    assert now <= again <= after + timedelta(seconds=3)


# -- quirks each S3 store answers differently, one outcome above the seam ---------------------


def test_s3_quirks_become_one_outcome(s3_server: Server, prefix: str) -> None:
    store = s3_server.connect(prefix)
    client = s3_server.client()
    full = f"{prefix}/quirk"

    def status(call: Callable[[], Any]) -> int:
        with pytest.raises(ClientError) as info:
            call()
        return int(info.value.response["ResponseMetadata"]["HTTPStatusCode"])

    # If-Match on a missing key: AWS and moto answer 404, SeaweedFS 412.
    raw = status(lambda: client.put_object(Bucket=BUCKET, Key=full, Body=b"x", IfMatch=STALE))
    assert raw in (404, 412)
    with pytest.raises(PreconditionFailed):
        store.put("quirk", b"x", mode=PutMode.update(STALE))
    # A second create: 412, or 409 when the store saw the two race.
    client.put_object(Bucket=BUCKET, Key=full, Body=b"first")
    raw = status(lambda: client.put_object(Bucket=BUCKET, Key=full, Body=b"x", IfNoneMatch="*"))
    assert raw in (409, 412)
    with pytest.raises(PreconditionFailed):
        store.put("quirk", b"x", mode=CREATE)


# -- what goes on the wire (S3 only) --------------------------------------------------------


def test_a_small_body_is_sent_at_once_and_a_large_one_asks_to_continue_first(
    s3_server: Server, prefix: str
) -> None:
    """botocore sends ``Expect: 100-continue`` with every PutObject and UploadPart, so each
    waits a round trip for the server's ``100 Continue``; the store's client keeps it only
    for a body of ``CONTINUE_THRESHOLD`` or more. A refusal still arrives as itself."""
    store = S3Store(make_client(s3_server.endpoint_url), BUCKET, prefix)
    sent: list[tuple[str, str | None]] = []

    def record(request: Any, **_: Any) -> None:
        expect = request.headers.get("Expect")
        sent.append((request.method, expect.decode() if isinstance(expect, bytes) else expect))

    store.client.meta.events.register("before-send.s3", record)
    small, large = data(1000, seed=41), data(CONTINUE_THRESHOLD, seed=42)
    etag = store.put("small", small)
    with pytest.raises(PreconditionFailed):
        store.put("small", data(2000, seed=43), mode=PutMode.update(STALE))
    store.put("large", large, mode=CREATE)
    upload_id = store.create_upload("parts")
    store.upload_part("parts", upload_id, 1, small)
    store.abort_upload("parts", upload_id)
    puts = [expect for method, expect in sent if method == "PUT"]
    assert puts == [None, None, "100-continue", None]
    assert store.get("small") == Blob(small, etag, {})
    got = store.get("large")
    assert got is not None and got.body == large
