"""``MemoryStore``: the storage seam in one process, with S3's semantics.

A real backend, held to the same conformance suite as ``S3Store``: conditional creates and
updates, 304s, ranged reads, listings with a delimiter, multipart uploads with a
create-only completion and S3's multipart ETags, the 5 MiB minimum part. Every
``MemoryStore`` of one bucket name in one process shares the same objects, so
``om.connect("memory://bucket/prefix")`` gives agents in threads of one process an embedded
manifest (nothing is shared between processes, and nothing survives the process).

Its clock is injectable (``clock=``), and ``faults`` injects what a real network does: a
call that fails before it is applied, one that is applied and whose answer is lost, a
read whose connection breaks part-way through the body, or a body damaged on its way in.
Like a store that verifies ``Content-MD5``, it refuses a damaged whole object (and the
body is sent again, ``send_whole``); a damaged part is stored, with the ETag of what
arrived, as S3 stores a part sent without a digest header.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import BinaryIO, Literal

from ..core import checksum
from ..core.runtime import DEFAULT, Runtime
from ..errors import InvalidInput, NotFound, ReadBrokeOff, StoreError
from .base import (
    CREATE,
    OVERWRITE,
    Blob,
    ByteStream,
    Head,
    Listed,
    PartBody,
    PartsListed,
    PutMode,
    send_whole,
)
from .errors import BodyDamaged, OutcomeUnknown, PartsRejected, PreconditionFailed, UploadGone

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_NUMBER = 10_000

UNKNOWN_WHEN_LOST = frozenset({"put", "complete_upload"})
"""The writes whose lost answer is ``OutcomeUnknown``, as ``S3Store`` says it (the calls
whose outcome a caller must find out); a lost answer to any other call, a delete too, is a
``StoreError``, applied all the same."""

Effect = Literal["fail", "lose", "cut", "flip", "truncate"]
EFFECTS: tuple[str, ...] = ("fail", "lose", "cut", "flip", "truncate")
OPERATIONS: tuple[str, ...] = (
    "get",
    "head",
    "open",
    "put",
    "delete",
    "list",
    "create_upload",
    "upload_part",
    "list_parts",
    "complete_upload",
    "abort_upload",
    "list_uploads",
)
"""The store calls a fault may be planned for (``Fault.op``)."""
DAMAGES = ("flip", "truncate")
"""Effects on a write's body on its way in: one bit of its middle byte inverted, or only
its first half arriving (with a length to match)."""


@dataclass
class Fault:
    """One planned fault: ``op`` (None: any call) on keys containing ``key`` (None: any).

    ``fail``: the call raises ``StoreError`` and is not applied. ``lose``: the call is
    applied and its answer lost (a ``put`` or ``complete_upload`` raises ``OutcomeUnknown``,
    any other call, a ``delete`` too, ``StoreError``: what ``S3Store`` raises).
    ``cut`` (only with ``op="open"``): the stream is returned, delivers the first half of
    its bytes (rounded down), then raises ``ReadBrokeOff`` on every further read: it never
    reaches its end, as when a connection breaks mid-body. A ``read()`` of everything
    raises at once, like a real connection that breaks before the body is complete.
    ``flip`` and ``truncate`` (only with ``op="put"`` or ``"upload_part"``) damage the body
    on its way in: a whole object is refused (its ``Content-MD5`` does not match) and sent
    again by the store's own retry; a part is stored as it arrived.
    """

    op: str | None = None
    key: str | None = None
    effect: Effect = "fail"
    times: int = 1

    def __post_init__(self) -> None:
        # A typo here would plan a fault that never fires, and a test pass for nothing.
        if self.op is not None and self.op not in OPERATIONS:
            raise InvalidInput(
                f"no store call is named {self.op!r}: use one of {', '.join(OPERATIONS)}, or "
                "None for any call"
            )
        if self.effect not in EFFECTS:
            raise InvalidInput(
                f"no fault effect is named {self.effect!r}: use one of {', '.join(EFFECTS)}"
            )
        if self.key is not None and not isinstance(self.key, str):
            raise InvalidInput(
                f"key is a part of the keys to fault (a str) or None, not {self.key!r}"
            )
        if not isinstance(self.times, int) or isinstance(self.times, bool) or self.times < 1:
            raise InvalidInput(f"times is how many calls to fault: 1 or more, not {self.times!r}")
        if self.effect == "cut" and self.op != "open":
            raise InvalidInput(
                f'a "cut" fault breaks a read stream: use op="open", not {self.op!r}'
            )
        if self.effect in DAMAGES and self.op not in ("put", "upload_part"):
            raise InvalidInput(
                f'a "{self.effect}" fault damages a body sent: use op="put" or '
                f'op="upload_part", not {self.op!r}'
            )

    def matches(self, op: str, key: str) -> bool:
        return (self.op is None or self.op == op) and (self.key is None or self.key in key)


@dataclass
class Faults:
    """The faults planned for one ``MemoryStore``, and hooks called before every call.

    A hook receives ``(op, key)`` and may raise (a fault of its own) or block (a stall);
    ``calls`` counts every call by its name.
    """

    planned: list[Fault] = field(default_factory=list)
    hooks: list[Callable[[str, str], None]] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(
        self, op: str | None = None, key: str | None = None, effect: Effect = "fail", times: int = 1
    ) -> Fault:
        fault = Fault(op, key, effect, times)
        with self._lock:
            self.planned.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.planned.clear()
            self.hooks.clear()

    def take(self, op: str, key: str) -> Effect | None:
        """Count the call and take the first planned fault it matches, if any."""
        with self._lock:
            self.calls[op] += 1
            for fault in self.planned:
                if fault.times > 0 and fault.matches(op, key):
                    fault.times -= 1
                    return fault.effect
        return None


@dataclass
class _Object:
    body: bytes
    etag: str
    metadata: dict[str, str]


@dataclass
class _Upload:
    key: str
    parts: dict[int, tuple[str, bytes]] = field(default_factory=dict)


@dataclass
class _Bucket:
    lock: threading.Lock = field(default_factory=threading.Lock)
    objects: dict[str, _Object] = field(default_factory=dict)
    uploads: dict[str, _Upload] = field(default_factory=dict)


_BUCKETS: dict[str, _Bucket] = {}
_BUCKETS_LOCK = threading.Lock()


def _bucket(name: str) -> _Bucket:
    with _BUCKETS_LOCK:
        return _BUCKETS.setdefault(name, _Bucket())


def _quoted_md5(data: bytes) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def _arrived(data: bytes, effect: Effect | None) -> bytes:
    """The body as it arrives under ``effect``: damaged, or as it was sent."""
    if effect == "truncate":
        return data[: len(data) // 2]
    if effect == "flip" and data:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
    return data


def _read_body(body: bytes | BinaryIO | PartBody) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    length = getattr(body, "length", None)
    body.seek(0)
    if length is None:
        return bytes(body.read())
    chunks: list[bytes] = []  # a file object may give fewer bytes than asked at a time
    while length > 0 and (chunk := body.read(length)):
        chunks.append(bytes(chunk))
        length -= len(chunk)
    return b"".join(chunks)


class _CutStream:
    """A stream whose connection breaks after the first half of ``data`` (a ``cut`` fault)."""

    def __init__(self, data: bytes, where: str) -> None:
        self._data = data
        self._cut = len(data) // 2
        self._pos = 0
        self._where = where

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        if self._pos >= self._cut or size < 0:
            raise ReadBrokeOff(
                f"reading {self._where} broke off after {self._cut} of {len(self._data)} "
                "bytes (injected)"
            )
        end = min(self._pos + size, self._cut)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def close(self) -> None:
        self._pos = self._cut


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryStore:
    """One bucket and prefix of the process's in-memory object store."""

    scheme = "memory"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        clock: Callable[[], datetime] | None = None,
        runtime: Runtime | None = None,
        connections: int = 64,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.runtime = runtime or DEFAULT
        self.clock = clock or _utc_now
        self.faults = Faults()
        self._connections = connections
        self._data = _bucket(bucket)

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"

    @property
    def url(self) -> str:
        return f"memory://{self.bucket}/{self.prefix}" if self.prefix else f"memory://{self.bucket}"

    @property
    def connections(self) -> int:
        return self._connections

    def full_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def describe(self, key: str) -> str:
        return f"memory://{self.bucket}/{self.full_key(key)}"

    def _enter(self, op: str, key: str) -> Effect | None:
        for hook in list(self.faults.hooks):
            hook(op, key)
        effect = self.faults.take(op, key)
        if effect == "fail":
            raise StoreError(f"could not {op} {self.describe(key)}: injected fault")
        return effect

    def _answer_lost(self, op: str, key: str) -> Exception:
        if op in UNKNOWN_WHEN_LOST:
            return OutcomeUnknown(f"{self.describe(key)}: answer lost (injected)")
        return StoreError(f"could not {op} {self.describe(key)}: answer lost (injected)")

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        effect = self._enter("get", key)
        with self._data.lock:
            found = self._data.objects.get(self.full_key(key))
        if effect == "lose":
            raise self._answer_lost("get", key)
        if found is None:
            raise NotFound(f"{self.describe(key)} does not exist")
        if if_none_match is not None and checksum.bare_etag(if_none_match) == checksum.bare_etag(
            found.etag
        ):
            return None
        return Blob(found.body, found.etag, dict(found.metadata))

    def head(self, key: str) -> Head:
        effect = self._enter("head", key)
        with self._data.lock:
            found = self._data.objects.get(self.full_key(key))
        if effect == "lose":
            raise self._answer_lost("head", key)
        if found is None:
            raise NotFound(f"{self.describe(key)} does not exist")
        return Head(found.etag, len(found.body), dict(found.metadata))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> ByteStream:
        effect = self._enter("open", key)
        with self._data.lock:
            found = self._data.objects.get(self.full_key(key))
        if effect == "lose":
            raise self._answer_lost("open", key)
        if found is None:
            raise NotFound(f"{self.describe(key)} does not exist")
        data = found.body
        if byte_range is not None:
            start, end = byte_range
            if start >= len(found.body) > 0 or start < 0 or end < start:
                raise StoreError(
                    f"could not read {self.describe(key)}: range {start}-{end} is outside its "
                    f"{len(found.body)} bytes"
                )
            data = found.body[start:end]
        if effect == "cut":
            return _CutStream(data, self.describe(key))
        return io.BytesIO(data)

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        mode: PutMode = OVERWRITE,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        data = _read_body(body)
        return send_whole(
            lambda: self._put_once(key, data, mode, metadata), self.runtime, self.describe(key)
        )

    def _put_once(
        self, key: str, data: bytes, mode: PutMode, metadata: dict[str, str] | None
    ) -> str:
        effect = self._enter("put", key)
        if effect in DAMAGES and _arrived(data, effect) != data:
            # What S3 does when the body's MD5 is not its Content-MD5: nothing is stored.
            raise BodyDamaged(f"{self.describe(key)}: BadDigest (injected)")
        full = self.full_key(key)
        with self._data.lock:
            self._check(full, key, mode)
            etag = _quoted_md5(data)
            self._data.objects[full] = _Object(data, etag, dict(metadata or {}))
        if effect == "lose":
            raise self._answer_lost("put", key)
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
        effect = self._enter("delete", key)
        with self._data.lock:
            self._data.objects.pop(self.full_key(key), None)
        if effect == "lose":
            raise self._answer_lost("delete", key)

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        effect = self._enter("list", prefix)
        if effect == "lose":
            raise self._answer_lost("list", prefix)
        full = self.full_key(prefix)
        base = len(self.full_key(""))
        with self._data.lock:
            keys = sorted(k for k in self._data.objects if k.startswith(full))
        rolled: set[str] = set()
        for key in keys:
            if delimiter:
                cut = key.find(delimiter, len(full))
                if cut >= 0:
                    rolled_up = key[: cut + len(delimiter)]
                    if rolled_up not in rolled:
                        rolled.add(rolled_up)
                        yield Listed(rolled_up[base:], True)
                    continue
            yield Listed(key[base:])

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under ``prefix``."""
        return (row.key for row in self.list(prefix))

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        effect = self._enter("create_upload", key)
        upload_id = self.runtime.new_id()
        with self._data.lock:
            self._data.uploads[upload_id] = _Upload(self.full_key(key))
        if effect == "lose":
            raise self._answer_lost("create_upload", key)
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
        sent = _read_body(body)
        effect = self._enter("upload_part", key)
        data = _arrived(sent, effect)
        etag = checksum.bare_etag(_quoted_md5(data))
        with self._data.lock:
            self._upload(key, upload_id).parts[number] = (etag, data)
        if effect == "lose":
            raise self._answer_lost("upload_part", key)
        return etag

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        effect = self._enter("list_parts", key)
        with self._data.lock:
            parts = dict(self._upload(key, upload_id).parts)
        if effect == "lose":
            raise self._answer_lost("list_parts", key)
        return {n: {etag: len(data)} for n, (etag, data) in sorted(parts.items())}

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        effect = self._enter("complete_upload", key)
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
            self._data.objects[full] = _Object(body, f'"{implied}"', {})
            del self._data.uploads[upload_id]
        if effect == "lose":
            raise self._answer_lost("complete_upload", key)

    def abort_upload(self, key: str, upload_id: str) -> bool:
        effect = self._enter("abort_upload", key)
        with self._data.lock:
            found = self._data.uploads.get(upload_id)
            gone = found is None or found.key != self.full_key(key)
            if not gone:
                del self._data.uploads[upload_id]
        if effect == "lose":
            raise self._answer_lost("abort_upload", key)
        return not gone

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        effect = self._enter("list_uploads", prefix)
        if effect == "lose":
            raise self._answer_lost("list_uploads", prefix)
        full = self.full_key(prefix)
        base = len(self.full_key(""))
        with self._data.lock:
            found = sorted(
                (u.key, upload_id)
                for upload_id, u in self._data.uploads.items()
                if u.key.startswith(full)
            )
        for key, upload_id in found:
            yield key[base:], upload_id

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()
