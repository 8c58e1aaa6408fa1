"""Moving an entry's bytes: sources, transfer settings, single objects, multipart calls.

A small holder's data goes to ``TASK/data/STAGE/FILE_ID@EPOCH`` with ``If-None-Match: *``. A
fenced holder therefore writes beside the winner, never over it, and since the manifest only
ever points at the key of the epoch that made the entry ready, its bytes never become
visible. Reads hash while they stream and hand nothing over that does not match.

Data above ``TransferConfig.threshold`` goes as a chunked entry (``chunks.py``): this module
gives it its sources (read part by part, never whole), its part size, and the multipart
calls with their errors mapped.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import botocore.exceptions
import xxhash

from . import checksum
from .errors import AlreadyExists, ChecksumMismatch, NotFound, ObjManifestError, StoreError
from .store import OutcomeUnknown, PreconditionFailed, Store

if TYPE_CHECKING:
    from .store import Head

Source = bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
Progress = Callable[[int, "int | None"], None]
"""Called as ``progress(bytes_done, total)``; ``total`` is None for a stream of unknown size."""

READ_CHUNK = 1024 * 1024
META_DIGEST = "xxh3-128"

MiB = 1024 * 1024
GiB = 1024 * MiB
MIN_PART_SIZE = 5 * MiB
"""S3's smallest part (every part but the last); both test servers enforce it too."""
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * 1024 * GiB


def check_part_size(part_size: int, name: str = "part_size") -> int:
    if not isinstance(part_size, int) or not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        raise ValueError(
            f"{name} must be a whole number of bytes from 5 MiB to 5 GiB (S3's limits), "
            f"not {part_size!r}"
        )
    return part_size


@dataclass(frozen=True)
class TransferConfig:
    """How data moves. Change the defaults with ``set_defaults``, or per call of ``put`` and
    ``consume`` with their ``part_size=``, ``concurrency=`` and ``threshold=`` arguments.

    * ``threshold``: data larger than this goes as a chunked (multipart) entry; smaller data
      is one object, read into memory.
    * ``part_size``: the part size of a chunked upload of known size; grown (to whole MiB) so
      a file never needs more than 10,000 parts. An explicit per-call part size is not grown:
      too small a one is refused with the size that would do.
    * ``stream_part_size``: the part size for a stream of unknown size (stdin, a pipe). With
      10,000 parts at most, 64 MiB parts allow streams up to 625 GiB; pass a larger
      ``part_size`` for longer streams (525 MiB reaches S3's 5 TiB object limit).
    * ``concurrency``: parts in flight at once, uploading or downloading. Memory stays
      within ``concurrency x part_size`` whatever the file size (a file's parts are streamed
      from it in 1 MiB blocks, so far less; a stream's parts, and parts checked for adoption,
      are held whole). It is capped at the boto3 client's connection pool size.
    """

    threshold: int = 64 * MiB
    part_size: int = 16 * MiB
    stream_part_size: int = 64 * MiB
    concurrency: int = 8

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, not {self.threshold}")
        for name in ("part_size", "stream_part_size"):
            check_part_size(getattr(self, name), name)
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be a whole number >= 1, not {self.concurrency!r}")

    def with_overrides(
        self,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
    ) -> TransferConfig:
        """These settings with the per-call values that were given."""
        changes: dict[str, Any] = {}
        if part_size is not None:
            changes.update(part_size=part_size, stream_part_size=part_size)
        if concurrency is not None:
            changes["concurrency"] = concurrency
        if threshold is not None:
            changes["threshold"] = threshold
        return replace(self, **changes) if changes else self


_defaults = TransferConfig()


def defaults() -> TransferConfig:
    """The settings ``put`` and ``consume`` use when a call does not say otherwise."""
    return _defaults


def set_defaults(config: TransferConfig | None = None, **fields: Any) -> TransferConfig:
    """Change the process-wide defaults (a whole ``TransferConfig``, or some of its fields);
    returns the previous ones so a caller can restore them."""
    global _defaults
    previous = _defaults
    _defaults = replace(config or _defaults, **fields)
    return previous


def part_size_for(size: int | None, config: TransferConfig, explicit: bool = False) -> int:
    """The part size for ``size`` bytes (None: a stream of unknown size).

    A default part size grows to whole MiB so the file fits in 10,000 parts; an explicit one
    that is too small is refused, saying what would do.
    """
    if size is None:
        return config.stream_part_size
    if size > MAX_OBJECT_SIZE:
        raise ValueError(f"{size} bytes is more than S3's largest object (5 TiB)")
    needed = math.ceil(size / MAX_PARTS / MiB) * MiB
    if config.part_size >= needed:
        return config.part_size
    if explicit:
        raise ValueError(
            f"part_size={config.part_size} would need {math.ceil(size / config.part_size)} "
            f"parts for {size} bytes, and S3 allows {MAX_PARTS}: use part_size >= {needed} "
            "or leave it unset"
        )
    return max(needed, MIN_PART_SIZE)


def pool_size(store: Store) -> int:
    """How many connections the store's client keeps: more threads than that only wait."""
    return int(getattr(store.client.meta.config, "max_pool_connections", None) or 10)


def part_count(size: int, part_size: int) -> int:
    return max(1, math.ceil(size / part_size))


# -- sources ----------------------------------------------------------------------------


class SourceChanged(ObjManifestError):
    """The source's bytes changed while they were uploaded (the file grew or shrank)."""


class PartSource:
    """A source read part by part: memory holds the parts in flight, never the whole file.

    ``size`` is None for a stream, which is read in order from one thread; other sources
    are read at any offset from any thread.
    """

    size: int | None = None
    seekable: bool = True
    name: str = "data"

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at the end of a stream)."""
        raise NotImplementedError

    def open_part(self, offset: int, length: int) -> PartReader | None:
        """The part as a file object that hashes what is sent (None: read it into memory)."""
        return None

    def check_unchanged(self) -> None:
        """Raise ``SourceChanged`` if the source was modified since it was opened (its size,
        modification time or inode changed)."""

    def close(self) -> None:
        """Release what the source opened itself (never a file object the caller passed)."""


class _FdSource(PartSource):
    """A regular file, read with ``os.pread`` so parts are read in parallel."""

    def __init__(self, fd: int, base: int, name: str, owned: bool) -> None:
        self.fd, self.base, self.name, self.owned = fd, base, name, owned
        self.stamp = self._stamp()
        self.size = self.stamp[0] - base

    def _stamp(self) -> tuple[int, int, int]:
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns, st.st_ino

    def read_at(self, offset: int, length: int) -> bytes:
        chunks: list[bytes] = []
        done = 0
        while done < length:
            got = os.pread(self.fd, length - done, self.base + offset + done)
            if not got:
                break
            chunks.append(got)
            done += len(got)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def open_part(self, offset: int, length: int) -> PartReader:
        return PartReader(self.fd, self.base + offset, length, self.name)

    def check_unchanged(self) -> None:
        now = self._stamp()
        if now != self.stamp:
            what = (
                f"changed size ({self.stamp[0]} -> {now[0]} bytes)"
                if now[0] != self.stamp[0]
                else "was modified"
            )
            raise SourceChanged(
                f"{self.name} {what} while it was uploaded; upload a file that is no longer "
                "being written"
            )

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


class PartReader(io.RawIOBase):
    """One part of a file as the body of an ``UploadPart``, streamed from the file, never
    held in memory whole.

    botocore reads a body in passes from the start (one to sign it, one to send it, again
    for a retry). The first whole pass is hashed with xxh3; the source's ``check_unchanged``
    (size, mtime, inode) after the part is sent shows every pass read the same bytes. The
    file is read in blocks of ``BLOCK`` bytes, whatever size the caller asks for (http.client
    asks for 16 KiB at a time).
    """

    BLOCK = 1024 * 1024

    def __init__(self, fd: int, offset: int, length: int, name: str) -> None:
        super().__init__()
        self.fd, self.offset, self.length, self.name = fd, offset, length, name
        self.position = 0
        self.block, self.block_start = b"", 0
        self.hasher: Any = xxhash.xxh3_128()
        self.hashed = 0
        self.first_pass: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        target = base + offset
        if target != self.position:
            self.block, self.block_start = b"", 0
            if self.first_pass is None:  # an unfinished pass: start the digest again at 0
                self.hasher, self.hashed = xxhash.xxh3_128(), 0
        self.position = target
        return target

    def read(self, size: int | None = -1) -> bytes:
        left = self.length - self.position
        want = left if size is None or size < 0 else min(size, left)
        if want <= 0:
            return b""
        if not self.block_start <= self.position < self.block_start + len(self.block):
            self._fill()
        start = self.position - self.block_start
        if start == 0 and want >= len(self.block):
            data = self.block
        else:
            data = self.block[start : start + want]
        self.position += len(data)
        return data

    def _fill(self) -> None:
        """Read the block at the current position; hash it if it continues the first pass."""
        size = min(self.BLOCK, self.length - self.position)
        data = os.pread(self.fd, size, self.offset + self.position)
        if len(data) != size:
            raise SourceChanged(
                f"{self.name} ended early while a part was sent (at byte "
                f"{self.offset + self.position + len(data)}); upload a file that is not being "
                "written"
            )
        self.block, self.block_start = data, self.position
        if self.first_pass is None and self.hashed == self.position:
            self.hasher.update(data)
            self.hashed += size
            if self.hashed == self.length:
                self.first_pass = self.hasher.hexdigest()

    def digest(self) -> str:
        """The xxh3 of the part (its first whole pass)."""
        if self.first_pass is None:
            raise SourceChanged(f"{self.name}: a part was sent without being read whole")
        return self.first_pass


class _BufferSource(PartSource):
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(data).cast("B")
        self.size = len(self.view)
        self.name = "the bytes given"

    def read_at(self, offset: int, length: int) -> bytes:
        return bytes(self.view[offset : offset + length])


class _SeekSource(PartSource):
    """A seekable file object without a file descriptor: one read at a time."""

    def __init__(self, file: BinaryIO, base: int, size: int) -> None:
        self.file, self.base, self.size = file, base, size
        self.name = repr(file)
        self._lock = threading.Lock()

    def read_at(self, offset: int, length: int) -> bytes:
        with self._lock:
            self.file.seek(self.base + offset)
            return read_fully(self.file, length)


class _StreamSource(PartSource):
    """A stream of unknown size: read in order, after the bytes already read to decide."""

    seekable = False

    def __init__(self, file: BinaryIO, head: bytes) -> None:
        self.file, self.head = file, head
        self.position = 0
        self.name = getattr(file, "name", None) or repr(file)

    def read_at(self, offset: int, length: int) -> bytes:
        if offset != self.position:
            raise ValueError(f"a stream is read in order: asked for {offset}, at {self.position}")
        taken = self.head[:length]
        self.head = self.head[len(taken) :]
        rest = read_fully(self.file, length - len(taken)) if len(taken) < length else b""
        data = taken + rest if rest else taken
        self.position += len(data)
        return data


def read_fully(file: BinaryIO, length: int) -> bytes:
    """Up to ``length`` bytes, fewer only at the end of the file."""
    chunks: list[bytes] = []
    done = 0
    while done < length:
        got = file.read(length - done)
        if not got:
            break
        chunks.append(got)
        done += len(got)
    return b"".join(chunks)


@dataclass
class Prepared:
    """A source made ready: either the whole bytes (one object) or a ``PartSource``."""

    single: bytes | None = None
    parts: PartSource | None = None


@contextlib.contextmanager
def open_source(data: Source, threshold: int) -> Iterator[Prepared]:
    """Look at a source once and decide: one object (at most ``threshold`` bytes, read into
    memory) or parts (read part by part later).

    A stream of unknown size is chunked only if it is a buffered binary stream (such as
    ``sys.stdin.buffer``), where a short read means its end; any other non-seekable object
    is read whole with one ``read()``, as before.
    """
    if isinstance(data, io.TextIOBase):
        raise TypeError("put() needs bytes, a path, or a file opened in binary mode ('rb')")
    with contextlib.ExitStack() as opened:
        source = _source_of(data, threshold, opened)
        if not isinstance(source, bytes):
            opened.callback(source.close)
        if isinstance(source, bytes):
            yield Prepared(single=source)
        elif source.size is not None and source.size <= threshold:
            yield Prepared(single=source.read_at(0, source.size))
        else:
            yield Prepared(parts=source)


def _source_of(data: Source, threshold: int, opened: contextlib.ExitStack) -> bytes | PartSource:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data) if len(data) <= threshold else _BufferSource(data)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        file = opened.enter_context(path.open("rb"))
        if stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return _FdSource(file.fileno(), 0, str(path), owned=False)
        data = file  # a named pipe or a device: a stream, read in order
    return _file_source(data, threshold)


def _file_source(file: BinaryIO, threshold: int) -> bytes | PartSource:
    seekable = bool(getattr(file, "seekable", lambda: False)())
    if seekable:
        base = file.tell()
        fd = _regular_fd(file)
        if fd is not None:
            return _FdSource(fd, base, str(getattr(file, "name", "")) or repr(file), owned=False)
        size = file.seek(0, io.SEEK_END) - base
        file.seek(base)
        return _SeekSource(file, base, size)
    if isinstance(file, io.BufferedIOBase):
        head = read_fully(file, threshold + 1)
        return head if len(head) <= threshold else _StreamSource(file, head)
    whole = file.read()
    return whole if len(whole) <= threshold else _BufferSource(whole)


def _regular_fd(file: BinaryIO) -> int | None:
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None


def read_source(data: Source) -> bytes:
    """The whole bytes of any source (for small data)."""
    with open_source(data, MAX_OBJECT_SIZE) as prepared:
        assert prepared.single is not None
        return prepared.single


# -- single objects ----------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Where a holder's bytes landed and what they were (chunked: its part size and the
    object that lists its parts)."""

    key: str
    checksum: str
    size: int
    part_size: int | None = None
    parts_key: str | None = None


def data_key(task_id: str, stage: str, file_id: str, epoch: int) -> str:
    """Where a holder writes: one key per epoch, so holders never share one."""
    return f"{task_id}/data/{stage}/{file_id}@{epoch}"


def upload(store: Store, key: str, body: bytes) -> Stored:
    """Write ``body`` once at ``key``. Repeating the same bytes is a no-op; other bytes for
    the same epoch go beside them under a key with their digest, never over them."""
    digest = checksum.of_bytes(body)
    hexdigest = digest.removeprefix(checksum.PREFIX)
    for candidate in (key, f"{key}~{hexdigest[:16]}"):
        if _write_once(store, candidate, body, hexdigest):
            return Stored(candidate, digest, len(body))
    raise AlreadyExists(
        f"{store.describe(key)} and its alternative already hold other bytes; "
        "fail() this claim and claim the entry again"
    )


def _write_once(store: Store, key: str, body: bytes, hexdigest: str) -> bool:
    """True once ``key`` holds exactly ``body``; False if it holds something else."""
    meta = {META_DIGEST: hexdigest, "size": str(len(body))}
    for _ in range(3):
        try:
            store.put(key, body, if_none_match=True, metadata=meta)
            return True
        except (PreconditionFailed, OutcomeUnknown):
            pass
        with contextlib.suppress(Exception):
            head = store.head(key)
            return head.metadata.get(META_DIGEST) == hexdigest and head.size == len(body)
    return False


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def _check(
    store: Store, file_id: str, key: str, digest: checksum.Digest, expected: str, size: int
) -> None:
    if digest.checksum() != expected or digest.size != size:
        raise ChecksumMismatch(
            f"{file_id!r}: {store.describe(key)} holds {digest.size} bytes with "
            f"{digest.checksum()}, but the manifest recorded {size} bytes with {expected}"
        )


def download(store: Store, file_id: str, key: str, expected: str, size: int) -> bytes:
    """The verified bytes of one data object."""
    digest = checksum.Digest()
    buf = bytearray()
    with contextlib.closing(store.open(key)) as stream:
        for chunk in _chunks(stream):
            digest.update(chunk)
            buf += chunk
    _check(store, file_id, key, digest, expected, size)
    return bytes(buf)


def download_to(
    store: Store, file_id: str, key: str, expected: str, size: int, dest: str | os.PathLike[str]
) -> Path:
    """Stream to a temporary file beside ``dest`` and move it into place only once verified:
    on a mismatch nothing is left at ``dest``."""
    with temp_beside(dest) as (fd, target):
        digest = checksum.Digest()
        with contextlib.closing(store.open(key)) as stream:
            for chunk in _chunks(stream):
                digest.update(chunk)
                write_all(fd, chunk, digest.size - len(chunk))
        _check(store, file_id, key, digest, expected, size)
    return target


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``os.pwrite`` until all of ``data`` is written."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


@contextlib.contextmanager
def temp_beside(dest: str | os.PathLike[str], size: int = 0) -> Iterator[tuple[int, Path]]:
    """A temporary file beside ``dest``, moved into place (fsynced) when the block ends
    without an error and removed otherwise: nothing half-written is ever left at ``dest``."""
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _mkstemp(target)
    try:
        if size:
            os.ftruncate(fd, size)
        yield fd, target
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _mkstemp(target: Path) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)


# -- multipart calls ----------------------------------------------------------------------


class UploadGone(Exception):
    """The multipart upload no longer exists: it was completed or aborted."""


class PartsRejected(Exception):
    """Completion named a part the store does not hold with that ETag (``InvalidPart``)."""


_CONNECTION_ERRORS = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
)


def _observe(store: Store, response: Any) -> None:
    store.clock.observe(response.get("ResponseMetadata", {}).get("HTTPHeaders"))


def _code(e: botocore.exceptions.ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "")), status


def _store_error(store: Store, e: Exception, action: str, key: str) -> ObjManifestError:
    """A clear error naming the object; the multipart specifics first, then the store's."""
    if isinstance(e, botocore.exceptions.ClientError):
        code, _ = _code(e)
        if code == "EntityTooSmall":
            return StoreError(
                f"the store refused to {action} {store.describe(key)}: a part is smaller than "
                "5 MiB (only the last may be); use part_size >= 5 MiB"
            )
    return store._fail(e, action, key)


def _multipart_call(
    store: Store, action: str, key: str, call: Callable[[], Any], conditional: bool = False
) -> Any:
    """Run one multipart call: ``UploadGone`` for a vanished upload, clear errors otherwise
    (and ``PreconditionFailed`` for a ``conditional`` call whose condition failed)."""
    try:
        response = call()
    except botocore.exceptions.ClientError as e:
        _observe(store, e.response)
        code, status = _code(e)
        if code == "NoSuchUpload":
            raise UploadGone(f"{store.describe(key)}: the upload no longer exists") from e
        if code in ("InvalidPart", "InvalidPartOrder"):
            raise PartsRejected(f"{store.describe(key)}: {code}") from e
        failed = status in (409, 412) or code in (
            "PreconditionFailed",
            "ConditionalRequestConflict",
        )
        if conditional and failed:
            raise PreconditionFailed(f"{store.describe(key)}: {code or status}") from e
        raise _store_error(store, e, action, key) from e
    except botocore.exceptions.BotoCoreError as e:
        raise _store_error(store, e, action, key) from e
    _observe(store, response)
    return response


def create_upload(store: Store, key: str) -> str:
    client, bucket, full = store.client, store.bucket, store.full_key(key)
    response = _multipart_call(
        store,
        "start a multipart upload of",
        key,
        lambda: client.create_multipart_upload(Bucket=bucket, Key=full),
    )
    return str(response["UploadId"])


def upload_part(
    store: Store, key: str, upload_id: str, number: int, body: bytes | PartReader
) -> str:
    """Send one part; its bare ETag (the part's MD5 on S3 and the stores tested here).

    Bytes go as a file object too: given ``bytes``, botocore copies them into one buffer
    with the headers; ``BytesIO`` shares them and is rewound for a retry.
    """
    client, bucket, full = store.client, store.bucket, store.full_key(key)
    stream = io.BytesIO(body) if isinstance(body, bytes) else cast(BinaryIO, body)
    length = len(body) if isinstance(body, bytes) else body.length
    response = _multipart_call(
        store,
        f"upload part {number} of",
        key,
        lambda: client.upload_part(
            Bucket=bucket,
            Key=full,
            UploadId=upload_id,
            PartNumber=number,
            Body=stream,
            ContentLength=length,
        ),
    )
    return checksum.bare_etag(response["ETag"])


def list_parts(store: Store, key: str, upload_id: str) -> dict[int, dict[str, int]]:
    """Part number -> {bare ETag: size} of every stored part. SeaweedFS keeps every upload of
    a part number (and picks by ETag at completion), AWS keeps the last: both fit here."""
    client, bucket, full = store.client, store.bucket, store.full_key(key)
    listed: dict[int, dict[str, int]] = {}
    marker = 0
    while True:
        response = _multipart_call(
            store,
            "list the parts of",
            key,
            lambda m=marker: client.list_parts(  # type: ignore[misc]
                Bucket=bucket, Key=full, UploadId=upload_id, PartNumberMarker=m
            ),
        )
        for part in response.get("Parts", []):
            etag = checksum.bare_etag(part["ETag"])
            listed.setdefault(int(part["PartNumber"]), {})[etag] = int(part["Size"])
        if not response.get("IsTruncated"):
            return listed
        marker = int(response["NextPartNumberMarker"])


def complete_upload(store: Store, key: str, upload_id: str, etags: list[str]) -> None:
    """Complete with exactly these parts, and only if ``key`` holds nothing yet.

    ``PreconditionFailed``: the key holds an object; ``UploadGone``; ``PartsRejected``;
    ``OutcomeUnknown`` when no answer came. The caller checks the object's ETag either way.
    """
    client, bucket, full = store.client, store.bucket, store.full_key(key)
    parts = [{"PartNumber": n, "ETag": f'"{etag}"'} for n, etag in enumerate(etags, start=1)]
    try:
        _multipart_call(
            store,
            "complete the multipart upload of",
            key,
            lambda: client.complete_multipart_upload(
                Bucket=bucket,
                Key=full,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
                IfNoneMatch="*",
            ),
            conditional=True,
        )
    except StoreError as e:
        if isinstance(e.__cause__, _CONNECTION_ERRORS):
            raise OutcomeUnknown(f"{store.describe(key)}: completion unanswered") from e
        raise


def abort_upload(store: Store, key: str, upload_id: str) -> bool:
    """Abort an upload and free its parts; False if it was already gone."""
    client, bucket, full = store.client, store.bucket, store.full_key(key)
    try:
        _multipart_call(
            store,
            "abort the multipart upload of",
            key,
            lambda: client.abort_multipart_upload(Bucket=bucket, Key=full, UploadId=upload_id),
        )
    except UploadGone:
        return False
    return True


def list_uploads(store: Store, prefix: str) -> Iterator[tuple[str, str]]:
    """(key, upload id) of every unfinished multipart upload under ``prefix``."""
    client, bucket = store.client, store.bucket
    base = len(store.full_key(""))
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": store.full_key(prefix)}
    while True:
        response = _multipart_call(
            store,
            "list the multipart uploads under",
            prefix,
            lambda kw=dict(kwargs): client.list_multipart_uploads(**kw),  # type: ignore[misc]
        )
        for upload in response.get("Uploads", []):
            yield upload["Key"][base:], upload["UploadId"]
        if not response.get("IsTruncated"):
            return
        kwargs["KeyMarker"] = response.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = response.get("NextUploadIdMarker", "")


def head_or_none(store: Store, key: str) -> Head | None:
    try:
        return store.head(key)
    except NotFound:
        return None
