"""The storage seam in one process, with S3's semantics: ``MemoryBackend``, and
``MemoryStore``, the same with faults to plan.

``MemoryBackend`` is a real backend, held to the same conformance suite as ``S3Store``:
conditional creates and updates, 304s, ranged reads, listings with a delimiter, multipart
uploads with a create-only completion and S3's multipart ETags, the 5 MiB minimum part.
Every one of one bucket name in one process shares the same objects, so
``om.connect("memory://bucket/prefix")`` gives agents in threads of one process an embedded
manifest (nothing is shared between processes, and nothing survives the process). Its
clock is injectable (``clock=``).

It keeps no versions of an object, unless a store of the bucket is opened with
``versioning=True``: then the bucket keeps every version from that moment on (the objects
already there become versions ``null``), as an S3 bucket does once its versioning is
enabled, and a delete leaves a delete marker; ``versions`` and ``get_version`` read them.

``MemoryStore`` is what users open: ``FaultyStore`` (``faulty.py``) around a
``MemoryBackend``, so ``store.faults`` plans on it what a real network does (a call that
fails, an answer lost, a read cut short, a body damaged on its way in) with the same code
that wraps an ``S3Store`` or any other backend in the tests. The backend itself injects
nothing: a composition, not a second copy of the faults.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TypedDict

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import StoreError
from .base import (
    CREATE,
    Blob,
    ByteStream,
    Head,
    Listed,
    PartBody,
    PartsListed,
    PrefixedStore,
    Put,
    PutMode,
    Version,
    read_whole,
)
from .errors import NoSuchObject, PartsRejected, PreconditionFailed, UploadGone
from .faulty import Faults, FaultyStore

if sys.version_info >= (3, 11):
    from typing import Unpack
else:
    from typing_extensions import Unpack

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_NUMBER = 10_000


@dataclass
class _Object:
    body: bytes
    etag: str
    metadata: dict[str, str]


@dataclass
class _Kept:
    """One version of a key: its object, or None for a delete marker."""

    version_id: str
    obj: _Object | None
    at: datetime


@dataclass
class _Upload:
    key: str
    parts: dict[int, tuple[str, bytes]] = field(default_factory=dict)


@dataclass
class _Bucket:
    lock: threading.Lock = field(default_factory=threading.Lock)
    objects: dict[str, _Object] = field(default_factory=dict)
    uploads: dict[str, _Upload] = field(default_factory=dict)
    _sorted: list[str] | None = None
    """Every key in order, made by the first listing after a key came or went (a listing
    then costs a search, not a pass over every key: a task's many small lists)."""
    versioning: bool = False
    kept: dict[str, list[_Kept]] = field(default_factory=dict)
    """Every version of each key since versioning was turned on, oldest first."""
    _serial: int = 0

    def store(self, key: str, obj: _Object, at: Callable[[], datetime]) -> None:
        """Put ``obj`` at ``key``, a version of its own if the bucket keeps them (the lock
        held)."""
        if key not in self.objects:
            self._sorted = None
        self.objects[key] = obj
        self._keep(key, obj, at)

    def remove(self, key: str, at: Callable[[], datetime]) -> None:
        """Take ``key`` away, if it is there; a bucket that keeps versions records a delete
        marker, as S3 does for any delete (the lock held)."""
        if self.objects.pop(key, None) is not None:
            self._sorted = None
        self._keep(key, None, at)

    def _keep(self, key: str, obj: _Object | None, at: Callable[[], datetime]) -> None:
        """Record a version (its time asked of the store's clock only then)."""
        if self.versioning:
            self._serial += 1
            self.kept.setdefault(key, []).append(_Kept(f"{self._serial:012d}", obj, at()))

    def drop(self, key: str, version_id: str) -> None:
        """Remove one version of ``key`` for good; the object is the newest left (the lock
        held)."""
        kept = self.kept.get(key, [])
        newest = bool(kept) and kept[-1].version_id == version_id
        self.kept[key] = left = [k for k in kept if k.version_id != version_id]
        if newest:
            now = left[-1].obj if left else None
            self.objects.pop(key, None)
            if now is not None:
                self.objects[key] = now
            self._sorted = None

    def keep_versions(self, at: datetime) -> None:
        """Turn versioning on: every object there now is its key's first version (``null``,
        as S3 calls a version written before versioning); the lock held."""
        if not self.versioning:
            self.versioning = True
            for key, obj in self.objects.items():
                self.kept.setdefault(key, []).append(_Kept("null", obj, at))

    def keys_from(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, in order (the lock held)."""
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        keys = self._sorted
        start = bisect.bisect_left(keys, prefix)
        end = start
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1
        return keys[start:end]


_BUCKETS: dict[str, _Bucket] = {}
_BUCKETS_LOCK = threading.Lock()


def _bucket(name: str) -> _Bucket:
    with _BUCKETS_LOCK:
        return _BUCKETS.setdefault(name, _Bucket())


def _quoted_md5(data: bytes) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryBackend(PrefixedStore):
    """One bucket and prefix of the process's in-memory object store, without faults."""

    scheme = "memory"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        clock: Callable[[], datetime] | None = None,
        runtime: Runtime | None = None,
        connections: int = 64,
        versioning: bool = False,
    ) -> None:
        super().__init__(bucket, prefix, runtime)
        self.clock = clock or _utc_now
        self._connections = connections
        self._data = _bucket(bucket)
        if versioning:
            with self._data.lock:
                self._data.keep_versions(self.clock())

    @property
    def versioning(self) -> bool:
        """Whether the bucket keeps every version of its objects."""
        return self._data.versioning

    @property
    def connections(self) -> int:
        return self._connections

    def _found(self, key: str) -> _Object:
        with self._data.lock:
            found = self._data.objects.get(self.full_key(key))
        if found is None:
            raise NoSuchObject(self.describe(key))
        return found

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        found = self._found(key)
        if if_none_match is not None and checksum.bare_etag(if_none_match) == checksum.bare_etag(
            found.etag
        ):
            return None
        return Blob(found.body, found.etag, dict(found.metadata))

    def head(self, key: str) -> Head:
        found = self._found(key)
        return Head(found.etag, len(found.body), dict(found.metadata))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> ByteStream:
        found = self._found(key)
        data = found.body
        if byte_range is not None:
            start, end = byte_range
            if start >= len(found.body) > 0 or start < 0 or end < start:
                raise StoreError(
                    f"could not read {self.describe(key)}: range {start}-{end} is outside its "
                    f"{len(found.body)} bytes"
                )
            data = found.body[start:end]
        return io.BytesIO(data)

    def write(self, put: Put) -> str:
        data = put.data()
        full = self.full_key(put.key)
        with self._data.lock:
            self._check(full, put.key, put.mode)
            etag = _quoted_md5(data)
            self._data.store(full, _Object(data, etag, dict(put.metadata or {})), self.clock)
        return etag

    def _check(self, full: str, key: str, mode: PutMode) -> None:
        """Refuse a write whose condition fails (the bucket lock is held)."""
        existing = self._data.objects.get(full)
        if mode.kind == "create" and existing is not None:
            raise PreconditionFailed(f"{self.describe(key)}: exists")
        if mode.kind == "update" and (
            existing is None
            or checksum.bare_etag(existing.etag) != checksum.bare_etag(mode.etag or "")
        ):
            raise PreconditionFailed(f"{self.describe(key)}: not the version named")

    def delete(self, key: str) -> None:
        with self._data.lock:
            self._data.remove(self.full_key(key), self.clock)

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        full = self.full_key(prefix)
        with self._data.lock:
            keys = self._data.keys_from(full)
        rolled: set[str] = set()
        for key in keys:
            if delimiter:
                cut = key.find(delimiter, len(full))
                if cut >= 0:
                    rolled_up = key[: cut + len(delimiter)]
                    if rolled_up not in rolled:
                        rolled.add(rolled_up)
                        yield Listed(self.relative(rolled_up), True)
                    continue
            yield Listed(self.relative(key))

    # -- versions -------------------------------------------------------------------------

    def versions(self, key: str) -> Iterator[Version] | None:
        """Every version kept of ``key``, newest first, delete markers too; None unless the
        bucket keeps versions."""
        with self._data.lock:
            if not self._data.versioning:
                return None
            kept = list(self._data.kept.get(self.full_key(key), ()))
        return iter(
            [
                Version(k.version_id, k.obj.etag, len(k.obj.body), k.at)
                if k.obj is not None
                else Version(k.version_id, "", 0, k.at, deleted=True)
                for k in reversed(kept)
            ]
        )

    def get_version(self, key: str, version_id: str) -> Blob:
        with self._data.lock:
            kept = self._data.kept.get(self.full_key(key), ())
            found = next((k.obj for k in kept if k.version_id == version_id), None)
        if found is None:
            raise NoSuchObject(f"{self.describe(key)} (version {version_id})")
        return Blob(found.body, found.etag, dict(found.metadata))

    def delete_version(self, key: str, version_id: str) -> None:
        """Remove one kept version for good (S3's DeleteObject with a ``VersionId``: what a
        lifecycle rule's expiry of old versions does); the object is then the newest left."""
        with self._data.lock:
            self._data.drop(self.full_key(key), version_id)

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        upload_id = self.runtime.new_id()
        with self._data.lock:
            self._data.uploads[upload_id] = _Upload(self.full_key(key))
        return upload_id

    def _upload(self, key: str, upload_id: str) -> _Upload:
        found = self._data.uploads.get(upload_id)
        if found is None or found.key != self.full_key(key):
            raise UploadGone(f"{self.describe(key)}: the upload no longer exists")
        return found

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        if not 1 <= number <= MAX_PART_NUMBER:
            raise StoreError(
                f"could not upload part {number} of {self.describe(key)}: part numbers are "
                f"1 to {MAX_PART_NUMBER}"
            )
        data = read_whole(body)
        etag = checksum.bare_etag(_quoted_md5(data))
        with self._data.lock:
            self._upload(key, upload_id).parts[number] = (etag, data)
        return etag

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        with self._data.lock:
            parts = dict(self._upload(key, upload_id).parts)
        return {n: {etag: len(data)} for n, (etag, data) in sorted(parts.items())}

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        full = self.full_key(key)
        with self._data.lock:
            upload = self._upload(key, upload_id)
            chosen: list[bytes] = []
            for number, etag in enumerate(etags, start=1):
                stored = upload.parts.get(number)
                if stored is None or stored[0] != checksum.bare_etag(etag):
                    raise PartsRejected(f"{self.describe(key)}: InvalidPart {number}")
                chosen.append(stored[1])
            if not chosen:
                raise StoreError(f"could not complete {self.describe(key)}: no parts named")
            if any(len(part) < MIN_PART_SIZE for part in chosen[:-1]):
                raise StoreError(
                    f"the store refused to complete the multipart upload of {self.describe(key)}: "
                    "a part is smaller than 5 MiB (only the last may be); use part_size >= 5 MiB"
                )
            self._check(full, key, mode)
            implied = checksum.multipart_etag(checksum.bare_etag(e) for e in etags)
            body = b"".join(chosen)
            self._data.store(full, _Object(body, f'"{implied}"', {}), self.clock)
            del self._data.uploads[upload_id]

    def abort_upload(self, key: str, upload_id: str) -> bool:
        with self._data.lock:
            found = self._data.uploads.get(upload_id)
            gone = found is None or found.key != self.full_key(key)
            if not gone:
                del self._data.uploads[upload_id]
        return not gone

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        full = self.full_key(prefix)
        with self._data.lock:
            found = sorted(
                (u.key, upload_id)
                for upload_id, u in self._data.uploads.items()
                if u.key.startswith(full)
            )
        for key, upload_id in found:
            yield self.relative(key), upload_id

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()


class MemoryOptions(TypedDict, total=False):
    """The settings of a ``MemoryBackend`` beside its bucket and prefix, which a
    ``MemoryStore`` passes on to its backend (the defaults are the backend's)."""

    clock: Callable[[], datetime] | None
    """Its time (default: this machine's clock, in UTC)."""
    runtime: Runtime | None
    connections: int
    """How many requests may usefully run at once (default 64)."""
    versioning: bool
    """Whether its bucket keeps every version of its objects from now on (default False)."""


class MemoryStore(FaultyStore):
    """An in-process store with S3's semantics (``memory://NAME/PREFIX``): every one of one
    bucket name in one process shares the same objects. ``faults`` plans what a network does
    to its calls: a ``MemoryBackend`` inside a ``FaultyStore``, to which it passes
    ``options`` (``MemoryOptions``): ``clock=`` sets its time, ``versioning=True`` has its
    bucket keep every version of its objects, ``runtime=`` and ``connections=`` are any
    store's."""

    scheme = "memory"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        faults: Faults | None = None,
        **options: Unpack[MemoryOptions],
    ) -> None:
        self.backend = MemoryBackend(bucket, prefix, **options)
        super().__init__(self.backend, faults)

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"

    @property
    def bucket(self) -> str:
        return self.backend.bucket

    @property
    def prefix(self) -> str:
        return self.backend.prefix
