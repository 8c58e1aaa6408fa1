"""A ready or consumed chunked entry's upload state rebuilt from its data.

Readers of a chunked entry take its part list (each part's xxh3 and ETag) from the upload
state. When that state was deleted or damaged, the object itself still holds the parts:
this reads them back one by one, computes each part's xxh3 and MD5, and keeps the list
only if it makes the entry's composite checksum (and, where the state sealed one, its
whole checksum, and the object's multipart ETag where the store gives one). What a repair
writes is a state a reader cannot tell from the one the holder left, but for the upload id
(the completed upload's is gone: ``REBUILT``).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import xxhash

from ...core import checksum
from ...core.model import Entry
from ...core.states import State
from ...store import ObjectStore
from ...store.errors import NoSuchObject
from .. import transfer
from .download import derived
from .state import Part, UploadCodec, UploadState

REBUILT = "rebuilt-by-repair"
"""The upload id of a rebuilt state (the completed upload's own was lost with it)."""


def needs_parts(entry: Entry) -> bool:
    """Whether readers need ``entry``'s upload state: a chunked entry that is ready, or
    consumed with its data kept."""
    return (
        entry.is_chunked
        and entry.parts_key is not None
        and entry.state in (State.ready, State.consumed)
        and entry.data_removed_at is None
    )


def read_parts(store: ObjectStore, entry: Entry) -> tuple[list[Part], str] | str:
    """The part list of ``entry``'s object as its bytes give it, and the whole object's
    xxh3; or why it cannot be had (the object is missing, shorter or longer than recorded,
    or its parts do not make the entry's checksum)."""
    assert entry.key is not None and entry.size is not None and entry.part_size is not None
    where = store.describe(entry.key)
    try:
        head = store.head(entry.key)
    except NoSuchObject:
        return f"its data {where} is missing"
    if head.size != entry.size:
        return f"its data {where} holds {head.size} bytes, not the recorded {entry.size}"
    whole = xxhash.xxh3_128()
    parts: list[Part] = []
    for number, size, _, _ in derived(entry):
        start = (number - 1) * entry.part_size
        digest, md5 = xxhash.xxh3_128(), hashlib.md5(usedforsecurity=False)
        got = 0
        try:
            opened = store.open(entry.key, (start, start + size))
        except NoSuchObject:  # removed since the head
            return f"its data {where} is missing"
        with contextlib.closing(opened) as body:
            while got < size:
                chunk = body.read(min(transfer.READ_CHUNK, size - got))
                if not chunk:
                    return f"its data {where} ended at byte {start + got}"
                digest.update(chunk)
                md5.update(chunk)
                whole.update(chunk)
                got += len(chunk)
        parts.append((number, size, digest.hexdigest(), md5.hexdigest()))
    if checksum.composite((p[2] for p in parts), entry.part_size) != entry.checksum:
        return f"the parts of {where} do not make the entry's checksum {entry.checksum}"
    implied = checksum.multipart_etag(p[3] for p in parts)
    bare = checksum.bare_etag(head.etag)
    if "-" in bare and implied is not None and bare != implied:
        return f"{where} was not completed from these parts (ETag {head.etag})"
    return parts, checksum.PREFIX + whole.hexdigest()


def rebuilt_state(
    codec: UploadCodec, entry: Entry, parts: list[Part], whole: str, version: int
) -> UploadState:
    """The upload state a reader of ``entry`` needs: its parts, its key and part size, the
    holder's epoch, and the whole checksum bound to the rebuilt upload if it matches; at
    ``version`` (the newest its journal saw), so its next version follows on."""
    sealed = (REBUILT, whole) if entry.whole_checksum == whole else None
    return codec.empty().model_copy(
        update={
            "epoch": entry.epoch,
            "owner": entry.owner,
            "status": "open",
            "key": entry.key,
            "upload_id": REBUILT,
            "part_size": entry.part_size,
            "size": entry.size,
            "parts": tuple(parts),
            "whole": sealed,
            "updated_at": entry.updated_at,
            "version": version,
        }
    )


@dataclass(frozen=True)
class RebuildUpload:
    """A rebuilt upload state in place of a deleted or corrupt one; nothing to write if a
    sound state is there by now (someone wrote one meanwhile)."""

    rebuilt: UploadState
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(self, doc: UploadState, now: datetime) -> tuple[UploadState | None, bool]:
        if doc.version or doc.status != "none":
            return None, False
        return self.rebuilt, True


__all__ = ["REBUILT", "RebuildUpload", "needs_parts", "read_parts", "rebuilt_state"]
