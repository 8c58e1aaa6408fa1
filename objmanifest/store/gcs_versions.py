"""Object versioning on GCS: the generations a bucket keeps of an object, and one of them
read exactly (``GCSStore.versions``, ``GCSStore.get_version``; ``repair`` restores from them).

With object versioning on, each write or delete of an object leaves the generation it
replaced behind as a *noncurrent* one (its ``timeDeleted`` says since when), readable by
its generation until a lifecycle rule removes it. A version id is the generation, and so
is its ETag, as every version token on this store. GCS has no delete markers: a deleted
object is one whose generations are all noncurrent, listed as they are (as Azure lists the
versions of a deleted blob), so the newest of them is the last state it had.

**Listing.** One ``objects.list`` with ``versions=true`` and the object's full name as the
prefix (``storage.objects.list``, which agents have too), its rows of exactly that name,
newest generation first. GCS lists names in order, so pages stop at the first longer name.

**Whether versions are kept** is read from that listing: an object listed alone, live, with
no noncurrent generation beside it, has none kept (None), as S3's lone version ``null``.
The bucket's own setting would cost a request and ``storage.buckets.get``, which agents
lack. A versioned bucket whose object has one generation so far looks alike, and loses
nothing: that generation is the object itself, and nothing earlier could restore it.

**Reading** one generation: its metadata, then its bytes (``generation=G``, checked
against their CRC32C as ``get`` does); ``NoSuchObject`` when it is not there (never was,
or removed since). fake-gcs-server (v1.54, ``-backend memory``) keeps noncurrent
generations, lists them and reads them; it cannot delete one generation (its delete
ignores ``generation`` and removes the live object instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol, TypeVar

from google.cloud import storage

from ..errors import StoreError
from .base import Blob, Version
from .errors import NoSuchObject
from .gcs_answers import download, generation
from .gcs_client import READ_RETRY, TIMEOUT, GCSClient
from .gcs_uploads import shown

T = TypeVar("T")

LIST = "list the versions of"
READ = "read a version of"

MAX_GENERATION = 2**63 - 1
"""A generation is a signed 64-bit integer: a larger number names none."""


class VersionsOf(Protocol):
    """What versions use of the store they belong to (``GCSStore``)."""

    bucket: str
    gcs: GCSClient
    page_size: int | None

    def describe(self, key: str) -> str: ...
    def full_key(self, key: str) -> str: ...
    def blob(self, key: str, generation: int | None = None) -> storage.Blob: ...
    def call(self, action: str, key: str, send: Callable[[], T]) -> T: ...
    def listing_failed(self, action: str, key: str, e: NoSuchObject) -> StoreError: ...


class Generations:
    """The generations a bucket keeps of the objects of one store."""

    def __init__(self, store: VersionsOf) -> None:
        self.store = store

    def versions(self, key: str) -> Iterator[Version] | None:
        """The generations kept of ``key``, newest first; None when it is listed alone, live
        (the bucket keeps none beside it)."""
        full = self.store.full_key(key)

        def pages() -> list[Any]:
            listing = self.store.gcs.client.list_blobs(
                self.store.bucket,
                prefix=full,
                # the JSON API's own spelling: the SDK would send ``True``, which
                # fake-gcs-server does not take for true (it lists no noncurrent one then)
                versions="true",
                page_size=self.store.page_size,
                timeout=TIMEOUT,
                retry=READ_RETRY,
            )
            rows: list[Any] = []
            for page in listing.pages:
                items = list(page)
                rows += [item for item in items if item.name == full]
                if any(item.name != full for item in items):
                    break  # names come in order: one past ``full`` ends its generations
            return rows

        try:
            rows = self.store.call(LIST, key, pages)
        except NoSuchObject as e:
            raise self.store.listing_failed(LIST, key, e) from e
        if len(rows) == 1 and rows[0].time_deleted is None:
            return None
        kept = [self._version(key, row) for row in rows]
        return iter(sorted(kept, key=lambda v: int(v.version_id), reverse=True))

    def _version(self, key: str, row: Any) -> Version:
        number = row.generation
        if not isinstance(number, int) or number <= 0:
            raise StoreError(
                f"{self.store.gcs.shown_endpoint} listed a version of {self.store.describe(key)} "
                f"without a generation ({number!r}): is it a GCS JSON API endpoint?"
            )
        at = row.time_created or row.updated
        return Version(
            version_id=str(number),
            etag=str(number),
            size=int(row.size or 0),
            at=at if isinstance(at, datetime) else None,
        )

    def get_version(self, key: str, version_id: str) -> Blob:
        """Generation ``version_id`` of ``key``: its bytes (checked against their CRC32C),
        its generation as ETag and its user metadata; ``NoSuchObject`` when it is not there
        (an id that is no generation names none)."""
        where = f"{self.store.describe(key)} (generation {version_id})"
        number = generation(version_id)
        if number is None or str(number) != version_id or number > MAX_GENERATION:
            raise NoSuchObject(where)
        blob = self.store.blob(key, generation=number)
        try:
            self.store.call(READ, key, lambda: blob.reload(timeout=TIMEOUT, retry=READ_RETRY))
            if blob.generation != number:
                raise StoreError(
                    f"{self.store.gcs.shown_endpoint} answered generation {blob.generation!r} "
                    f"for {where}: is it a GCS JSON API endpoint?"
                )
            exact = self.store.blob(key, generation=number)
            body = self.store.call(READ, key, lambda: download(exact))
        except NoSuchObject:
            raise NoSuchObject(where) from None
        return Blob(body=body, etag=str(number), metadata=shown(blob))
