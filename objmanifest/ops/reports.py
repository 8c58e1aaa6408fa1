"""What a repair found and did, object by object: the report Task.repair returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..core.plain import fields_json

Damage = Literal["deleted", "corrupt", "newer"]


Action = Literal[
    "restored",
    "would restore",
    "rebuilt",
    "would rebuild",
    "left alone",
    "recorded as lost",
    "would record as lost",
]
"""``restored``: put back exactly as a version the store kept holds it; ``rebuilt``: made
again from what else there is (the journal, the shards, the data)."""


Source = Literal["version", "journal", "shards", "data", ""]
"""Where a repaired object came from: a version the store kept (``restored``), else its
journal (a shard, a journal block its object still carries, an archive object), the shards
(the index) or the data (an upload state); "" for what is not put back from anything (a
retention marker written again empty, a block recorded as lost)."""


Kind = Literal[
    "shard", "index", "journal block", "upload state", "retention marker", "archive object"
]


@dataclass(frozen=True)
class RestoredEntry:
    """One entry of a rebuilt shard: what the journal last saw, what it was rebuilt as, and
    which of its fields could not be restored."""

    file_id: str
    state: str
    epoch: int
    seen_state: str | None
    """The last state its records gave it; None if only the index knew it."""
    seen_epoch: int | None
    rule: str
    """Why it has this state and epoch."""
    lost: tuple[str, ...] = ()
    """Fields that could not be restored (left at their defaults)."""

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class KeptVersion:
    """The version of an object that the store kept (bucket versioning) and repair restored
    it from: the store's id for it, when it was written, its ETag, and the object's own
    version counter there (a shard's or the index's ``version``)."""

    version_id: str
    at: datetime | None
    etag: str
    object_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class ObjectRepair:
    """One manifest object found damaged, and what repair did about it."""

    key: str
    kind: Kind
    damage: Damage
    problem: str
    action: Action
    moved_to: str | None = None
    """Where its bytes were copied before it was replaced (corrupt objects)."""
    records: int = 0
    """Journal records replayed (a shard); the versions a journal block held."""
    journal_complete: bool = False
    """The object's own records were read too: nothing after them can be missing."""
    entries: tuple[RestoredEntry, ...] = ()
    """A shard: every entry it was rebuilt with."""
    indexed: tuple[str, ...] = ()
    """The index: every file id it was rebuilt with."""
    not_restored: tuple[str, ...] = ()
    """What could not be put back, each saying why."""
    source: Source = ""
    """Where it came from (``Source``)."""
    version: KeptVersion | None = None
    """The kept version it was restored from (``source`` ``version``)."""
    versions_note: str = ""
    """Why it was not restored from a kept version, where the store was asked for them
    (none kept, none sound, one older than the journal ...)."""

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class RepairReport:
    """What ``Task.repair`` found and did: each damaged object, and the file ids put back
    into the index (``added``: those a sound index lacked, or every id of a rebuilt one)."""

    task_id: str
    dry_run: bool
    objects: tuple[ObjectRepair, ...] = ()
    added: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """Nothing was damaged."""
        return not self.objects and not self.added

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)
