"""``GCSStore``'s object versions (``gcs_versions``): on fake-gcs-server with object
versioning on, the noncurrent generations of an object are listed newest first (a deleted
object's too: GCS has no delete markers), each read exactly with its metadata; a bucket
without versioning keeps none (None). Against the GCS double: an id that names no generation
is none without a request, the listing stops at the first longer name, and each error of a
listing or a read is mapped as everywhere in the store (a 403, a read damaged on its way, a
missing bucket). What repair does with them is tests/test_repair_versions.py's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from objmanifest.errors import AccessDenied, StoreError
from objmanifest.local.fakegcs import LocalGCS, start_fakegcs
from objmanifest.store.base import CREATE, PutMode
from objmanifest.store.errors import NoSuchObject
from objmanifest.store.gcs import GCSStore
from objmanifest.store.gcs_client import make_gcs_client
from objmanifest.store.gcs_uploads import UPLOAD_META
from tests.support.gcs_double import GCSDouble

VERSIONED = "objmanifest-gcs-versions"
PLAIN = "objmanifest-gcs-plain"


@pytest.fixture(scope="module")
def fakegcs() -> Iterator[LocalGCS]:
    with start_fakegcs() as local:
        local.create_bucket(VERSIONED, versioning=True)
        local.create_bucket(PLAIN)
        yield local


@pytest.fixture(scope="module")
def double() -> Iterator[GCSDouble]:
    made = GCSDouble()
    made.create_bucket(PLAIN)
    yield made
    made.stop()


@pytest.fixture
def prefix() -> str:
    return f"v-{uuid.uuid4().hex[:12]}"


def store_at(endpoint: str, bucket: str, prefix: str) -> GCSStore:
    return GCSStore(make_gcs_client(endpoint), bucket, prefix)


def test_noncurrent_generations_are_listed_newest_first_and_read_exactly(
    fakegcs: LocalGCS, prefix: str
) -> None:
    store = store_at(fakegcs.endpoint_url, VERSIONED, prefix)
    first = store.put("k", b"one", metadata={"who": "a"})
    second = store.put("k", b"second", mode=PutMode.update(first))
    store.put("k.json", b"a longer name")
    store.put("k/under", b"a longer name too")
    listed = list(store.versions("k") or ())
    assert [(v.version_id, v.etag, v.size, v.deleted) for v in listed] == [
        (second, second, 6, False),
        (first, first, 3, False),
    ]
    assert all(v.at is not None for v in listed)
    old = store.get_version("k", first)
    assert (old.body, old.etag, old.metadata) == (b"one", first, {"who": "a"})

    store.delete("k")  # no delete marker: its generations are all noncurrent now
    assert [v.version_id for v in store.versions("k") or ()] == [second, first]
    assert store.get_version("k", second).body == b"second"
    third = store.put("k", b"third!", mode=CREATE)
    assert [v.version_id for v in store.versions("k") or ()] == [third, second, first]


def test_a_kept_generation_shows_no_upload_id(fakegcs: LocalGCS, prefix: str) -> None:
    """A version made by completing an upload carries its upload id in GCS's metadata, as
    the object does; ``get_version`` hides it, as ``get`` does."""
    store = store_at(fakegcs.endpoint_url, VERSIONED, prefix)
    upload_id = store.create_upload("big")
    etag = store.upload_part("big", upload_id, 1, b"part one")
    store.complete_upload("big", upload_id, [etag])
    store.delete("big")
    (version,) = store.versions("big") or ()
    raw = store.blob("big", generation=int(version.version_id))
    raw.reload()
    assert raw.metadata == {UPLOAD_META: upload_id}
    assert store.get_version("big", version.version_id).metadata == {}


def test_a_bucket_without_versioning_keeps_none(fakegcs: LocalGCS, prefix: str) -> None:
    store = store_at(fakegcs.endpoint_url, PLAIN, prefix)
    first = store.put("k", b"one")
    store.put("k", b"two")
    assert store.versions("k") is None  # the live generation alone: none kept beside it
    with pytest.raises(NoSuchObject, match="generation"):
        store.get_version("k", first)
    store.delete("k")
    assert list(store.versions("k") or ()) == []


@pytest.mark.parametrize(
    "version_id", ["null", "0", "-1", "", " 12", "012", "1e3", "9" * 40, "1\n", "\x00"]
)
def test_an_id_that_names_no_generation_is_none_without_a_request(
    double: GCSDouble, prefix: str, version_id: str
) -> None:
    store = store_at(double.endpoint_url, PLAIN, prefix)
    store.put("k", b"one")
    before = sum(double.requests.values())
    with pytest.raises(NoSuchObject, match="generation"):
        store.get_version("k", version_id)
    assert sum(double.requests.values()) == before


def test_the_listing_stops_at_the_first_longer_name(double: GCSDouble, prefix: str) -> None:
    """Names come in order: the pages after the one holding a longer name than the object's
    are not read (an object beside thousands of longer names costs a page, not all)."""
    store = store_at(double.endpoint_url, PLAIN, prefix)
    for key in ("p", "p.json", "p/a", "p/b", "p/c", "p2"):
        store.put(key, key.encode())
    store.page_size = 1
    listings = double.permissions["storage.objects.list"]
    assert store.versions("p") is None
    assert double.permissions["storage.objects.list"] == listings + 2  # p's page, p.json's


def test_errors_are_mapped_as_everywhere_in_the_store(double: GCSDouble, prefix: str) -> None:
    store = store_at(double.endpoint_url, PLAIN, prefix)
    generation = store.put("k", b"the bytes of one generation")
    listing = f"/storage/v1/b/{PLAIN}/o?"
    double.plan("GET", listing, "status", status=403)
    with pytest.raises(AccessDenied, match="iam-policy"):
        store.versions("k")
    double.plan("GET", listing, "status", status=503, times=2)  # retried, then answered
    assert store.versions("k") is None
    double.plan("GET", "alt=media", "status", status=403)
    with pytest.raises(AccessDenied, match="read a version of"):
        store.get_version("k", generation)
    double.plan("GET", "alt=media", "damage")
    with pytest.raises(StoreError, match="CRC32C"):
        store.get_version("k", generation)
    assert store.get_version("k", generation).body == b"the bytes of one generation"
    gone = store_at(double.endpoint_url, "objmanifest-no-such-bucket", prefix)
    with pytest.raises(StoreError, match=r"does not exist.*buckets create"):
        gone.versions("k")
