"""How each kind of manifest object is read, written and stamped for the CAS loop.

A shard and an upload state are pydantic documents with a schema version, a version counter
and their last commit ids (``VersionedCodec``); the index is ``shard_index``'s own strict
JSON. Decoding refuses what does not parse (``CorruptShard``) and what a newer objmanifest
wrote (``UnsupportedSchema``), so neither is ever overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

import shard_index

from .errors import CorruptShard, DeclarationConflict, DependencyCycle, UnsupportedSchema
from .events import Transition
from .model import COMMITS_KEPT, SCHEMA_VERSION, Shard

SHARD_REPAIR = (
    "delete it and declare its entries again (`objmanifest status` lists them as declared "
    "but not yet in their shard)"
)
INDEX_REPAIR = (
    "delete it and run `objmanifest repair` (Task.repair_index()), which rebuilds it from "
    "the shards"
)
HEADER_REPAIR = "delete it and run `objmanifest init` again with the task's stages and settings"
UPLOAD_REPAIR = "delete it: the entry's next holder then starts its upload anew"


def schema_problems(e: ValidationError) -> str:
    """The first few problems of a pydantic report, without the (possibly huge) input."""
    found = [
        f"{'.'.join(str(p) for p in err['loc']) or 'the object'}: {err['msg']}"
        for err in e.errors()[:3]
    ]
    more = e.error_count() - len(found)
    return "; ".join(found) + (f"; and {more} more" if more > 0 else "")


def load_json(key: str, body: bytes, supported: int) -> dict[str, Any]:
    """A JSON object with a supported ``schema_version`` (1 up to ``supported``)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise CorruptShard(key, "not JSON: it is not UTF-8 text") from None
    except ValueError as e:
        raise CorruptShard(key, f"not JSON: {e}") from None
    if not isinstance(data, dict):
        raise CorruptShard(key, "not a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptShard(key, "no integer schema_version")
    if version < 1:
        raise CorruptShard(key, f"schema_version {version} is not a valid version (1 or more)")
    if version > supported:
        raise UnsupportedSchema(key, version, supported)
    return data


class Versioned(Protocol):
    """A document the CAS loop stamps: a version counter and its last commit ids."""

    version: int
    commits: tuple[str, ...]


D = TypeVar("D", bound=BaseModel)


class VersionedCodec(Generic[D]):
    """A pydantic document with ``schema_version``, ``version`` and ``commits`` fields."""

    model: ClassVar[type[BaseModel]]
    schema: ClassVar[int]
    what: ClassVar[str]
    repair: ClassVar[str] = ""
    """What a user can do about a corrupt object of this kind (``CorruptShard`` says it)."""

    def decode(self, key: str, body: bytes) -> D:
        data = load_json(key, body, self.schema)
        try:
            doc: D = self.model.model_validate(data)  # type: ignore[assignment]
        except ValidationError as e:
            raise CorruptShard(
                key, f"does not match the {self.what} schema: {schema_problems(e)}"
            ) from None
        self.check(key, doc)
        return doc

    def check(self, key: str, doc: D) -> None:
        """Refuse a document that parses but belongs elsewhere."""

    def encode(self, doc: D) -> bytes:
        return doc.model_dump_json(exclude_none=True).encode()

    def stamp(self, doc: D, commit_id: str) -> D:
        versioned: Versioned = doc  # type: ignore[assignment]
        commits = (*versioned.commits, commit_id)[-COMMITS_KEPT:]
        return doc.model_copy(update={"version": versioned.version + 1, "commits": commits})

    def commit_ids(self, doc: D) -> Sequence[str]:
        versioned: Versioned = doc  # type: ignore[assignment]
        return versioned.commits

    def version(self, doc: D) -> int | None:
        versioned: Versioned = doc  # type: ignore[assignment]
        return versioned.version


@dataclass(frozen=True)
class ShardCodec(VersionedCodec[Shard]):
    """A stage's shard; its transitions are the entries a commit changed."""

    model: ClassVar[type[BaseModel]] = Shard
    schema: ClassVar[int] = SCHEMA_VERSION
    what: ClassVar[str] = "shard"
    repair: ClassVar[str] = SHARD_REPAIR

    task_id: str
    stage: str

    def check(self, key: str, doc: Shard) -> None:
        if doc.stage != self.stage or doc.task_id != self.task_id:
            raise CorruptShard(key, f"belongs to task {doc.task_id!r} stage {doc.stage!r}")

    def empty(self) -> Shard:
        return Shard(task_id=self.task_id, stage=self.stage)

    def transitions(self, before: Shard, after: Shard) -> list[Transition]:
        changed = []
        old = before.entries
        for file_id, entry in after.entries.items():
            was = old.get(file_id)
            if was is entry or was == entry:
                continue
            changed.append(
                Transition(
                    item=file_id,
                    before=was.state.value if was is not None else None,
                    after=entry.state.value,
                    epoch=entry.epoch,
                    retry_count=entry.retry_count,
                    error=entry.error,
                    checksum=entry.checksum,
                )
            )
        return changed


class IndexCodec:
    """The cross-shard index: ``shard_index``'s strict JSON, parsed once. Its changes are
    idempotent declarations, so it needs no commit ids: re-applying one that landed is a
    no-op."""

    repair: ClassVar[str] = INDEX_REPAIR

    def decode(self, key: str, body: bytes) -> shard_index.ShardIndex:
        try:
            return shard_index.ShardIndex.from_json(body)
        except shard_index.UnsupportedIndexSchema as e:
            raise UnsupportedSchema(key, e.version, shard_index.ShardIndex.SCHEMA_VERSION) from None
        except shard_index.IndexFormatError as e:
            raise CorruptShard(key, str(e)) from None

    def encode(self, doc: shard_index.ShardIndex) -> bytes:
        return doc.to_json()

    def empty(self) -> shard_index.ShardIndex:
        return shard_index.ShardIndex.empty()

    def stamp(self, doc: shard_index.ShardIndex, commit_id: str) -> shard_index.ShardIndex:
        return doc

    def commit_ids(self, doc: shard_index.ShardIndex) -> Sequence[str]:
        return ()

    def version(self, doc: shard_index.ShardIndex) -> int | None:
        return doc.version

    def transitions(
        self, before: shard_index.ShardIndex, after: shard_index.ShardIndex
    ) -> list[Transition]:
        return [
            Transition(item=file_id, before=None, after="declared")
            for file_id in sorted(after.file_ids() - before.file_ids())
        ]


INDEX = IndexCodec()


def index_error(e: shard_index.ShardIndexError) -> DeclarationConflict:
    """The index package knows nothing of objmanifest; give its refusals our types."""
    if isinstance(e, shard_index.DependencyCycle):
        return DependencyCycle(f"refused: it would make a dependency cycle: {e}")
    return DeclarationConflict(str(e))
