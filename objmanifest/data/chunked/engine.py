"""The upload engine: a chunked entry's data as a multipart upload that outlives its producer.

Data above the threshold goes to the holder's data key as an S3 multipart upload; its
progress is recorded in the upload state (``state.py``).

* A new holder with the same source **adopts** the upload: a part is done when the store
  lists the recorded ETag and the recorded xxh3 equals the xxh3 of its own bytes for that
  part; the rest is sent again, with the recorded part size.
* Completion names the exact part ETags and is create-only. The object's ETag is then
  checked against the ETag those parts imply, since some stores answer 200 to a completion
  that did nothing. An object completed by someone else is adopted only if it is exactly
  the holder's own bytes part for part; otherwise the holder starts a new upload at a new
  key. So the object a ready entry points at holds the bytes of the holder that made it
  ready, and a fenced holder never makes it ready (``changes.finish`` checks the epoch).
* The whole source is hashed in order while the parts go up (``transfer.InOrder``): the
  entry records that xxh3-128 (``whole_checksum``) beside the composite of the parts, and
  the seal binds it to the upload in the upload state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...cas.policy import Command
from ...core import checksum
from ...core.model import Claim, Stored
from ...errors import LeaseLost, ObjManifestError, SourceChanged, StoreError
from ...store import Head, ObjectStore, completed_from
from ...store.errors import (
    NoSuchObject,
    OutcomeUnknown,
    PartsRejected,
    PreconditionFailed,
    UploadGone,
)
from .. import transfer
from ..errors import PartDiffers, RestartUpload
from ..sources import PartSource
from ..transfer import InOrder, Progress, TransferConfig
from .pump import Pump, UploadStats
from .scope import Scope
from .state import Begin, Part, Seal, TakeOver, UploadCodec, UploadState

log = logging.getLogger(__name__)

COMPLETE_ROUNDS = 3


def upload(
    scope: Scope,
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
    return Upload(scope, claim, source, config, explicit_part_size, progress, stop).run()


def head_or_none(store: ObjectStore, key: str) -> Head | None:
    """The object's head, or None if there is no object (other faults are raised)."""
    try:
        return store.head(key)
    except NoSuchObject:
        return None


@dataclass
class Upload:
    """One holder's chunked put: adopt the recorded upload, or start anew, then complete."""

    scope: Scope
    claim: Claim
    source: PartSource
    config: TransferConfig
    explicit: bool
    progress: Progress | None
    stop: Callable[[], None]
    stats: UploadStats = field(default_factory=UploadStats)

    def __post_init__(self) -> None:
        claim, scope = self.claim, self.scope
        self.store = scope.store
        self.runtime = scope.store.runtime
        self.state_key = scope.layout.upload_state(claim.stage, claim.file_id)
        self.codec = UploadCodec(claim.task_id, claim.stage, claim.file_id, scope.schema)
        # A cache of its own: a big part list must not stay in the task's cache for good.
        self.docs = scope.docs.detached()
        self.concurrency = max(1, min(self.config.concurrency, self.store.connections))
        self.done_bytes = 0
        self.whole = InOrder(self.source.read_at)
        """The whole source's xxh3-128, hashed in order as parts finish (by every pump)."""
        self.working: tuple[str, str] | None = None
        """(key, upload id) of the upload this holder is sending, once the state records it."""

    def advance(self, size: int) -> None:
        self.done_bytes += size
        if self.progress is not None:
            self.progress(self.done_bytes, self.source.size)

    def commit(self, command: Command[UploadState, UploadState]) -> UploadState:
        return self.docs.commit(self.state_key, self.codec, command)

    # -- the plan: adopt, or start anew ----------------------------------------------------

    def run(self) -> tuple[Stored, UploadStats]:
        try:
            return self._run()
        except LeaseLost:
            self._abort_if_replaced()
            raise

    def _abort_if_replaced(self) -> None:
        """Fenced: the upload this holder was sending stays if the upload state still
        records it (the next holder adopts it); if another upload replaced it, nobody can
        ever finish it, so it is aborted now rather than left to a sweep."""
        if self.working is None:
            return
        key, upload_id = self.working
        try:
            doc = self.docs.read(self.state_key, self.codec)
        except ObjManifestError as e:
            log.warning("could not read %s to clean up after a lost lease: %s", self.state_key, e)
            return
        if (doc.key, doc.upload_id, doc.status) == (key, upload_id, "open"):
            return
        log.info("%s: the upload %s was replaced; aborting it", self.claim.file_id, upload_id)
        self._abort_own(key, upload_id)

    def _run(self) -> tuple[Stored, UploadStats]:
        self.scope.held(self.claim)
        doc = self.docs.read(self.state_key, self.codec)
        parts: list[Part] | None = None
        if doc.status == "open" and doc.upload_id and self.source.seekable:
            doc = self.commit(TakeOver(self.claim))
            if doc.key is not None and doc.upload_id is not None:
                self.working = (doc.key, doc.upload_id)
            parts = self._adopt(doc)
        for attempt in range(COMPLETE_ROUNDS):
            if parts is not None:
                return self._stored(doc, parts), self.stats
            if attempt and not self.source.seekable:
                break  # a stream cannot be read again
            self.scope.held(self.claim)  # a fenced holder stops here, before starting anew
            doc, parts = self._fresh(doc)
        if parts is not None:
            return self._stored(doc, parts), self.stats
        raise StoreError(
            f"{self.store.describe(doc.key or self.state_key)}: the upload could not be "
            "completed as sent (another holder's object is there, or the upload vanished); "
            "fail() this claim and produce the entry again"
        )

    def _stored(self, doc: UploadState, parts: list[Part]) -> Stored:
        assert doc.key is not None and doc.part_size is not None
        digest = checksum.composite((p[2] for p in parts), doc.part_size)
        size = sum(p[1] for p in parts)
        return Stored(doc.key, digest, size, doc.part_size, self.state_key, self._whole(size))

    def _whole(self, size: int) -> str | None:
        """The whole source's checksum: hashed as the parts finished, or (a part the pump
        never saw, which should not happen) in one sequential pass now."""
        whole = self.whole.checksum(size)
        if whole is None and self.source.seekable:
            self.whole.done(0, size)
            whole = self.whole.checksum(size)
        return whole

    def _adopt(self, doc: UploadState) -> list[Part] | None:
        """Finish the recorded upload; None if it cannot be (start anew instead)."""
        assert doc.key is not None and doc.upload_id is not None and doc.part_size
        size = self.source.size
        assert size is not None  # only a seekable source adopts
        if transfer.part_count(size, doc.part_size) > transfer.MAX_PARTS:
            return None
        try:
            listed = self.store.list_parts(doc.key, doc.upload_id)
        except UploadGone:
            return self._adopt_completed(doc)
        candidates = {p[0]: p for p in doc.parts if p[3] in listed.get(p[0], {})}
        log.info("%s: adopting %s (%d parts recorded)", self.claim.file_id, doc.key, len(doc.parts))
        try:
            return self._send_and_complete(doc, candidates)
        except RestartUpload:
            return None

    def _adopt_completed(self, doc: UploadState) -> list[Part] | None:
        """An object completed by an earlier holder: kept only if it is exactly our bytes."""
        assert doc.key is not None and doc.part_size is not None
        head = head_or_none(self.store, doc.key)
        parts = list(doc.parts)
        if head is None or not parts:
            return None
        numbers_ok = [p[0] for p in parts] == list(range(1, len(parts) + 1))
        made = completed_from(head, doc.upload_id or "", [p[3] for p in parts])
        if not numbers_ok or made is not True:
            return None
        if head.size != self.source.size or sum(p[1] for p in parts) != head.size:
            return None
        try:
            Pump(self, doc, {p[0]: p for p in parts}, verify_only=True).run([p[0] for p in parts])
        except PartDiffers:
            return None
        log.info("%s: adopting the completed object %s", self.claim.file_id, doc.key)
        return parts

    def _fresh(self, doc: UploadState) -> tuple[UploadState, list[Part] | None]:
        """Start a new upload in place of whatever was recorded, and send everything."""
        part_size = transfer.part_size_for(self.source.size, self.config, self.explicit)
        key = self._new_key(doc)
        upload_id = self.store.create_upload(key)
        self.stats.uploads_started += 1
        self.done_bytes = 0
        try:
            doc, replaced = self.docs.commit(
                self.state_key,
                self.codec,
                Begin(self.claim, key, upload_id, part_size, self.source.size),
            )
        except BaseException:
            self._abort_own(key, upload_id)
            raise
        self.working = (key, upload_id)
        self._retire(replaced, keep=key)
        try:
            return doc, self._send_and_complete(doc, {})
        except RestartUpload:
            return doc, None

    def _abort_own(self, key: str, upload_id: str) -> None:
        """Abort an upload no upload state records: nobody else can find it."""
        try:
            self.store.abort_upload(key, upload_id)
        except ObjManifestError as e:
            log.warning(
                "could not abort the unrecorded upload %s of %s (sweep will): %s",
                upload_id,
                self.store.describe(key),
                e,
            )

    def _new_key(self, doc: UploadState) -> str:
        """The claim's epoch names the key; a second upload in one epoch gets ``~N``."""
        c = self.claim
        base = self.scope.layout.data(c.stage, c.file_id, c.epoch)
        attempt = self.scope.layout.attempt_of(doc.key, base) if doc.key else None
        return base if attempt is None else self.scope.layout.beside(base, str(attempt + 1))

    def _retire(self, old: UploadState, keep: str) -> None:
        """Abort the upload a new one replaces, and remove an object it completed: no entry
        points at it (ours is held by us, and a rejected one has no data any more)."""
        if old.key is None or old.key == keep:
            return
        try:
            if old.upload_id and old.status == "open":
                self.store.abort_upload(old.key, old.upload_id)
            if head_or_none(self.store, old.key) is not None:
                self.store.delete(old.key)
                log.info("%s: removed %s, replaced by %s", self.claim.file_id, old.key, keep)
        except ObjManifestError as e:
            log.warning(
                "could not retire the replaced upload %s (sweep will): %s",
                self.store.describe(old.key),
                e,
            )

    # -- sending and completing ---------------------------------------------------------------

    def _send_and_complete(self, doc: UploadState, candidates: dict[int, Part]) -> list[Part]:
        results = Pump(self, doc, candidates).run(None)
        self.source.check_unchanged()
        parts = [results[n] for n in sorted(results)]
        if [p[0] for p in parts] != list(range(1, len(parts) + 1)):
            raise StoreError(f"internal error: parts {sorted(results)} are not contiguous")
        assert doc.upload_id is not None
        whole = self._whole(sum(p[1] for p in parts))
        for _ in range(COMPLETE_ROUNDS):
            self.stop()
            # fences older holders
            doc = self.commit(Seal(self.claim, doc.upload_id, parts, whole))
            if self._complete(doc, parts):
                return parts
            self._resend_rejected(doc, parts)
        raise RestartUpload()

    def _complete(self, doc: UploadState, parts: list[Part]) -> bool:
        """True once ``doc.key`` holds exactly ``parts``; False if some ETag was rejected
        (send again); ``RestartUpload`` if the key holds other bytes or the upload vanished."""
        assert doc.key is not None and doc.upload_id is not None
        etags = [p[3] for p in parts]
        answered = False
        for _ in range(COMPLETE_ROUNDS):
            try:
                self.store.complete_upload(doc.key, doc.upload_id, etags)
                answered = True
            except PartsRejected:
                return False
            except (PreconditionFailed, UploadGone):
                pass
            except OutcomeUnknown:
                if head_or_none(self.store, doc.key) is None:
                    continue  # not applied: complete again
            break
        head = head_or_none(self.store, doc.key)
        if head is None:
            log.warning("%s: upload %s vanished before completion", self.claim.file_id, doc.key)
            raise RestartUpload()
        size = sum(p[1] for p in parts)
        made = completed_from(head, doc.upload_id, etags)
        ours = head.size == size and (made if made is not None else answered)
        if not ours:
            log.warning(
                "%s: %s holds other bytes (ETag %s, not the completion of upload %s); "
                "starting a new upload",
                self.claim.file_id,
                self.store.describe(doc.key),
                head.etag,
                doc.upload_id,
            )
            raise RestartUpload()
        return True

    def _resend_rejected(self, doc: UploadState, parts: list[Part]) -> None:
        """Send again the parts whose ETag the store no longer has (a fenced holder replaced
        them on a store that keeps one upload per part number)."""
        assert doc.key is not None and doc.upload_id is not None
        whole = self._whole(sum(p[1] for p in parts))
        self.commit(Seal(self.claim, doc.upload_id, parts, whole))  # a fenced holder stops here
        try:
            listed = self.store.list_parts(doc.key, doc.upload_id)
        except UploadGone:
            raise RestartUpload() from None
        missing = [p[0] for p in parts if p[3] not in listed.get(p[0], {})]
        resent = Pump(self, doc, {}, record_parts=False).run(missing)
        for number in missing:
            if resent[number] != parts[number - 1]:
                raise SourceChanged(
                    f"part {number} of {self.source.name} changed while it was uploaded; "
                    "upload a file that is no longer being written"
                )
