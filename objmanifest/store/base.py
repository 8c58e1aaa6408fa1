"""The storage seam: exactly what the manifest needs from an object store, and nothing more.

``ObjectStore`` is the protocol every backend implements (``S3Store`` over boto3,
``MemoryBackend`` in one process), and ``FaultyStore`` wraps any of them with planned
faults. Keys are relative to the store's prefix (``PrefixedStore`` turns them into full
keys and addresses, the same way for every backend). Each backend normalises its own
quirks, so the layers above see one behaviour:

* ``get``, ``head`` and ``open`` of a missing object raise ``NoSuchObject`` (a store
  outcome: each caller says what the absence means to it); no other call does (a delete
  of a missing key is fine, a conditional write on one is a lost race);
* a conditional write that lost its race raises ``PreconditionFailed`` (a 409, a 412, or a
  404 on ``If-Match``), a write whose answer was lost raises ``OutcomeUnknown``;
* any other fault raises ``StoreError`` (or ``AccessDenied``) naming the object;
* every object written whole carries its MD5 (``Content-MD5``), so a store that verifies it
  refuses a body damaged or cut short on its way (``BodyDamaged``), and the body is sent
  again (``send_whole``): a damaged body is a transient fault, never the caller's;
* bytes are read through our own ``ByteStream`` (a broken read is ``ReadBrokeOff``);
* ``now()`` is the store's clock, never the caller's.

A backend may also offer the versions it keeps of an object (``Versioned``: S3 bucket
versioning, Azure blob versioning, GCS object versioning, ``MemoryStore(versioning=True)``),
which ``repair`` restores a lost manifest object from. It is optional: a store that keeps
none says so (``versions`` returns None), and a backend without the calls is one that keeps
none (``versions_of``).

Nothing of a backend's client library crosses this line, and no store outcome crosses the
layers above it: a user sees only ``objmanifest.errors``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import BinaryIO, ClassVar, Literal, Protocol, TypeVar, cast, runtime_checkable

from ..core import checksum
from ..core.runtime import DEFAULT, Runtime
from ..errors import StoreError
from .errors import BodyDamaged, NoSuchObject


@dataclass(frozen=True)
class PutMode:
    """How a write treats an object already at the key (after ``object_store``'s PutMode).

    ``OVERWRITE`` replaces anything; ``CREATE`` writes only if nothing is there
    (``If-None-Match: *``); ``update(etag)`` only if the object is still that version
    (``If-Match``; a missing object is a lost race too).
    """

    kind: Literal["overwrite", "create", "update"]
    etag: str | None = None

    @staticmethod
    def update(etag: str) -> PutMode:
        return PutMode("update", etag)

    def __repr__(self) -> str:
        return f"PutMode.update({self.etag!r})" if self.kind == "update" else self.kind.upper()


OVERWRITE = PutMode("overwrite")
CREATE = PutMode("create")


@dataclass(frozen=True)
class Blob:
    """A whole object: its bytes, ETag and user metadata."""

    body: bytes
    etag: str
    metadata: dict[str, str]


@dataclass(frozen=True)
class Head:
    """An object's ETag, size and user metadata, without its bytes.

    ``completed_upload``: the id of the multipart upload whose completion made the object,
    where the store records it with the object (the stores whose ETag does not say which
    parts made it: Azure, GCS, a directory); None on S3, whose multipart ETag says it.
    """

    etag: str
    size: int
    metadata: dict[str, str]
    completed_upload: str | None = None


@dataclass(frozen=True)
class Version:
    """One version a store keeps of an object: the store's own id for it (S3's
    ``VersionId``, Azure's version id, GCS's generation), its ETag (of its bytes, as ``get``
    would have answered it then) and size, when it was written, and whether it is a delete
    marker (the record that the object was deleted: no bytes to read)."""

    version_id: str
    etag: str
    size: int
    at: datetime | None
    deleted: bool = False


@dataclass(frozen=True)
class Listed:
    """One listing row: an object key, or (with a delimiter) a common prefix ending in it."""

    key: str
    is_prefix: bool = False


@runtime_checkable
class ByteStream(Protocol):
    """An object's bytes as they arrive. ``read`` returns b"" at the end; a connection that
    breaks raises ``ReadBrokeOff``."""

    def read(self, size: int = -1) -> bytes: ...
    def close(self) -> None: ...


class PartStream(Protocol):
    """A part streamed from its source: a seekable file object that knows its length (a
    backend may read it more than once, from the start)."""

    length: int

    def read(self, size: int = -1) -> bytes: ...
    def seek(self, offset: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...


PartBody = bytes | PartStream
"""A part to upload: its bytes, or a ``PartStream``."""

PartsListed = dict[int, dict[str, int]]
"""Part number -> {bare ETag: size} of every stored part of an upload. A store that keeps
every upload of a part number lists each; one that keeps the last lists one."""


class ObjectStore(Protocol):
    """One bucket and prefix of an object store, as the manifest uses it."""

    runtime: Runtime

    @property
    def url(self) -> str:
        """``scheme://bucket/prefix``, for messages."""
        ...

    @property
    def connections(self) -> int:
        """How many requests may usefully run at once (more threads than that only wait)."""
        ...

    def describe(self, key: str) -> str:
        """The full address of ``key``, for messages."""
        ...

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        """The object, or None when ``if_none_match`` is still its ETag (no body sent);
        ``NoSuchObject`` if there is none."""
        ...

    def head(self, key: str) -> Head:
        """The object's ETag, size and metadata; ``NoSuchObject`` if there is none."""
        ...

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> ByteStream:
        """The object's bytes, or ``[start, end)`` of them, as a stream; ``NoSuchObject``
        if there is none."""
        ...

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        mode: PutMode = OVERWRITE,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        """Write an object and return its ETag, under ``mode``'s condition."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a key that holds none is fine."""
        ...

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        """Keys under ``prefix`` in order, every page of them; with a ``delimiter``, keys
        that contain it after the prefix are rolled up into one ``is_prefix`` row each."""
        ...

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        """Start a multipart upload to ``key``; its upload id."""
        ...

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        """Store part ``number`` (1..10000); its bare ETag. ``UploadGone`` if the upload was
        completed or aborted."""
        ...

    def list_parts(self, key: str, upload_id: str) -> PartsListed: ...

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        """Complete with exactly these parts (numbered 1..N), under ``mode``'s condition.

        ``PreconditionFailed`` when the condition fails, ``UploadGone``, ``PartsRejected``
        when a named part is not stored with that ETag, ``OutcomeUnknown`` when no answer
        came back. Whether the object at ``key`` afterwards is this completion's is told
        by ``completed_from`` on its ``Head``.
        """
        ...

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort an upload and free its parts; False if it was already gone."""
        ...

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(key, upload id) of every unfinished multipart upload under ``prefix``."""
        ...

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's time (leases are judged on it, never on the caller's clock)."""
        ...


@runtime_checkable
class Versioned(Protocol):
    """A store that can say which versions it keeps of an object, and read one.

    ``versions`` gives them newest first (delete markers too, where the store has them),
    reading further pages only as they are asked for; None when the store keeps none (a
    store without versioning turned on, where it can tell): never an error for that.
    ``get_version`` reads one; ``NoSuchObject`` when it is not there (a delete marker, a
    version that expired since)."""

    def versions(self, key: str) -> Iterator[Version] | None: ...
    def get_version(self, key: str, version_id: str) -> Blob: ...


def versions_of(store: ObjectStore, key: str) -> Iterator[Version] | None:
    """The versions ``store`` keeps of ``key``, newest first; None where it keeps none (a
    backend without the calls keeps none: ``file://``)."""
    if not isinstance(store, Versioned):
        return None
    return store.versions(key)


@runtime_checkable
class Remote(Protocol):
    """A store other than S3 that says what enforces its conditions (an account and a
    container), so a verdict about it holds for every prefix."""

    @property
    def identity(self) -> tuple[str, str]: ...


@runtime_checkable
class Digested(Protocol):
    """A store that can be asked whether it verifies a body's digest: ``put_digested``
    writes a body with the given ``Content-MD5``, whatever its real one."""

    def put_digested(self, key: str, body: bytes, content_md5: str) -> tuple[bool, str]: ...


@runtime_checkable
class Explained(Protocol):
    """A store that says how it enforces each check (check name -> its own mechanism), for
    ``doctor``'s answers."""

    enforces: Mapping[str, str]


T = TypeVar("T")

DIGEST_SENDS = 4
"""How often, in all, a body the store refused as damaged on its way is sent."""


def send_whole(send: Callable[[], T], runtime: Runtime, where: str) -> T:
    """Run ``send``, one request whose body carries its digest, until the store takes the
    body: a ``BodyDamaged`` refusal stored nothing, so the same request (with its same
    condition) is sent again, after a short jittered pause, up to ``DIGEST_SENDS`` times."""
    for attempt in range(DIGEST_SENDS):
        try:
            return send()
        except BodyDamaged as e:
            last = e
            if attempt + 1 < DIGEST_SENDS:
                runtime.sleep(0.05 * 2**attempt * (0.5 + runtime.random()))
    raise StoreError(
        f"the store refused the body sent to {where} {DIGEST_SENDS} times as damaged on its "
        f"way ({last}): something between this machine and the store corrupts data (a "
        "proxy, a network card, memory); fix that, then retry"
    ) from last


def read_whole(body: bytes | BinaryIO | PartBody) -> bytes:
    """All of a body to write: its bytes, a file object's from its start, or a part
    stream's ``length`` bytes (a file object may give fewer bytes than asked at a time)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    length = getattr(body, "length", None)
    body.seek(0)
    if length is None:
        return bytes(body.read())
    chunks: list[bytes] = []
    while length > 0 and (chunk := body.read(length)):
        chunks.append(bytes(chunk))
        length -= len(chunk)
    return b"".join(chunks)


def completed_from(head: Head, upload_id: str, etags: Sequence[str]) -> bool | None:
    """Whether the object ``head`` describes was made by completing ``upload_id`` with
    exactly the parts ``etags`` (numbered 1..N): by the upload id the store recorded with
    the object, else by S3's multipart ETag (the MD5 of the parts' MD5s, and their count).
    None when neither can tell (part ETags that are not MD5s, as under SSE-KMS): the caller
    then judges by what else it knows."""
    if head.completed_upload is not None:
        return head.completed_upload == upload_id
    implied = checksum.multipart_etag(etags)
    if implied is None:
        return None
    return checksum.bare_etag(head.etag) == implied


def get_if_any(store: ObjectStore, key: str) -> Blob | None:
    """The object at ``key``, or None where there is none: for a caller to whom a missing
    object is an ordinary answer (it says what the absence means)."""
    try:
        blob = store.get(key)
    except NoSuchObject:
        return None
    assert blob is not None  # asked without ``if_none_match``: the body always comes
    return blob


def list_keys(store: ObjectStore, prefix: str) -> Iterator[str]:
    """Every object key under ``prefix``."""
    return (row.key for row in store.list(prefix))


@dataclass(frozen=True)
class Put:
    """One ``put``'s arguments, as a store's ``write`` takes them."""

    key: str
    body: bytes | BinaryIO
    mode: PutMode
    metadata: dict[str, str] | None
    content_type: str

    @property
    def conditional(self) -> bool:
        """Whether the write holds a condition (``create`` or ``update``) it may lose."""
        return self.mode.kind != "overwrite"

    def data(self) -> bytes:
        """The body whole (``read_whole``), for a store that sends it in one request."""
        return read_whole(self.body)


class Writes:
    """``ObjectStore.put`` for every store: it gathers the arguments into one ``Put`` and
    hands it to the store's ``write``, so their defaults and order are said once."""

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        mode: PutMode = OVERWRITE,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        """Write an object and return its ETag, under ``mode``'s condition."""
        return self.write(Put(key, body, mode, metadata, content_type))

    def write(self, put: Put) -> str:
        """Write ``put.body`` at ``put.key`` under ``put.mode``; its ETag."""
        raise NotImplementedError(f"{type(self).__name__} does not write")


class Uploads(Protocol):
    """A backend's multipart uploads, kept by a part of its own (Azure's staged blocks,
    GCS's part objects, a directory's part files)."""

    def create(self, key: str) -> str: ...
    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str: ...
    def list_parts(self, key: str, upload_id: str) -> PartsListed: ...
    def complete(self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode) -> None: ...
    def abort(self, key: str, upload_id: str) -> bool: ...
    def list(self, prefix: str) -> Iterator[tuple[str, str]]: ...


class HandsOnUploads:
    """The multipart calls of ``ObjectStore`` for a store that hands them to its
    ``uploads``."""

    uploads: Uploads

    def create_upload(self, key: str) -> str:
        return self.uploads.create(key)

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        return self.uploads.upload_part(key, upload_id, number, body)

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        return self.uploads.list_parts(key, upload_id)

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        self.uploads.complete(key, upload_id, etags, mode)

    def abort_upload(self, key: str, upload_id: str) -> bool:
        return self.uploads.abort(key, upload_id)

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        return self.uploads.list(prefix)


class PrefixedStore(Writes):
    """What every backend shares: a bucket (a container, a directory) and a prefix in it.

    Keys given to a store are relative to its prefix; this is the one place that turns
    them into full keys (``full_key``) and back (``relative``), and into the addresses
    messages name (``url``, ``describe``), so a backend says only its ``scheme`` and
    implements the calls."""

    scheme: ClassVar[str]

    def __init__(self, bucket: str, prefix: str = "", runtime: Runtime | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.runtime = runtime or DEFAULT

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def url(self) -> str:
        """``scheme://bucket/prefix``, for messages."""
        where = f"{self.scheme}://{self.bucket}"
        return f"{where}/{self.prefix}" if self.prefix else where

    def full_key(self, key: str) -> str:
        """``key`` as the bucket knows it: under the prefix."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def relative(self, full_key: str) -> str:
        """A full key under the prefix (from a listing) as the store's callers know it."""
        return full_key[len(self.full_key("")) :]

    def describe(self, key: str) -> str:
        """The full address of ``key``, for messages."""
        return f"{self.scheme}://{self.bucket}/{self.full_key(key)}"

    def range_header(self, key: str, byte_range: tuple[int, int]) -> str | None:
        """The ``Range`` header that asks for ``[start, end)`` of ``key``; None for an empty
        range, which a header cannot say (AWS answers ``bytes=5-4`` with the whole object,
        SeaweedFS with 416): it is checked with a HEAD instead, and refused where it starts
        past the end of an object with bytes. A range that is not one is refused."""
        start, end = byte_range
        if start < 0 or end < start:
            raise StoreError(
                f"could not read {self.describe(key)}: range {start}-{end} is not a range"
            )
        if start == end:
            size = cast(ObjectStore, self).head(key).size
            if start >= size > 0:
                raise StoreError(
                    f"could not read {self.describe(key)}: range {start}-{end} is outside "
                    f"its {size} bytes"
                )
            return None
        return f"bytes={start}-{end - 1}"

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under ``prefix`` (a backend implements ``list``)."""
        return list_keys(cast(ObjectStore, self), prefix)


class StoreClock:
    """The store's time, from the ``Date`` header of every response.

    Between responses it advances by the runtime's monotonic clock, so the wall clock of the
    agent never matters. ``Date`` has whole seconds and is stamped before the answer
    arrives, so each observation is never later than the store's true time, and the best
    estimate is the latest of them. Only the last ``window`` seconds of observations count:
    if the store's clock is stepped back, or this machine's monotonic clock runs fast, the
    estimate follows within a minute instead of staying ahead forever.
    """

    def __init__(self, window: float = 60.0, monotonic: Callable[[], float] | None = None) -> None:
        self._window = window
        self._monotonic = monotonic or Runtime().monotonic
        self._seen: deque[tuple[float, float]] = deque()  # (monotonic, offset), newest last
        self._best: float | None = None
        """The largest offset ``_seen`` holds; None: not known since the last one left."""
        self._date: tuple[str, float] | None = None  # the last Date header, parsed
        self._lock = threading.Lock()

    def observe(self, headers: dict[str, str] | None) -> None:
        date = (headers or {}).get("date")
        if not date:
            return
        last = self._date  # read once: another thread may replace it meanwhile
        if last is not None and last[0] == date:  # answers of one second
            store_time = last[1]
        else:
            try:
                store_time = parsedate_to_datetime(date).timestamp()
            except (TypeError, ValueError):
                return
            self._date = (date, store_time)
        self.observe_time(store_time)

    def observe_time(self, store_time: float) -> None:
        """An observation of the store's time itself (POSIX seconds, never later than the
        store's true time), for a store that can read it finer than a ``Date`` header."""
        mono = self._monotonic()
        offset = store_time - mono
        with self._lock:
            self._seen.append((mono, offset))
            if self._best is not None and offset > self._best:
                self._best = offset
            while len(self._seen) > 1 and self._seen[0][0] < mono - self._window:
                _, gone = self._seen.popleft()
                if self._best is not None and gone >= self._best:
                    self._best = None
            if len(self._seen) > 256:  # many answers per second: keep the best of the old
                best = max(self._seen, key=lambda seen: seen[1])
                self._seen = deque([best, self._seen[-1]])
                self._best = best[1]

    @property
    def known(self) -> bool:
        return bool(self._seen)

    def now(self) -> datetime:
        with self._lock:
            if not self._seen:
                raise StoreError("the store's time is not known yet: no response carried a Date")
            if self._best is None:
                self._best = max(offset for _, offset in self._seen)
            offset = self._best
        return datetime.fromtimestamp(offset + self._monotonic(), tz=timezone.utc)
