"""The engine's own named commits: a header or any journaled object migrated to the current
schema, and declarations written into (or mended in) the dependency index."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Generic, Protocol, TypeVar

import shard_index

from ..cas.codecs import (
    index_error,
)
from ..cas.policy import Codec
from ..core.model import (
    Declaration,
    TaskHeader,
)
from ..errors import (
    DeclarationConflict,
)

D = TypeVar("D")


class Migratable(Codec[D], Protocol[D]):
    """A codec whose objects can be moved to a newer schema version."""

    def schema_of(self, doc: D) -> int: ...
    def migrated(self, doc: D, schema_version: int) -> D: ...


@dataclass(frozen=True)
class MigrateHeader:
    """The task header at a newer schema version (and the release that reads it)."""

    schema_version: int
    requires: str
    name: ClassVar[str] = "migrate"
    actor: ClassVar[str] = ""

    def apply(self, doc: TaskHeader, now: datetime) -> tuple[TaskHeader | None, TaskHeader]:
        if doc.schema_version >= self.schema_version:
            return None, doc
        moved = doc.model_copy(
            update={"schema_version": self.schema_version, "requires": self.requires}
        )
        return moved, moved


@dataclass(frozen=True)
class Migrate(Generic[D]):
    """A manifest object at a newer schema version; nothing to write if it is there."""

    codec: Migratable[D]
    schema_version: int
    name: ClassVar[str] = "migrate"
    actor: ClassVar[str] = ""

    def apply(self, doc: D, now: datetime) -> tuple[D | None, bool]:
        if self.codec.schema_of(doc) >= self.schema_version:
            return None, False
        return self.codec.migrated(doc, self.schema_version), True


def refuse_twice(batch: list[Declaration]) -> None:
    """One batch may name an id twice only with the same declaration."""
    first: dict[str, Declaration] = {}
    for decl in batch:
        seen = first.setdefault(decl.file_id, decl)
        if seen != decl:
            diffs = [
                f"{name}: {getattr(seen, name)!r} vs {getattr(decl, name)!r}"
                for name in ("stage", "depends_on", "consumers")
                if getattr(seen, name) != getattr(decl, name)
            ]
            raise DeclarationConflict(
                f"the batch declares {decl.file_id!r} twice, differently ({'; '.join(diffs)}); "
                "nothing was declared. Keep one of them."
            )


class DeclareInIndex:
    """The index's half of a declaration: every file id, its stage and dependencies."""

    name: ClassVar[str] = "declare"
    actor: ClassVar[str] = ""

    def __init__(self, batch: list[Declaration]) -> None:
        self.tuples = [(d.file_id, d.stage, d.depends_on) for d in batch]

    def apply(
        self, index: shard_index.ShardIndex, now: datetime
    ) -> tuple[shard_index.ShardIndex | None, None]:
        try:
            new = index.declare_many(self.tuples)
        except shard_index.ShardIndexError as e:
            raise index_error(e) from None
        return (None if new is index else new), None


class RepairIndex(DeclareInIndex):
    """Put entries the shards hold back into the index (file id, stage, dependencies)."""

    name: ClassVar[str] = "repair_index"

    def __init__(self, tuples: list[tuple[str, str, tuple[str, ...]]]) -> None:
        self.tuples = tuples
