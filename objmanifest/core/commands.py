"""The named commands that carry the changes of a shard through the commit loop: each names
its actor and applies one pure change of changes to the freshest shard it is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from ..errors import (
    NotClaimable,
    ObjManifestError,
)
from .changes import (
    Lookups,
    Rules,
    archive,
    claim,
    claim_any,
    consume,
    declare,
    drop_archived_data,
    drop_data,
    fail,
    finish,
    finish_many,
    mismatch,
    reap,
    renew,
)
from .model import Claim, Declaration, Entry, Shard, Stored


@dataclass(frozen=True)
class ByHolder:
    """A command the holder of ``claim`` sends: the holder is its actor (and a command's
    own fields follow the claim)."""

    claim: Claim

    @property
    def actor(self) -> str:
        return self.claim.agent


@dataclass(frozen=True)
class Declare:
    """Add declarations to a shard."""

    name: ClassVar[str] = "declare"
    decls: Sequence[Declaration]
    actor: str = ""

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[Entry]]:
        return declare(shard, now, self.decls)


@dataclass(frozen=True)
class ClaimEntry:
    """Claim one named entry (a takeover if its lease expired)."""

    name: ClassVar[str] = "claim"
    file_id: str
    agent: str
    rules: Rules
    lookups: Lookups

    @property
    def actor(self) -> str:
        return self.agent

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, Claim | NotClaimable]:
        return claim(shard, self.file_id, self.agent, now, self.rules, self.lookups(shard))


@dataclass(frozen=True)
class ClaimAny:
    """Claim up to ``limit`` claimable entries of a shard in one commit."""

    name: ClassVar[str] = "claim_many"
    agent: str
    limit: int
    rules: Rules
    lookups: Lookups
    stage: str | None = None

    @property
    def actor(self) -> str:
        return self.agent

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[Claim]]:
        lookup = self.lookups(shard)
        return claim_any(shard, self.agent, self.limit, now, self.rules, lookup, self.stage)


@dataclass(frozen=True)
class Renew(ByHolder):
    """The holder moves its lease forward."""

    name: ClassVar[str] = "renew"
    rules: Rules

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard, Claim]:
        return renew(shard, self.claim, now, self.rules)


@dataclass(frozen=True)
class Finish(ByHolder):
    """The holder's data is stored: the entry becomes ready."""

    name: ClassVar[str] = "finish"
    stored: Stored

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, Entry]:
        s = self.stored
        return finish(
            shard,
            self.claim,
            s.key,
            s.checksum,
            s.size,
            now,
            part_size=s.part_size,
            parts_key=s.parts_key,
            whole_checksum=s.whole_checksum,
        )


@dataclass(frozen=True)
class FinishMany:
    """One agent's data for several entries of a shard is stored: each becomes ready on
    its own, in one commit; a fenced claim's result is its ``LeaseLost``."""

    name: ClassVar[str] = "finish_many"
    finished: Sequence[tuple[Claim, Stored]]
    actor: str

    def apply(
        self, shard: Shard, now: datetime
    ) -> tuple[Shard | None, list[Entry | ObjManifestError]]:
        return finish_many(shard, self.finished, now)


@dataclass(frozen=True)
class Fail(ByHolder):
    """The holder gives the entry up."""

    name: ClassVar[str] = "fail"
    reason: str
    rules: Rules

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard, Entry]:
        return fail(shard, self.claim, self.reason, now, self.rules)


@dataclass(frozen=True)
class Consume:
    """A consumer marks the data it verified."""

    name: ClassVar[str] = "consume"
    file_id: str
    consumer: str
    key: str
    checksum: str
    actor: str

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, Entry]:
        return consume(shard, self.file_id, self.consumer, self.key, self.checksum, now)


@dataclass(frozen=True)
class Mismatch:
    """A consumer found the data bad: the entry is produced again."""

    name: ClassVar[str] = "mismatch"
    file_id: str
    key: str
    checksum: str
    detail: str
    rules: Rules
    actor: str

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, Entry]:
        return mismatch(shard, self.file_id, self.key, self.checksum, self.detail, now, self.rules)


@dataclass(frozen=True)
class Reap:
    """Release every expired lease of a shard."""

    name: ClassVar[str] = "reap"
    rules: Rules
    actor: str = ""

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[Entry]]:
        return reap(shard, now, self.rules)


@dataclass(frozen=True)
class DropData:
    """gc marks consumed entries past their retention as having no data any more."""

    name: ClassVar[str] = "drop-data"
    wanted: dict[str, str]
    before: datetime
    actor: str = "gc"

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[Entry]]:
        return drop_data(shard, self.wanted, self.before, now)


@dataclass(frozen=True)
class DropArchivedData:
    """gc marks archived consumed entries past their retention as having no data any more."""

    name: ClassVar[str] = "drop-data"
    wanted: tuple[str, ...]
    actor: str = "gc"

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[str]]:
        return drop_archived_data(shard, self.wanted, now)


@dataclass(frozen=True)
class Archive:
    """Archiving: entries already written to an archive object leave the live shard."""

    name: ClassVar[str] = "archive"
    archive_id: str
    entries: dict[str, Entry]
    actor: str = ""

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, list[str]]:
        return archive(shard, self.archive_id, self.entries)
