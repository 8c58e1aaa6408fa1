"""Chunked entries: multipart uploads that outlive their producer, verified part by part.

Data above the threshold goes to ``TASK/data/STAGE/FILE_ID@EPOCH`` as an S3 multipart upload
(``EPOCH`` of the holder that started it). Its state lives beside the shard, in
``TASK/uploads/STAGE/FILE_ID.json``: key, upload id, part size, and for every finished part
its number, size, xxh3 and ETag. Holders change it only through ``Documents.commit``, in
batches, so the stage shard stays small however many parts there are.

* Every change to the state names the holder's epoch; one from an older epoch is refused
  (``LeaseLost``), so once a new holder has taken the state over, a fenced one cannot touch
  it.
* A new holder with the same source **adopts** the upload: a part is done when ``ListParts``
  shows the recorded ETag and the recorded xxh3 equals the xxh3 of its own bytes for that
  part; the rest is sent again, with the recorded part size.
* Completion names the exact part ETags and sends ``If-None-Match: *``. The object's ETag is
  then checked against the ETag those parts imply, since some stores answer 200 to a
  completion that did nothing. An object completed by someone else is adopted only if it
  is exactly the holder's own bytes part for part; otherwise the holder starts a new upload
  at a new key. So the object a ready entry points at holds the bytes of the holder that
  made it ready, and a fenced holder never makes it ready (``changes.finish`` checks the
  epoch).
* Uploads are kept while their entry may be adopted, and aborted when the entry is dead or
  a holder starts a new upload in their place (``abandon``, ``sweep``). Data a consumer
  found bad is marked (``reject_data``) before the entry fails, so it is never adopted back.
* A consumer reads the part list, checks it against the entry's composite checksum, then
  fetches parts with parallel ranged GETs, verifying each part's xxh3 as it streams.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import botocore.exceptions
import xxhash
from pydantic import BaseModel, ConfigDict, ValidationError

from . import checksum, transfer
from .changes import DataChanged
from .errors import (
    ChecksumMismatch,
    CorruptShard,
    LeaseLost,
    NotFound,
    ObjManifestError,
    StoreError,
)
from .model import COMMITS_KEPT, Claim, Entry, State
from .shards import Documents, load_json
from .store import OutcomeUnknown, PreconditionFailed, Store
from .transfer import PartSource, Progress, Stored, TransferConfig

if TYPE_CHECKING:
    from .task import Task

log = logging.getLogger(__name__)

STATE_SCHEMA = 1
FLUSH_SECONDS = 2.0
"""Longest time finished parts wait before their batch is recorded."""
BATCHES = 64
"""Parts are recorded in batches of about 1/64 of the upload (at least ``concurrency``), so
the state object, which grows with the parts, is rewritten a bounded number of times."""
COMPLETE_ROUNDS = 3
FETCH_TRIES = 3

Part = tuple[int, int, str, str]
"""(number, size, xxh3-128 hex, bare ETag) of one finished part."""


def parts_key(task_id: str, stage: str, file_id: str) -> str:
    """Where an entry's upload state lives, beside its stage's shard."""
    return f"{task_id}/uploads/{stage}/{file_id}.json"


# -- the upload-state object ---------------------------------------------------------------


class UploadState(BaseModel):
    """``uploads/STAGE/FILE_ID.json``: one entry's multipart upload and its finished parts."""

    model_config = ConfigDict(extra="allow", frozen=True)

    schema_version: int = STATE_SCHEMA
    task_id: str
    stage: str
    file_id: str
    version: int = 0
    commits: tuple[str, ...] = ()
    epoch: int = 0
    """The epoch of the holder that last took the upload over; older ones are refused."""
    owner: str | None = None
    status: Literal["none", "open", "aborted"] = "none"
    key: str | None = None
    upload_id: str | None = None
    part_size: int | None = None
    size: int | None = None
    """The source's size; None for a stream."""
    parts: tuple[Part, ...] = ()
    updated_at: datetime | None = None

    def with_parts(self, parts: Iterable[Part]) -> tuple[Part, ...]:
        merged = {p[0]: p for p in self.parts}
        merged.update((p[0], p) for p in parts)
        return tuple(merged[n] for n in sorted(merged))


@dataclass(frozen=True)
class UploadCodec:
    """How ``Documents`` reads, writes and stamps an upload-state object."""

    task_id: str
    stage: str
    file_id: str

    def decode(self, key: str, body: bytes) -> UploadState:
        data = load_json(key, body, STATE_SCHEMA)
        try:
            return UploadState.model_validate(data)
        except ValidationError as e:
            raise CorruptShard(key, f"not an upload state: {e.errors()[:3]}") from None

    def encode(self, doc: UploadState) -> bytes:
        return doc.model_dump_json(exclude_none=True).encode()

    def empty(self) -> UploadState:
        return UploadState(task_id=self.task_id, stage=self.stage, file_id=self.file_id)

    def stamp(self, doc: UploadState, commit_id: str) -> UploadState:
        commits = (*doc.commits, commit_id)[-COMMITS_KEPT:]
        return doc.model_copy(update={"version": doc.version + 1, "commits": commits})

    def commit_ids(self, doc: UploadState) -> Sequence[str]:
        return doc.commits


# -- pure changes to the upload state --------------------------------------------------------


def _not_older(doc: UploadState, claim: Claim) -> None:
    if doc.epoch > claim.epoch:
        raise LeaseLost(
            f"the upload of {claim.file_id!r} was taken over by epoch {doc.epoch} "
            f"({doc.owner}); epoch {claim.epoch} of {claim.agent} is fenced. Stop working on it."
        )


def _holds(doc: UploadState, claim: Claim, upload_id: str) -> None:
    _not_older(doc, claim)
    if doc.upload_id != upload_id or doc.status != "open":
        raise LeaseLost(
            f"the upload of {claim.file_id!r} that epoch {claim.epoch} was sending is no longer "
            f"the entry's upload (now {doc.status}, {doc.key}); stop working on it."
        )


def begin(
    doc: UploadState,
    now: datetime,
    claim: Claim,
    key: str,
    upload_id: str,
    part_size: int,
    size: int | None,
) -> tuple[UploadState, tuple[UploadState, UploadState]]:
    """A new upload replaces whatever was recorded; returns (new, replaced)."""
    _not_older(doc, claim)
    new = doc.model_copy(
        update={
            "epoch": claim.epoch,
            "owner": claim.agent,
            "status": "open",
            "key": key,
            "upload_id": upload_id,
            "part_size": part_size,
            "size": size,
            "parts": (),
            "updated_at": now,
        }
    )
    return new, (new, doc)


def take_over(
    doc: UploadState, now: datetime, claim: Claim
) -> tuple[UploadState | None, UploadState]:
    """The new holder claims the recorded upload, which fences older holders out of it."""
    _not_older(doc, claim)
    if (doc.epoch, doc.owner) == (claim.epoch, claim.agent):
        return None, doc
    new = doc.model_copy(update={"epoch": claim.epoch, "owner": claim.agent, "updated_at": now})
    return new, new


def record(
    doc: UploadState, now: datetime, claim: Claim, upload_id: str, parts: Sequence[Part]
) -> tuple[UploadState, UploadState]:
    """Add a batch of finished parts."""
    _holds(doc, claim, upload_id)
    new = doc.model_copy(update={"parts": doc.with_parts(parts), "updated_at": now})
    return new, new


def seal(
    doc: UploadState, now: datetime, claim: Claim, upload_id: str, parts: Sequence[Part]
) -> tuple[UploadState | None, UploadState]:
    """The final part list, exactly the parts completion will name (nothing more)."""
    _holds(doc, claim, upload_id)
    exact = tuple(sorted(parts))
    if doc.parts == exact:
        return None, doc
    new = doc.model_copy(update={"parts": exact, "updated_at": now})
    return new, new


def abort(
    doc: UploadState, now: datetime, epoch: int | None
) -> tuple[UploadState | None, UploadState | None]:
    """Mark the open upload aborted, unless a holder newer than ``epoch`` has it. Returns
    the state before (what to abort in the store), or None if nothing was open."""
    if doc.status != "open" or (epoch is not None and doc.epoch > epoch):
        return None, None
    return doc.model_copy(update={"status": "aborted", "updated_at": now}), doc


def reject(doc: UploadState, now: datetime, key: str) -> tuple[UploadState | None, bool]:
    """A consumer found the completed object at ``key`` bad: it must never be adopted back.
    A no-op if the state has moved on to another upload already."""
    if doc.key != key or doc.status != "open":
        return None, False
    return doc.model_copy(update={"status": "aborted", "updated_at": now}), True


# -- uploading -------------------------------------------------------------------------------


@dataclass
class UploadStats:
    """What one chunked put did: parts adopted from an earlier holder, parts sent."""

    parts_adopted: int = 0
    bytes_adopted: int = 0
    parts_sent: int = 0
    bytes_sent: int = 0
    uploads_started: int = 0


class _Restart(Exception):
    """The upload cannot be finished as it is: start a new one at a new key."""


class _NotSame(Exception):
    """A part of the source differs from the recorded part (while verifying only)."""


def upload(
    task: Task,
    claim: Claim,
    source: PartSource,
    config: TransferConfig,
    *,
    explicit_part_size: bool = False,
    progress: Progress | None = None,
    stop: Callable[[], None] = lambda: None,
) -> tuple[Stored, UploadStats]:
    """Store ``source`` as the claim's chunked data, adopting an earlier holder's upload
    where its parts match; returns where it landed, ready for ``changes.finish``.

    ``stop`` raises (``LeaseLost``) once the lease is known to be lost, so a fenced holder
    stops sending parts early; the shard's epoch check is what makes it safe anyway.
    """
    return _Upload(task, claim, source, config, explicit_part_size, progress, stop).run()


@dataclass
class _Upload:
    task: Task
    claim: Claim
    source: PartSource
    config: TransferConfig
    explicit: bool
    progress: Progress | None
    stop: Callable[[], None]
    stats: UploadStats = field(default_factory=UploadStats)

    def __post_init__(self) -> None:
        claim = self.claim
        self.store: Store = self.task.store
        self.state_key = parts_key(claim.task_id, claim.stage, claim.file_id)
        self.codec = UploadCodec(claim.task_id, claim.stage, claim.file_id)
        # A private cache: a big part list must not stay in the task's cache for good.
        self.docs = Documents(self.store, self.task.docs.policy)
        self.concurrency = max(1, min(self.config.concurrency, transfer.pool_size(self.store)))
        self.done_bytes = 0

    def advance(self, size: int) -> None:
        self.done_bytes += size
        if self.progress is not None:
            self.progress(self.done_bytes, self.source.size)

    def commit(self, change: Callable[..., Any], *args: Any) -> UploadState:
        result: UploadState = self.docs.commit(
            self.state_key, self.codec, lambda doc, now: change(doc, now, *args)
        )
        return result

    # -- the plan: adopt, or start anew ----------------------------------------------------

    def run(self) -> tuple[Stored, UploadStats]:
        self._held_entry()
        doc = self.docs.read(self.state_key, self.codec)
        parts: list[Part] | None = None
        if doc.status == "open" and doc.upload_id and self.source.seekable:
            doc = self.commit(take_over, self.claim)
            parts = self._adopt(doc)
        for attempt in range(COMPLETE_ROUNDS):
            if parts is not None:
                return self._stored(doc, parts), self.stats
            if attempt and not self.source.seekable:
                break  # a stream cannot be read again
            self._held_entry()  # a fenced holder stops here, before starting anew
            doc, parts = self._fresh(doc)
        if parts is not None:
            return self._stored(doc, parts), self.stats
        raise StoreError(
            f"{self.store.describe(doc.key or self.state_key)}: the upload could not be "
            "completed as sent (another holder's object is there, or the upload vanished); "
            "fail() this claim and produce the entry again"
        )

    def _held_entry(self) -> Entry:
        claim = self.claim
        shard = self.task.docs.read(self.task.shard_key(claim.stage), self.task.codec(claim.stage))
        entry = shard.entries.get(claim.file_id)
        if entry is None or (entry.state, entry.epoch, entry.owner) != (
            State.writing,
            claim.epoch,
            claim.agent,
        ):
            now = f"{entry.state.value} at epoch {entry.epoch}" if entry else "gone"
            raise LeaseLost(
                f"lease on {claim.file_id!r} (epoch {claim.epoch}, agent {claim.agent}) is "
                f"lost: the entry is now {now}. Stop working on it."
            )
        return entry

    def _stored(self, doc: UploadState, parts: list[Part]) -> Stored:
        assert doc.key is not None and doc.part_size is not None
        digest = checksum.composite((p[2] for p in parts), doc.part_size)
        size = sum(p[1] for p in parts)
        return Stored(doc.key, digest, size, doc.part_size, self.state_key)

    def _adopt(self, doc: UploadState) -> list[Part] | None:
        """Finish the recorded upload; None if it cannot be (start anew instead)."""
        assert doc.key is not None and doc.upload_id is not None and doc.part_size
        size = self.source.size
        assert size is not None  # only a seekable source adopts
        if transfer.part_count(size, doc.part_size) > transfer.MAX_PARTS:
            return None
        try:
            listed = transfer.list_parts(self.store, doc.key, doc.upload_id)
        except transfer.UploadGone:
            return self._adopt_completed(doc)
        candidates = {p[0]: p for p in doc.parts if p[3] in listed.get(p[0], {})}
        log.info("%s: adopting %s (%d parts recorded)", self.claim.file_id, doc.key, len(doc.parts))
        try:
            return self._send_and_complete(doc, candidates)
        except _Restart:
            return None

    def _adopt_completed(self, doc: UploadState) -> list[Part] | None:
        """An object completed by an earlier holder: kept only if it is exactly our bytes."""
        assert doc.key is not None and doc.part_size is not None
        head = transfer.head_or_none(self.store, doc.key)
        parts = list(doc.parts)
        if head is None or not parts:
            return None
        numbers_ok = [p[0] for p in parts] == list(range(1, len(parts) + 1))
        implied = checksum.multipart_etag(p[3] for p in parts)
        if not numbers_ok or implied is None or checksum.bare_etag(head.etag) != implied:
            return None
        if head.size != self.source.size or sum(p[1] for p in parts) != head.size:
            return None
        try:
            _Pump(self, doc, {p[0]: p for p in parts}, verify_only=True).run([p[0] for p in parts])
        except _NotSame:
            return None
        log.info("%s: adopting the completed object %s", self.claim.file_id, doc.key)
        return parts

    def _fresh(self, doc: UploadState) -> tuple[UploadState, list[Part] | None]:
        """Start a new upload in place of whatever was recorded, and send everything."""
        part_size = transfer.part_size_for(self.source.size, self.config, self.explicit)
        key = self._new_key(doc)
        upload_id = transfer.create_upload(self.store, key)
        self.stats.uploads_started += 1
        self.done_bytes = 0
        try:
            doc, replaced = self.docs.commit(
                self.state_key,
                self.codec,
                lambda d, now: begin(
                    d, now, self.claim, key, upload_id, part_size, self.source.size
                ),
            )
        except BaseException:
            with contextlib.suppress(Exception):
                transfer.abort_upload(self.store, key, upload_id)
            raise
        self._retire(replaced, keep=key)
        try:
            return doc, self._send_and_complete(doc, {})
        except _Restart:
            return doc, None

    def _new_key(self, doc: UploadState) -> str:
        """The claim's epoch names the key; a second upload in one epoch gets ``~N``."""
        c = self.claim
        base = transfer.data_key(c.task_id, c.stage, c.file_id, c.epoch)
        if doc.key is None or not doc.key.startswith(base):
            return base
        suffix = doc.key[len(base) :].lstrip("~")
        return f"{base}~{int(suffix) + 1 if suffix.isdigit() else 2}"

    def _retire(self, old: UploadState, keep: str) -> None:
        """Abort the upload a new one replaces, and remove an object it completed: no entry
        points at it (ours is held by us, and a rejected one has no data any more)."""
        if old.key is None or old.key == keep:
            return
        with contextlib.suppress(ObjManifestError):
            if old.upload_id and old.status == "open":
                transfer.abort_upload(self.store, old.key, old.upload_id)
            if transfer.head_or_none(self.store, old.key):
                self.store.delete(old.key)
                log.info("%s: removed %s, replaced by %s", self.claim.file_id, old.key, keep)

    # -- sending and completing ---------------------------------------------------------------

    def _send_and_complete(self, doc: UploadState, candidates: dict[int, Part]) -> list[Part]:
        results = _Pump(self, doc, candidates).run(None)
        self.source.check_unchanged()
        parts = [results[n] for n in sorted(results)]
        if [p[0] for p in parts] != list(range(1, len(parts) + 1)):
            raise StoreError(f"internal error: parts {sorted(results)} are not contiguous")
        for _ in range(COMPLETE_ROUNDS):
            self.stop()
            doc = self.commit(seal, self.claim, doc.upload_id, parts)  # fences older holders
            if self._complete(doc, parts):
                return parts
            self._resend_rejected(doc, parts)
        raise _Restart()

    def _complete(self, doc: UploadState, parts: list[Part]) -> bool:
        """True once ``doc.key`` holds exactly ``parts``; False if some ETag was rejected
        (send again); ``_Restart`` if the key holds other bytes or the upload vanished."""
        assert doc.key is not None and doc.upload_id is not None
        etags = [p[3] for p in parts]
        answered = False
        for _ in range(COMPLETE_ROUNDS):
            try:
                transfer.complete_upload(self.store, doc.key, doc.upload_id, etags)
                answered = True
            except transfer.PartsRejected:
                return False
            except (PreconditionFailed, transfer.UploadGone):
                pass
            except OutcomeUnknown:
                if transfer.head_or_none(self.store, doc.key) is None:
                    continue  # not applied: complete again
            break
        head = transfer.head_or_none(self.store, doc.key)
        if head is None:
            log.warning("%s: upload %s vanished before completion", self.claim.file_id, doc.key)
            raise _Restart()
        size = sum(p[1] for p in parts)
        implied = checksum.multipart_etag(etags)
        ours = head.size == size and (
            checksum.bare_etag(head.etag) == implied if implied is not None else answered
        )
        if not ours:
            log.warning(
                "%s: %s holds other bytes (ETag %s, not %s); starting a new upload",
                self.claim.file_id,
                self.store.describe(doc.key),
                head.etag,
                implied,
            )
            raise _Restart()
        return True

    def _resend_rejected(self, doc: UploadState, parts: list[Part]) -> None:
        """Send again the parts whose ETag the store no longer has (a fenced holder replaced
        them on a store that keeps one upload per part number)."""
        assert doc.key is not None and doc.upload_id is not None
        self.commit(seal, self.claim, doc.upload_id, parts)  # a fenced holder stops here
        try:
            listed = transfer.list_parts(self.store, doc.key, doc.upload_id)
        except transfer.UploadGone:
            raise _Restart() from None
        missing = [p[0] for p in parts if p[3] not in listed.get(p[0], {})]
        resent = _Pump(self, doc, {}, record_parts=False).run(missing)
        for number in missing:
            if resent[number] != parts[number - 1]:
                raise transfer.SourceChanged(
                    f"part {number} of {self.source.name} changed while it was uploaded; "
                    "upload a file that is no longer being written"
                )


class _Pump:
    """Reads, hashes and sends parts with a bounded pool: at most ``concurrency`` parts are
    in flight, so at most that many in memory (a part streamed from a file is never held
    whole). Finished parts are recorded in batches by the calling thread."""

    def __init__(
        self,
        up: _Upload,
        doc: UploadState,
        candidates: dict[int, Part],
        *,
        verify_only: bool = False,
        record_parts: bool = True,
    ) -> None:
        assert doc.key is not None and doc.upload_id is not None and doc.part_size is not None
        self.up, self.doc = up, doc
        self.key, self.upload_id, self.part_size = doc.key, doc.upload_id, doc.part_size
        self.candidates = candidates
        self.verify_only, self.record_parts = verify_only, record_parts
        self.results: dict[int, Part] = {}
        self.pending: list[Part] = []
        self.flushed_at = time.monotonic()
        size = up.source.size
        total = transfer.part_count(size, self.part_size) if size is not None else 0
        self.batch = max(up.concurrency, math.ceil(total / BATCHES))

    def run(self, numbers: list[int] | None) -> dict[int, Part]:
        """Send ``numbers`` (None: every part of the source); part number -> part."""
        plan = iter(self._plan(numbers))
        inflight: set[cf.Future[tuple[Part, bool]]] = set()
        pool = cf.ThreadPoolExecutor(self.up.concurrency, thread_name_prefix="om-part")
        try:
            while True:
                self.up.stop()
                while len(inflight) >= self.up.concurrency:
                    inflight = self._drain(inflight)
                item = next(plan, None)
                if item is None:
                    break
                inflight.add(pool.submit(self._part, *item))
            while inflight:
                inflight = self._drain(inflight)
            self._flush(force=True)
        except BaseException as e:
            for future in inflight:
                future.cancel()
            if not isinstance(e, LeaseLost):
                with contextlib.suppress(Exception):
                    self._flush(force=True)  # keep what was sent for the next holder
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return self.results

    def _plan(self, numbers: list[int] | None) -> Iterator[tuple[int, int, int, bytes | None]]:
        """(number, offset, length, bytes read already) of each part to send."""
        source, size, step = self.up.source, self.up.source.size, self.part_size
        if size is not None:
            last = transfer.part_count(size, step)
            for n in numbers if numbers is not None else range(1, last + 1):
                offset = (n - 1) * step
                yield n, offset, min(step, size - offset), None
            return
        number, offset = 1, 0
        while True:  # a stream: read here, in order, only when a slot is free
            body = source.read_at(offset, step)
            if not body and number > 1:
                return
            if number > transfer.MAX_PARTS:
                raise ValueError(
                    f"the stream is longer than {transfer.MAX_PARTS} parts of {step} bytes; "
                    "pass a larger part_size (525 MiB reaches S3's 5 TiB limit)"
                )
            yield number, offset, len(body), body
            if len(body) < step:
                return
            number, offset = number + 1, offset + len(body)

    def _part(self, number: int, offset: int, length: int, body: bytes | None) -> tuple[Part, bool]:
        """Runs in a worker: send the part streamed from the file and hashed as it goes; or,
        for a part that may be adopted (or a source that cannot stream), read and hash it,
        then send it unless it is the recorded part."""
        known = self.candidates.get(number)
        reader = None
        if body is None and known is None and not self.verify_only:
            reader = self.up.source.open_part(offset, length)
        if reader is not None:
            try:
                etag = transfer.upload_part(self.up.store, self.key, self.upload_id, number, reader)
            finally:
                self.up.source.check_unchanged()  # else the passes may have read other bytes
            return (number, length, reader.digest(), etag), True
        data = body if body is not None else self.up.source.read_at(offset, length)
        if len(data) != length:
            raise transfer.SourceChanged(
                f"{self.up.source.name} ended early at part {number} (expected {length} bytes "
                f"at offset {offset}, read {len(data)}); upload a file that is not being written"
            )
        digest = checksum.part_hex(data)
        if known is not None and known[1] == length and known[2] == digest:
            return known, False
        if self.verify_only:
            raise _NotSame(number)
        etag = transfer.upload_part(self.up.store, self.key, self.upload_id, number, data)
        return (number, length, digest, etag), True

    def _drain(self, inflight: set[cf.Future[tuple[Part, bool]]]) -> set[cf.Future[Any]]:
        """Take in the parts that finished (all of them before raising the first error)."""
        done, rest = cf.wait(inflight, timeout=FLUSH_SECONDS, return_when=cf.FIRST_COMPLETED)
        errors = [e for e in (f.exception() for f in done) if e is not None]
        for future in done:
            if future.exception() is None:
                self._finished(*future.result())
        if errors:
            if isinstance(errors[0], transfer.UploadGone):
                raise _Restart() from errors[0]  # completed or aborted by someone else
            raise errors[0]
        self._flush()
        self.up.stop()
        return rest

    def _finished(self, part: Part, sent: bool) -> None:
        stats = self.up.stats
        self.results[part[0]] = part
        if sent:
            stats.parts_sent += 1
            stats.bytes_sent += part[1]
            self.pending.append(part)
        elif not self.verify_only:
            stats.parts_adopted += 1
            stats.bytes_adopted += part[1]
        if self.record_parts:
            self.up.advance(part[1])

    def _flush(self, force: bool = False) -> None:
        """Record the pending parts: when a batch is full, ``FLUSH_SECONDS`` passed, or at
        the end. A passing store fault is retried at the next flush."""
        if not self.pending or not self.record_parts:
            return
        due = time.monotonic() - self.flushed_at >= FLUSH_SECONDS
        if not (force or due or len(self.pending) >= self.batch):
            return
        batch, self.pending = self.pending, []
        try:
            self.up.commit(record, self.up.claim, self.upload_id, batch)
        except LeaseLost:
            raise
        except ObjManifestError as e:
            self.pending = batch + self.pending
            if force:
                raise
            log.warning("recording parts of %s failed, will retry: %s", self.key, e)
        self.flushed_at = time.monotonic()


# -- cleaning up ---------------------------------------------------------------------------------


def abandon(task: Task, stage: str, file_id: str, epoch: int | None = None) -> str | None:
    """Abort the entry's recorded upload (unless a holder newer than ``epoch`` has it), for
    an entry that is dead or was produced another way. The state is marked aborted first,
    so no holder records parts for it any more; returns the key if an upload was aborted."""
    key = parts_key(task.task_id, stage, file_id)
    codec = UploadCodec(task.task_id, stage, file_id)
    docs = Documents(task.store, task.docs.policy)
    old = docs.commit(key, codec, lambda doc, now: abort(doc, now, epoch))
    if old is None or old.key is None or old.upload_id is None:
        return None
    if not transfer.abort_upload(task.store, old.key, old.upload_id):
        return None  # completed or aborted already
    log.info("%s: aborted the upload of %s", file_id, old.key)
    return old.key


def reject_data(task: Task, entry: Entry) -> None:
    """A consumer found the entry's chunked data bad (or missing): mark its upload so no
    later holder adopts that object back, before the entry is failed."""
    if not entry.is_chunked or entry.key is None or entry.parts_key is None:
        return
    codec = UploadCodec(task.task_id, entry.stage, entry.file_id)
    key = entry.key
    with contextlib.suppress(ObjManifestError):
        Documents(task.store, task.docs.policy).commit(
            entry.parts_key, codec, lambda doc, now: reject(doc, now, key)
        )


def after_lost_lease(task: Task, claim: Claim) -> None:
    """A holder lost its lease: if the entry is dead, nobody will adopt its upload."""
    with contextlib.suppress(ObjManifestError):
        entry = task.shard(claim.stage).entries.get(claim.file_id)
        if entry is None or entry.state is State.dead:
            abandon(task, claim.stage, claim.file_id)


def after_single_put(task: Task, claim: Claim) -> None:
    """An entry made ready as one object: abort an upload an earlier holder left for it."""
    if claim.epoch <= 1:
        return  # nobody held it before: there is no upload to find
    with contextlib.suppress(ObjManifestError):
        abandon(task, claim.stage, claim.file_id, epoch=claim.epoch)


def sweep(task: Task) -> list[str]:
    """Abort the uploads nobody can adopt any more; returns their keys.

    That is the upload of an entry that is dead, gone, or ready with other data, and any
    upload under the task's data that no state records (its starter died before recording
    it) unless its entry is being written now. Any agent may run it at any time.
    """
    aborted: list[str] = []
    recorded: set[tuple[str, str]] = set()
    shards: dict[str, dict[str, Entry]] = {}
    for key in list(task.store.list_keys(f"{task.task_id}/uploads/")):
        doc = _read_state(task, key)
        if doc is None or doc.status != "open" or doc.key is None or doc.upload_id is None:
            continue
        entries = shards.setdefault(doc.stage, _entries(task, doc.stage))
        entry = entries.get(doc.file_id)
        if _adoptable(entry, doc.key):
            recorded.add((doc.key, doc.upload_id))
        elif abandon(task, doc.stage, doc.file_id):
            aborted.append(doc.key)
    for key, upload_id in list(transfer.list_uploads(task.store, f"{task.task_id}/data/")):
        if (key, upload_id) in recorded or _being_written(task, key, shards):
            continue
        if transfer.abort_upload(task.store, key, upload_id):
            aborted.append(key)
    return aborted


def _read_state(task: Task, key: str) -> UploadState | None:
    try:
        blob = task.store.get(key)
    except NotFound:
        return None
    assert blob is not None
    try:
        data = load_json(key, blob.body, STATE_SCHEMA)
        return UploadState.model_validate(data)
    except (ObjManifestError, ValidationError) as e:
        log.warning("skipping %s: %s", key, e)
        return None


def _entries(task: Task, stage: str) -> dict[str, Entry]:
    try:
        return dict(task.shard(stage).entries)
    except NotFound:
        return {}


def _adoptable(entry: Entry | None, key: str) -> bool:
    """May a holder still finish this upload? Not once the entry is dead or has other data."""
    if entry is None or entry.state is State.dead:
        return False
    return entry.state not in (State.ready, State.consumed) or entry.key == key


def _being_written(task: Task, key: str, shards: dict[str, dict[str, Entry]]) -> bool:
    """Is ``TASK/data/STAGE/FILE_ID@EPOCH`` the key of an entry someone holds now?"""
    rest = key[len(f"{task.task_id}/data/") :]
    stage, _, name = rest.partition("/")
    file_id = name.rpartition("@")[0]
    if stage not in task.stages or not file_id:
        return False
    entries = shards.setdefault(stage, _entries(task, stage))
    entry = entries.get(file_id)
    return entry is not None and entry.state is State.writing


# -- downloading --------------------------------------------------------------------------------


def load_parts(task: Task, entry: Entry) -> list[Part]:
    """The entry's part list, checked against its composite checksum.

    ``DataChanged`` if the entry was produced again meanwhile; ``ChecksumMismatch`` if the
    list does not match an unchanged entry.
    """
    assert entry.parts_key is not None and entry.part_size is not None
    problem = _parts_problem(task, entry)
    if isinstance(problem, list):
        return problem
    fresh = task.shard(entry.stage).entries.get(entry.file_id)
    if fresh is None or (fresh.key, fresh.checksum) != (entry.key, entry.checksum):
        raise DataChanged(entry.file_id)
    raise ChecksumMismatch(
        f"{entry.file_id!r}: the part list {task.store.describe(entry.parts_key)} does not "
        f"match the entry: {problem}"
    )


def _parts_problem(task: Task, entry: Entry) -> list[Part] | str:
    assert entry.parts_key is not None and entry.part_size is not None
    doc = _read_state(task, entry.parts_key)
    if doc is None:
        return "it is missing or unreadable"
    parts = list(doc.parts)
    if doc.key != entry.key or doc.part_size != entry.part_size:
        return f"it describes {doc.key} with part size {doc.part_size}"
    if [p[0] for p in parts] != list(range(1, len(parts) + 1)):
        return "its part numbers are not 1..N"
    if any(p[1] != entry.part_size for p in parts[:-1]) or sum(p[1] for p in parts) != entry.size:
        return "its part sizes do not add up to the entry's size"
    if checksum.composite((p[2] for p in parts), entry.part_size) != entry.checksum:
        return "its part digests do not make the entry's checksum"
    return parts


def download(
    task: Task,
    entry: Entry,
    dest: str | os.PathLike[str] | None,
    config: TransferConfig,
    *,
    range_size: int | None = None,
    progress: Progress | None = None,
) -> bytes | Path:
    """Fetch a chunked entry with parallel ranged GETs, verifying each part as it streams.

    With ``dest`` the bytes go to a temporary file beside it (``os.pwrite`` at each part's
    offset) that is moved into place only once every part matched; without, they are
    returned. A part is fetched in ranges of at most ``range_size`` bytes, resuming after a
    broken connection where it stopped; it is verified whole.
    """
    parts = load_parts(task, entry)
    assert entry.key is not None and entry.size is not None
    head = task.store.head(entry.key)
    if head.size != entry.size:
        raise ChecksumMismatch(
            f"{entry.file_id!r}: {task.store.describe(entry.key)} holds {head.size} bytes, "
            f"but the manifest recorded {entry.size}"
        )
    fetch = _Fetch(task.store, entry, parts, config, range_size, progress)
    if dest is None:
        memory = _MemorySink(entry.size)
        fetch.run(memory)
        return bytes(memory.buffer)
    with transfer.temp_beside(dest, entry.size) as (fd, target):
        fetch.run(_FileSink(fd))
    return target


class _MemorySink:
    """Parts written into one buffer, each at its offset."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)

    def write(self, offset: int, data: bytes) -> None:
        self.view[offset : offset + len(data)] = data

    def part_done(self, size: int) -> None:
        pass


class _FileSink:
    """Parts written into a file at their offsets, flushed to disk as they finish (by the
    worker that crossed ``SYNC_EVERY``, while the others keep fetching), so the fsync before
    the file is moved into place has little left to write."""

    SYNC_EVERY = 64 * transfer.MiB

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.unsynced = 0
        self.lock = threading.Lock()
        self.syncing = threading.Lock()

    def write(self, offset: int, data: bytes) -> None:
        transfer.write_all(self.fd, data, offset)

    def part_done(self, size: int) -> None:
        with self.lock:
            self.unsynced += size
            due = self.unsynced >= self.SYNC_EVERY
            if due:
                self.unsynced = 0
        if due and self.syncing.acquire(blocking=False):
            try:
                getattr(os, "fdatasync", os.fsync)(self.fd)
            finally:
                self.syncing.release()


Sink = _MemorySink | _FileSink


class _Fetch:
    """Fetches and verifies parts in parallel; the first failure stops the others."""

    def __init__(
        self,
        store: Store,
        entry: Entry,
        parts: list[Part],
        config: TransferConfig,
        range_size: int | None,
        progress: Progress | None,
    ) -> None:
        assert entry.key is not None and entry.part_size is not None
        self.store, self.entry, self.key, self.parts = store, entry, entry.key, parts
        self.part_size = entry.part_size
        self.range_size = range_size or entry.part_size
        pool = transfer.pool_size(store)
        self.concurrency = max(1, min(config.concurrency, pool, len(parts)))
        self.progress = progress
        self.cancelled = threading.Event()

    def run(self, sink: Sink) -> None:
        done = 0
        with cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="om-fetch") as pool:
            futures = [pool.submit(self._part, part, sink) for part in self.parts]
            try:
                for future in cf.as_completed(futures):
                    done += future.result()
                    if self.progress is not None:
                        self.progress(done, self.entry.size)
            except BaseException:
                self.cancelled.set()
                for future in futures:
                    future.cancel()
                raise

    def _part(self, part: Part, sink: Sink) -> int:
        number, size, expected, _ = part
        cursor = _Cursor(
            start=(number - 1) * self.part_size, end=(number - 1) * self.part_size + size
        )
        tries = 0
        while cursor.position < cursor.end:
            try:
                self._range(cursor, min(cursor.end, cursor.position + self.range_size), sink)
            except (botocore.exceptions.BotoCoreError, OSError, StoreError) as e:
                tries += 1
                if tries >= FETCH_TRIES or self.cancelled.is_set():
                    raise StoreError(
                        f"could not read part {number} of {self.store.describe(self.key)} "
                        f"after {tries} tries: {e}"
                    ) from e
                log.info(
                    "part %d of %s broke off at byte %d, resuming: %s",
                    number,
                    self.key,
                    cursor.position,
                    e,
                )
        if cursor.digest.hexdigest() != expected:
            raise ChecksumMismatch(
                f"{self.entry.file_id!r}: part {number} of {len(self.parts)} (bytes "
                f"{cursor.start}-{cursor.end - 1}) of {self.store.describe(self.key)} has xxh3 "
                f"{cursor.digest.hexdigest()}, but the manifest recorded {expected}"
            )
        sink.part_done(size)
        return size

    def _range(self, cursor: _Cursor, end: int, sink: Sink) -> None:
        """Stream ``[cursor.position, end)`` into the part's digest and the sink; the cursor
        keeps what arrived, so a broken connection resumes where it stopped."""
        with contextlib.closing(self.store.open(self.key, (cursor.position, end))) as body:
            while cursor.position < end:
                if self.cancelled.is_set():
                    raise _Cancelled()
                chunk = body.read(min(transfer.READ_CHUNK, end - cursor.position))
                if not chunk:
                    raise ChecksumMismatch(
                        f"{self.entry.file_id!r}: {self.store.describe(self.key)} ended at byte "
                        f"{cursor.position}, before the recorded {self.entry.size} bytes"
                    )
                cursor.digest.update(chunk)
                sink.write(cursor.position, chunk)
                cursor.position += len(chunk)


@dataclass
class _Cursor:
    """How far one part has arrived, and the digest of what arrived."""

    start: int
    end: int
    position: int = -1
    digest: Any = field(default_factory=xxhash.xxh3_128)

    def __post_init__(self) -> None:
        if self.position < 0:
            self.position = self.start


class _Cancelled(ObjManifestError):
    """Another part failed first; this one stopped."""
