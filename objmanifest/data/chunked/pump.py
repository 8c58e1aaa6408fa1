"""The part pump: reads, hashes and sends parts with a bounded pool, and records them.

At most ``concurrency`` parts are in flight, so at most that many in memory (a part
streamed from a file is never held whole). Finished parts are recorded in the upload
state in batches by the calling thread: about 1/64 of the upload at a time (at least
``concurrency``), or whatever finished once ``FLUSH_SECONDS`` passed.

A part carries no digest header (streamed from a file, that would need a second read), so
its MD5 is computed while it streams and compared with the ETag the store answers (the
part's MD5 on S3 and the stores tested): a part damaged on its way is sent again. The
calling thread also hashes the whole source in order as parts finish (``InOrder``), for
the entry's ``whole_checksum``.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ...cas.policy import Command
from ...core import checksum
from ...core.model import Claim
from ...core.runtime import Runtime
from ...errors import InvalidInput, LeaseLost, ObjManifestError, SourceChanged, StoreError
from ...store import ObjectStore, PartBody
from ...store.errors import UploadGone
from .. import transfer
from ..errors import PartDiffers, RestartUpload
from ..sources import PartReader, PartSource
from ..transfer import InOrder
from .state import Part, Record, UploadState

log = logging.getLogger(__name__)

FLUSH_SECONDS = 2.0
"""Longest time finished parts wait before their batch is recorded."""
BATCHES = 64
"""Parts are recorded in batches of about 1/64 of the upload (at least ``concurrency``), so
the state object, which grows with the parts, is rewritten a bounded number of times."""
PART_SENDS = 3
"""How often, in all, a part whose ETag is not the MD5 of what was sent is sent."""


@dataclass
class UploadStats:
    """What one chunked put did: parts adopted from an earlier holder, parts sent."""

    parts_adopted: int = 0
    bytes_adopted: int = 0
    parts_sent: int = 0
    bytes_sent: int = 0
    uploads_started: int = 0
    parts_resent: int = 0
    """Parts sent again because the store's ETag was not the MD5 of what was sent."""


class Sender(Protocol):
    """What the pump needs of the upload it works for."""

    store: ObjectStore
    runtime: Runtime
    claim: Claim
    source: PartSource
    concurrency: int
    stats: UploadStats
    whole: InOrder

    def stop(self) -> None:
        """Raise ``LeaseLost`` once the lease is known to be lost, ``Interrupted`` once the
        caller asked the put to stop."""
        ...

    def advance(self, size: int) -> None: ...
    def commit(self, command: Command[UploadState, UploadState]) -> UploadState: ...


class Pump:
    """Sends (or, ``verify_only``, compares) the parts of one upload."""

    def __init__(
        self,
        up: Sender,
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
        self._stats_lock = threading.Lock()
        self.flushed_at = up.runtime.monotonic()
        size = up.source.size
        total = transfer.part_count(size, self.part_size) if size is not None else 0
        self.batch = max(up.concurrency, math.ceil(total / BATCHES))

    def run(self, numbers: list[int] | None) -> dict[int, Part]:
        """Send ``numbers`` (None: every part of the source); part number -> part."""
        plan = iter(self._plan(numbers))
        inflight: set[cf.Future[tuple[Part, bool]]] = set()
        pool = self.up.runtime.pool(self.up.concurrency, "om-part")
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
                self._keep_for_next_holder()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return self.results

    def _keep_for_next_holder(self) -> None:
        """Record what was sent before a failure, so the next holder adopts it."""
        try:
            self._flush(force=True)
        except ObjManifestError as e:
            log.warning("could not record the sent parts of %s: %s", self.key, e)

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
                raise InvalidInput(
                    f"the stream is longer than {transfer.MAX_PARTS} parts of {step} bytes; "
                    "pass a larger part_size (525 MiB reaches S3's 5 TiB limit)"
                )
            self.up.whole.feed(offset, body)
            yield number, offset, len(body), body
            if len(body) < step:
                return
            number, offset = number + 1, offset + len(body)

    def _part(self, number: int, offset: int, length: int, body: bytes | None) -> tuple[Part, bool]:
        """Runs in a worker: send the part streamed from the file and hashed as it goes; or,
        for a part that may be adopted (or a source that cannot stream), read and hash it,
        then send it unless it is the recorded part."""
        up = self.up
        known = self.candidates.get(number)
        reader = None
        if body is None and known is None and not self.verify_only:
            reader = up.source.open_part(offset, length)
        if reader is not None:
            try:
                etag = self._send(number, reader)
            finally:
                up.source.check_unchanged()  # else the passes may have read other bytes
            return (number, length, reader.digest(), etag), True
        data = body if body is not None else up.source.read_at(offset, length)
        if len(data) != length:
            raise SourceChanged(
                f"{up.source.name} ended early at part {number} (expected {length} bytes "
                f"at offset {offset}, read {len(data)}); upload a file that is not being written"
            )
        digest = checksum.part_hex(data)
        if known is not None and known[1] == length and known[2] == digest:
            return known, False
        if self.verify_only:
            raise PartDiffers(number)
        etag = self._send(number, data)
        return (number, length, digest, etag), True

    def _send(self, number: int, body: PartBody) -> str:
        """Send a part until the store's ETag for it is the MD5 of what was sent (the part
        arrived as it left); an ETag that is not an MD5 at all is taken as it is."""
        etag = ""
        sent = ""
        for attempt in range(PART_SENDS):
            etag = self.up.store.upload_part(self.key, self.upload_id, number, body)
            if isinstance(body, PartReader):
                sent = body.md5_hex()
            elif isinstance(body, bytes) and not sent:
                sent = hashlib.md5(body, usedforsecurity=False).hexdigest()
            if etag == sent or not checksum.is_md5(etag):
                return etag
            log.warning(
                "part %d of %s arrived damaged (ETag %s, sent MD5 %s); sending it again",
                number,
                self.up.store.describe(self.key),
                etag,
                sent,
            )
            if attempt + 1 < PART_SENDS:
                with self._stats_lock:
                    self.up.stats.parts_resent += 1
        raise StoreError(
            f"part {number} of {self.up.store.describe(self.key)} arrived other than it was sent "
            f"{PART_SENDS} times (the store's ETag {etag} is not the MD5 {sent} of the part): "
            "something between this machine and the store corrupts data, or the store's part "
            "ETags are not MD5s (SSE-KMS), which chunked uploads need"
        )

    def _drain(self, inflight: set[cf.Future[tuple[Part, bool]]]) -> set[cf.Future[Any]]:
        """Take in the parts that finished (all of them before raising the first error)."""
        done, rest = cf.wait(inflight, timeout=FLUSH_SECONDS, return_when=cf.FIRST_COMPLETED)
        errors = [e for e in (f.exception() for f in done) if e is not None]
        for future in done:
            if future.exception() is None:
                self._finished(*future.result())
        if errors:
            if isinstance(errors[0], UploadGone):
                raise RestartUpload() from errors[0]  # completed or aborted by someone else
            raise errors[0]
        self._flush()
        self.up.stop()
        return rest

    def _finished(self, part: Part, sent: bool) -> None:
        stats = self.up.stats
        self.results[part[0]] = part
        if self.up.source.seekable:
            self.up.whole.done((part[0] - 1) * self.part_size, part[1])
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
        due = self.up.runtime.monotonic() - self.flushed_at >= FLUSH_SECONDS
        if not (force or due or len(self.pending) >= self.batch):
            return
        batch, self.pending = self.pending, []
        try:
            self.up.commit(Record(self.up.claim, self.upload_id, batch))
        except LeaseLost:
            raise
        except ObjManifestError as e:
            self.pending = batch + self.pending
            if force:
                raise
            log.warning("recording parts of %s failed, will retry: %s", self.key, e)
        self.flushed_at = self.up.runtime.monotonic()
