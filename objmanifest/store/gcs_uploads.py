"""Chunked entries on GCS: the seam's multipart uploads as part objects and ``compose``.

GCS has no multipart upload that several machines can feed in parallel and adopt by id
(a resumable upload takes its bytes in order, from one writer at a time), so an upload is
made of ordinary objects in a namespace of the store's own, ``PARTS`` under the store's
prefix (no manifest key can be there: a manifest key starts with a task id, a letter or a
digit, and ``put`` refuses keys there), which ``list`` never shows:

* ``create_upload(key)`` writes a marker, ``PARTS/KEY/~upload~ID`` (an empty object): the
  upload exists while it does. ``ID`` is 32 hex digits; any machine that has it can add
  parts, list them, complete or abort the upload.
* ``upload_part`` writes ``PARTS/KEY/~upload~ID/NNNNN`` (one multipart upload with its
  CRC32C: a part damaged on its way is refused and sent again), then checks the marker:
  gone, the part is removed and the answer is ``UploadGone``. A part's ETag is the MD5 (in
  hex) GCS computed of what it stored; writing a part number again replaces it.
* ``list_parts`` and ``list_uploads`` read these names (one listing each); a marker that is
  missing is ``UploadGone``.
* ``complete_upload`` checks the named parts against the listing (``PartsRejected`` when
  one is missing or has another MD5), composes them, each pinned to the generation listed,
  into the final object with ``ifGenerationMatch=0`` (``CREATE``; the generation for an
  update): exactly one completion of a key lands. Compose takes at most 32 sources, so more
  parts are composed in a tree first (``PARTS/KEY/~upload~ID/tL-NNNNN``; 10,000 parts take
  three levels). The final object carries the upload's id in its metadata (never shown by
  ``get`` or ``head``), so a completion whose answer was lost, or that meets its own
  completion, can tell the object is this upload's. Then the marker and every part go.
* ``abort_upload`` removes the marker, then the parts.

What fake-gcs-server (v1.54) does not enforce here: preconditions on compose (a second
create-only completion replaces the object: ``doctor`` reports chunked entries as unsafe on
it), nor the digests of parts.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from google.cloud import storage

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import InvalidInput, StoreError
from .base import CREATE, OVERWRITE, Head, PartBody, PartsListed, Put, PutMode, read_whole
from .errors import NoSuchObject, OutcomeUnknown, PartsRejected, PreconditionFailed, UploadGone
from .gcs_answers import md5_hex
from .gcs_client import READ_RETRY, TIMEOUT, WRITE_RETRY, GCSClient

T = TypeVar("T")


class ObjectsOf(Protocol):
    """What uploads use of the store they belong to (``GCSStore``): its objects, requests
    and the mapping of their outcomes."""

    bucket: str
    gcs: GCSClient
    runtime: Runtime
    page_size: int | None

    def describe(self, key: str) -> str: ...
    def full_key(self, key: str) -> str: ...
    def blob(self, key: str, generation: int | None = None) -> storage.Blob: ...
    def head(self, key: str) -> Head: ...
    def precondition(self, key: str, mode: PutMode) -> int | None: ...
    def call(
        self,
        action: str,
        key: str,
        send: Callable[[], T],
        *,
        conditional: bool = False,
        write: bool = False,
        resent: bool = False,
    ) -> T: ...
    def write_whole(self, put: Put, action: str = "write") -> storage.Blob: ...
    def list_names(
        self, full_prefix: str, delimiter: str | None, key: str, limit: int | None = None
    ) -> Iterator[tuple[str, bool]]: ...


log = logging.getLogger(__name__)

PARTS = ".objmanifest-parts/"
"""Where a store keeps the parts of its unfinished uploads, under its prefix."""

UPLOAD_META = "objmanifest-upload"
"""The metadata key of a completed object that names the upload it came from."""


def shown(meta: storage.Blob) -> dict[str, str]:
    """An object's user metadata, without the upload id a completed upload carries."""
    return {k: v for k, v in (meta.metadata or {}).items() if k != UPLOAD_META}


MAX_COMPOSE = 32
"""Sources one compose call takes (GCS's limit)."""

MAX_PART = 10_000

_NAME = re.compile(r"(?P<key>.+)/~upload~(?P<id>[0-9a-f]{32})(?:/(?P<rest>[^/]+))?", re.DOTALL)
_PART = re.compile(r"\d{5}")
_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class _Part:
    name: str
    md5: str
    size: int
    generation: int


class Uploads:
    """The uploads of one ``GCSStore``."""

    def __init__(self, store: ObjectsOf) -> None:
        self.store = store

    # -- names ----------------------------------------------------------------------------

    def marker(self, key: str, upload_id: str) -> str:
        """The marker's key (relative to the store's prefix)."""
        return f"{PARTS}{key}/~upload~{upload_id}"

    def _checked(self, key: str, upload_id: str) -> str:
        if not isinstance(upload_id, str) or not _ID.fullmatch(upload_id):
            raise UploadGone(
                f"{self.store.describe(key)}: {upload_id!r} is no upload id of this store"
            )
        return self.marker(key, upload_id)

    def _scan(self, key: str, upload_id: str) -> tuple[bool, dict[int, _Part], list[str]]:
        """(the marker exists, the parts by number, every other object of the upload)."""
        marker = self._checked(key, upload_id)
        full = self.store.full_key(marker)
        base = len(self.store.full_key(""))

        def listing() -> list[storage.Blob]:
            found: list[storage.Blob] = []
            pages = self.store.gcs.client.list_blobs(
                self.store.bucket,
                prefix=full,
                page_size=self.store.page_size,
                timeout=TIMEOUT,
                retry=READ_RETRY,
            ).pages
            for page in pages:
                found += list(page)
            return found

        exists, parts, other = False, {}, []
        for blob in self.store.call("list the parts of", key, listing):
            name = blob.name[base:]
            if name == marker:
                exists = True
                continue
            rest = name[len(marker) + 1 :]
            if not name.startswith(marker + "/") or "/" in rest:
                continue  # an upload of another key that starts with this one's marker
            if _PART.fullmatch(rest) and 1 <= int(rest) <= MAX_PART:
                parts[int(rest)] = _Part(
                    name, md5_hex(blob.md5_hash), int(blob.size or 0), int(blob.generation or 0)
                )
            else:
                other.append(name)
        return exists, parts, other

    # -- the seam -------------------------------------------------------------------------

    def create(self, key: str) -> str:
        upload_id = self.store.runtime.new_id()
        marker = Put(self.marker(key, upload_id), b"", CREATE, None, "application/octet-stream")
        self.store.write_whole(marker, "start an upload of")
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        marker = self._checked(key, upload_id)
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_PART:
            raise InvalidInput(
                f"part number {number!r} of {self.store.describe(key)}: use 1 to {MAX_PART}"
            )
        data = read_whole(body)
        name = f"{marker}/{number:05d}"
        part = Put(name, data, OVERWRITE, None, "application/octet-stream")
        blob = self.store.write_whole(part, f"upload part {number} of")
        if not self._exists(marker):
            self._remove([name])
            raise UploadGone(f"{self.store.describe(key)}: the upload no longer exists")
        return md5_hex(blob.md5_hash) or hashlib.md5(data, usedforsecurity=False).hexdigest()

    def _exists(self, key: str) -> bool:
        try:
            self.store.head(key)
        except NoSuchObject:
            return False
        return True

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        exists, parts, _ = self._scan(key, upload_id)
        if not exists:
            raise UploadGone(f"{self.store.describe(key)}: the upload no longer exists")
        return {n: {part.md5: part.size} for n, part in sorted(parts.items())}

    def complete(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        exists, parts, _ = self._scan(key, upload_id)
        if not exists:
            raise UploadGone(f"{self.store.describe(key)}: the upload no longer exists")
        if not etags:
            raise PartsRejected(f"{self.store.describe(key)}: a completion names no part")
        chosen: list[_Part] = []
        for number, etag in enumerate(etags, start=1):
            part = parts.get(number)
            if part is None or part.md5 != checksum.bare_etag(etag):
                raise PartsRejected(
                    f"{self.store.describe(key)}: part {number} is not stored with ETag {etag}"
                )
            chosen.append(part)
        match = self.store.precondition(key, mode)
        final = self.store.blob(key)
        final.metadata = {UPLOAD_META: upload_id}
        final.content_type = "application/octet-stream"
        action = "complete the upload of"
        try:
            sources = self._tree(
                [self._source(p.name, p.generation) for p in chosen], upload_id, key
            )
            self.store.call(
                action,
                key,
                lambda: final.compose(
                    sources, if_generation_match=match, timeout=TIMEOUT, retry=WRITE_RETRY
                ),
                conditional=match is not None,
                write=True,
            )
        except NoSuchObject as e:
            # A source generation is gone: the upload was completed or aborted meanwhile
            # (both remove its parts), or a part was written again since it was listed.
            if not self._exists(self.marker(key, upload_id)):
                raise UploadGone(f"{self.store.describe(key)}: the upload no longer exists") from e
            raise PartsRejected(
                f"{self.store.describe(key)}: a part was replaced while the upload was completed"
            ) from e
        except PreconditionFailed:
            if not self._completed(key, upload_id):
                raise
        except OutcomeUnknown:
            if self._completed(key, upload_id):
                self._forget(key, upload_id)
            raise
        self._forget(key, upload_id)

    def _source(self, name: str, generation: int) -> storage.Blob:
        return self.store.blob(name, generation=generation)

    def _tree(self, sources: list[storage.Blob], upload_id: str, key: str) -> list[storage.Blob]:
        """Compose ``sources`` in groups of ``MAX_COMPOSE`` until one call can take them."""
        marker = self.marker(key, upload_id)
        level = 0
        while len(sources) > MAX_COMPOSE:
            level += 1
            groups = [sources[i : i + MAX_COMPOSE] for i in range(0, len(sources), MAX_COMPOSE)]
            names = [f"{marker}/t{level}-{i:05d}" for i in range(len(groups))]
            workers = min(8, len(groups))
            pool: Executor = self.store.runtime.pool(workers, "gcs-compose")
            with pool:
                sources = list(pool.map(self._compose_one, names, groups, [key] * len(groups)))
        return sources

    def _compose_one(self, name: str, group: list[storage.Blob], key: str) -> storage.Blob:
        if len(group) == 1:
            return group[0]
        dest = self.store.blob(name)
        dest.content_type = "application/octet-stream"
        self.store.call(
            "compose the parts of",
            key,
            lambda: dest.compose(group, timeout=TIMEOUT, retry=READ_RETRY),
        )
        return self._source(name, int(dest.generation or 0))

    def _completed(self, key: str, upload_id: str) -> bool:
        """Whether ``key`` is this upload's completed object."""
        blob = self.store.blob(key)
        try:
            self.store.call("inspect", key, lambda: blob.reload(timeout=TIMEOUT, retry=READ_RETRY))
        except (NoSuchObject, StoreError):
            return False
        return (blob.metadata or {}).get(UPLOAD_META) == upload_id

    def _forget(self, key: str, upload_id: str) -> bool:
        """Remove the marker, then every part; whether the marker was there."""
        existed = self._remove([self.marker(key, upload_id)])
        _, parts, other = self._scan(key, upload_id)
        self._remove([p.name for p in parts.values()] + other)
        return existed

    def _remove(self, names: list[str]) -> bool:
        """Delete these objects; whether any was there (one that cannot be deleted now is
        logged: a part left behind costs storage, never correctness)."""
        removed = False
        for name in names:
            blob = self.store.blob(name)
            try:
                self.store.call(
                    "remove", name, partial(blob.delete, timeout=TIMEOUT, retry=READ_RETRY)
                )
                removed = True
            except NoSuchObject:
                continue
            except StoreError as e:
                log.warning("could not remove %s: %s", self.store.describe(name), e)
        return removed

    def abort(self, key: str, upload_id: str) -> bool:
        try:
            self._checked(key, upload_id)
        except UploadGone:
            return False
        return self._forget(key, upload_id)

    def list(self, prefix: str) -> Iterator[tuple[str, str]]:
        base = len(self.store.full_key(PARTS))
        full = self.store.full_key(PARTS + prefix)
        found: list[tuple[str, str]] = []
        for name, _ in self.store.list_names(full, None, prefix):
            parsed = _NAME.fullmatch(name[base:])
            if parsed is not None and parsed["rest"] is None:
                found.append((parsed["key"], parsed["id"]))
        return iter(sorted(found))
