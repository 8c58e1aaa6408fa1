"""A chunked entry's upload state: the model, its codec, and its pure, named changes.

``TASK/uploads/STAGE/FILE_ID.json`` records one entry's multipart upload (key, upload id,
part size) and, for every finished part, its number, size, xxh3 and ETag; once sealed, the
xxh3-128 of the whole source, for that upload. Holders change
it only through the CAS loop, in batches, so the stage shard stays small however many
parts there are.

Every change names the holder's epoch; one from an older epoch is refused (``LeaseLost``),
so once a new holder has taken the state over, a fenced one cannot touch it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from ...cas.codecs import UPLOAD_REPAIR, VersionedCodec
from ...core.commands import ByHolder
from ...core.commit_events import Change
from ...core.layout import TaskLayout
from ...core.model import SCHEMA_VERSION, Claim, Journaled
from ...errors import CorruptShard, LeaseLost, ObjManifestError
from ...store import ObjectStore, get_if_any

log = logging.getLogger(__name__)

STATE_SCHEMA = SCHEMA_VERSION

Part = tuple[int, int, str, str]
"""(number, size, xxh3-128 hex, bare ETag) of one finished part."""

Status = Literal["none", "open", "aborted"]


class UploadState(Journaled):
    """``uploads/STAGE/FILE_ID.json``: one entry's multipart upload and its finished parts."""

    task_id: str
    stage: str
    file_id: str
    epoch: int = 0
    """The epoch of the holder that last took the upload over; older ones are refused."""
    owner: str | None = None
    status: Status = "none"
    key: str | None = None
    upload_id: str | None = None
    part_size: int | None = None
    size: int | None = None
    """The source's size; None for a stream."""
    parts: tuple[Part, ...] = ()
    whole: tuple[str, str] | None = None
    """(upload id, xxh3-128 checksum of all the bytes in order), set by the seal of that
    upload (by releases from 0.3.0 on). A consumer checks the entry's ``whole_checksum`` only
    when this names the upload the state records: a release before 0.3.0 that produced the
    entry again left the entry's value from an earlier upload, and this names that one."""
    updated_at: datetime | None = None

    def with_parts(self, parts: Iterable[Part]) -> tuple[Part, ...]:
        merged = {p[0]: p for p in self.parts}
        merged.update((p[0], p) for p in parts)
        return tuple(merged[n] for n in sorted(merged))


@dataclass(frozen=True)
class UploadCodec(VersionedCodec[UploadState]):
    """How the CAS loop reads, writes and stamps an upload-state object."""

    model = UploadState
    schema: ClassVar[int] = STATE_SCHEMA
    what: ClassVar[str] = "upload state"
    repair: ClassVar[str] = UPLOAD_REPAIR

    task_id: str
    stage: str
    file_id: str
    writes: int = STATE_SCHEMA

    def check(self, key: str, doc: UploadState) -> None:
        if (doc.task_id, doc.stage, doc.file_id) != (self.task_id, self.stage, self.file_id):
            raise CorruptShard(key, f"describes {doc.task_id}/{doc.stage}/{doc.file_id}")

    def empty(self) -> UploadState:
        return UploadState(
            task_id=self.task_id,
            stage=self.stage,
            file_id=self.file_id,
            schema_version=self.writes,
        )

    def transitions(self, before: UploadState, after: UploadState) -> list[Change]:
        return [
            Change(
                item=after.file_id,
                before=before.status if before.version else None,
                after=after.status,
                epoch=after.epoch,
            )
        ]


def read_state(store: ObjectStore, layout: TaskLayout, key: str) -> UploadState | None:
    """The upload state at ``key``; None if there is none, or it does not parse (logged:
    a reader treats an unreadable part list as bad data, the sweep skips it)."""
    parsed = layout.parse(key)
    if parsed.kind != "upload" or parsed.stage is None or parsed.file_id is None:
        log.warning("%s is not an upload state of task %s", store.describe(key), layout.task_id)
        return None
    codec = UploadCodec(layout.task_id, parsed.stage, parsed.file_id)
    blob = get_if_any(store, key)
    if blob is None:
        return None
    try:
        return codec.decode(key, blob.body)
    except ObjManifestError as e:
        log.warning("unreadable upload state %s: %s", store.describe(key), e)
        return None


# -- pure changes ------------------------------------------------------------------------------


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
            "whole": None,
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
    doc: UploadState,
    now: datetime,
    claim: Claim,
    upload_id: str,
    parts: Sequence[Part],
    whole: str | None = None,
) -> tuple[UploadState | None, UploadState]:
    """The final part list, exactly the parts completion will name (nothing more), and the
    whole source's checksum for this upload."""
    _holds(doc, claim, upload_id)
    exact = tuple(sorted(parts))
    bound = (upload_id, whole) if whole is not None else None
    if doc.parts == exact and doc.whole == bound:
        return None, doc
    new = doc.model_copy(update={"parts": exact, "whole": bound, "updated_at": now})
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


# -- the named commands --------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin(ByHolder):
    """A holder starts a new upload in place of whatever was recorded."""

    name: ClassVar[str] = "upload.begin"
    key: str
    upload_id: str
    part_size: int
    size: int | None

    def apply(
        self, doc: UploadState, now: datetime
    ) -> tuple[UploadState, tuple[UploadState, UploadState]]:
        return begin(doc, now, self.claim, self.key, self.upload_id, self.part_size, self.size)


@dataclass(frozen=True)
class TakeOver(ByHolder):
    """A new holder takes the recorded upload over, to adopt its parts."""

    name: ClassVar[str] = "upload.take_over"

    def apply(self, doc: UploadState, now: datetime) -> tuple[UploadState | None, UploadState]:
        return take_over(doc, now, self.claim)


@dataclass(frozen=True)
class Record(ByHolder):
    """A batch of finished parts is recorded."""

    name: ClassVar[str] = "upload.record"
    upload_id: str
    parts: Sequence[Part]

    def apply(self, doc: UploadState, now: datetime) -> tuple[UploadState, UploadState]:
        return record(doc, now, self.claim, self.upload_id, self.parts)


@dataclass(frozen=True)
class Seal(ByHolder):
    """The final part list, just before completion."""

    name: ClassVar[str] = "upload.seal"
    upload_id: str
    parts: Sequence[Part]
    whole: str | None = None

    def apply(self, doc: UploadState, now: datetime) -> tuple[UploadState | None, UploadState]:
        return seal(doc, now, self.claim, self.upload_id, self.parts, self.whole)


@dataclass(frozen=True)
class Abort:
    """Nobody will finish this upload: mark it aborted (then abort it in the store)."""

    name: ClassVar[str] = "upload.abort"
    epoch: int | None
    actor: str = ""

    def apply(
        self, doc: UploadState, now: datetime
    ) -> tuple[UploadState | None, UploadState | None]:
        return abort(doc, now, self.epoch)


@dataclass(frozen=True)
class Reject:
    """A consumer found the completed object bad: never adopt it back."""

    name: ClassVar[str] = "upload.reject"
    key: str
    actor: str = ""

    def apply(self, doc: UploadState, now: datetime) -> tuple[UploadState | None, bool]:
        return reject(doc, now, self.key)
