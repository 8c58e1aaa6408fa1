"""The seam's optional versions (``Versioned``): a store whose bucket keeps versions lists
them newest first, delete markers too where it has them, and reads any one of them; a store
that keeps none says so (None), never an error. On ``MemoryStore(versioning=True)``, on the
S3 servers with bucket versioning enabled (moto and SeaweedFS implement it) and on
fake-gcs-server with object versioning on (noncurrent generations; GCS has no delete
markers), a versioned bucket of its own; ``file://`` and Azurite keep none (Azurite 3.37
does not implement blob versioning)."""

from __future__ import annotations

from typing import Any

import pytest

import objmanifest as om
from objmanifest.store import versions_of
from objmanifest.store.errors import NoSuchObject
from tests.support.rawstore import gcs_of
from tests.support.stores import Server, versioned_store

pytestmark = pytest.mark.conformance


@pytest.fixture
def vstore(server: Server, prefix: str) -> Any:
    return versioned_store(server, prefix)


@pytest.mark.keeps_versions
def test_versions_are_listed_newest_first_with_delete_markers_and_each_is_read(
    vstore: Any,
) -> None:
    first = vstore.put("k", b"one")
    second = vstore.put("k", b"second", mode=om.store.PutMode.update(first))
    vstore.delete("k")
    third = vstore.put("k", b"third!", mode=om.store.CREATE)  # create-only after a delete
    vstore.put("k2", b"a neighbour")
    vstore.put("k2", b"a neighbour, again")  # a version kept beside it on every store
    vstore.put("k/x", b"under it")
    listed = list(versions_of(vstore, "k") or ())
    markers = gcs_of(vstore) is None  # GCS keeps no record of a delete
    assert [(v.deleted, v.etag, v.size) for v in listed] == [
        (False, third, 6),
        *([(True, "", 0)] if markers else []),
        (False, second, 6),
        (False, first, 3),
    ]
    assert len({v.version_id for v in listed}) == len(listed)
    assert all(v.at is not None for v in listed)
    bodies = [vstore.get_version("k", v.version_id) for v in listed if not v.deleted]
    assert [(b.body, b.etag) for b in bodies] == [
        (b"third!", third),
        (b"second", second),
        (b"one", first),
    ]
    if markers:
        with pytest.raises(NoSuchObject):
            vstore.get_version("k", listed[1].version_id)
    other = next(iter(versions_of(vstore, "k2") or ())).version_id
    with pytest.raises(NoSuchObject):
        vstore.get_version("k", other)  # a version of another key
    assert list(versions_of(vstore, "never") or ()) == []


@pytest.mark.s3_only
@pytest.mark.keeps_versions
def test_versions_come_page_by_page_and_stop_at_the_next_key(vstore: Any) -> None:
    etags = [vstore.put("p", f"v{i}".encode()) for i in range(5)]
    vstore.delete("p")
    for i in range(3):
        vstore.put("p2", f"n{i}".encode())
    vstore.versions_page_size = 2
    requests = []
    original = vstore.client.list_object_versions

    def counted(**kwargs: Any) -> Any:
        requests.append(kwargs)
        return original(**kwargs)

    vstore.client.list_object_versions = counted
    listed = list(vstore.versions("p"))
    assert [v.etag for v in listed if not v.deleted] == etags[::-1]
    assert sum(v.deleted for v in listed) == 1
    assert 3 <= len(requests) <= 4  # 6 rows of p, 2 a page; none read past p2's first
    partial = vstore.versions("p")
    assert next(partial).deleted and len(requests) in (4, 5)  # one page read, no more


def test_a_store_without_versioning_keeps_none(store: Any) -> None:
    """Every backend's test store keeps no versions (memory without ``versioning``,
    ``file://``, Azurite, a bucket without versioning): ``versions`` says None, not an
    error, and a deleted object has none. S3 lists the object of such a bucket as version
    ``null``, GCS as its live generation alone: none kept beside it."""
    store.put("k", b"one")
    store.put("k", b"two")
    assert versions_of(store, "k") is None
    if isinstance(store, om.S3Store):
        assert store.get_version("k", "null").body == b"two"
    store.delete("k")
    assert list(versions_of(store, "k") or ()) == []


def test_versioning_turned_on_keeps_what_is_there_as_version_null() -> None:
    plain = om.MemoryStore("plain-versions", "p")
    plain.put("k", b"one")
    assert versions_of(plain, "k") is None
    with pytest.raises(NoSuchObject):
        plain.get_version("k", "null")
    later = om.MemoryStore("plain-versions", "p", versioning=True)  # turned on: as S3's
    plain.put("k", b"two")
    listed = list(versions_of(plain, "k") or ())
    assert [later.get_version("k", v.version_id).body for v in listed] == [b"two", b"one"]
    assert listed[-1].version_id == "null"  # written before versioning was on


def test_faults_are_planned_on_versions_as_on_any_call() -> None:
    store = om.MemoryStore("faulty-versions", "p", versioning=True)
    store.put("k", b"one")
    store.faults.add("versions")
    with pytest.raises(om.StoreError, match="injected"):
        versions_of(store, "k")
    (version,) = versions_of(store, "k") or ()
    store.faults.add("get_version", effect="lose")
    with pytest.raises(om.StoreError, match="answer lost"):
        store.get_version("k", version.version_id)
    assert store.faults.calls["versions"] == 2 and store.faults.calls["get_version"] == 1


@pytest.mark.s3_only
@pytest.mark.keeps_versions
def test_a_version_listing_without_its_fields_is_no_s3_answer(
    vstore: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint answering a version listing S3 never gives (rows without their version
    ids, ETags or times) is named as not S3, never a crash of ours."""
    vstore.put("k", b"one")
    full = vstore.full_key("k")
    for row in ({"Key": full}, {"Key": full, "VersionId": "v", "ETag": '"e"', "Size": "x"}):
        monkeypatch.setattr(
            vstore.client, "list_object_versions", lambda row=row, **_: {"Versions": [row]}
        )
        with pytest.raises(om.StoreError, match="does not behave like S3"):
            versions_of(vstore, "k")
