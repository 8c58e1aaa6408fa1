"""How each kind of manifest object is read, written and stamped for the CAS loop.

A shard and an upload state are pydantic documents with a schema version, a version counter
and their last commit ids (``VersionedCodec``); the index is ``shard_index``'s own strict
JSON. Decoding refuses what does not parse (``CorruptShard``) and what a newer objmanifest
wrote (``UnsupportedSchema``), so neither is ever overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ValidationError

import shard_index

from ..core.commit_events import Change, change_of
from ..core.layout import TaskLayout
from ..core.model import (
    COMMITS_KEPT,
    HEADER_SCHEMA,
    JOURNAL_SCHEMA,
    SCHEMA_VERSION,
    Entry,
    Journaled,
    JournalRecord,
    Shard,
    TaskHeader,
)
from ..core.plain import MAX_NESTING, nesting_bound
from ..errors import CorruptShard, DeclarationConflict, DependencyCycle, NotFound, UnsupportedSchema
from .fragments import Fragments

SHARD_REPAIR = "run `objmanifest repair` (Task.repair()), which copies it aside and rebuilds it"
INDEX_REPAIR = (
    "run `objmanifest repair` (Task.repair()), which copies it aside and rebuilds it from "
    "the shards"
)
REMOVED = "removed"
"""The state a journal gives an entry that left its shard (undeclared, or archived)."""
HEADER_REPAIR = "delete it and run `objmanifest init` again with the task's stages and settings"
UPLOAD_REPAIR = (
    "run `objmanifest repair` (Task.repair()): it copies it aside and rebuilds the part list "
    "of a ready entry from its data; for an entry still being written, delete it: its next "
    "holder then starts its upload anew"
)


NESTED_TOO_DEEPLY = (
    f"not JSON objmanifest reads: arrays or objects nest more than {MAX_NESTING} deep"
)


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
    if nesting_bound(body) > MAX_NESTING:  # checked first: a parser that recursed would crash
        raise CorruptShard(key, NESTED_TOO_DEEPLY)
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
        requires = data.get("requires")
        raise UnsupportedSchema(
            key, version, supported, requires=requires if isinstance(requires, str) else ""
        )
    return data


M = TypeVar("M", bound=BaseModel)


def decode_model(key: str, body: bytes, supported: int, model: type[M], what: str) -> M:
    """``body`` as a ``model`` (a JSON object of a supported ``schema_version``), or
    ``CorruptShard`` saying it is not ``what`` and why (``UnsupportedSchema`` if newer)."""
    data = load_json(key, body, supported)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise CorruptShard(key, f"not {what}: {schema_problems(e)}") from None


def remembered(commits: tuple[str, ...], commit_id: str) -> tuple[str, ...]:
    """The last ``COMMITS_KEPT`` commit ids once ``commit_id`` wrote a version: the members
    of a group commit share their write's id, which is remembered once (so a group never
    pushes other writers' ids out of the window faster than one write does)."""
    if commits[-1:] == (commit_id,):
        return commits
    return (*commits, commit_id)[-COMMITS_KEPT:]


D = TypeVar("D", bound=Journaled)
"""A versioned document: a pydantic model with a schema version, a version counter, its
last commit ids and (from ``JOURNAL_SCHEMA`` on) the journal records it carries."""


class VersionedCodec(Generic[D]):
    """A pydantic document with ``schema_version``, ``version`` and ``commits`` fields."""

    model: type[D]
    """The document's model (a class attribute of each codec)."""
    schema: ClassVar[int]
    what: ClassVar[str]
    repair: ClassVar[str] = ""
    """What a user can do about a corrupt object of this kind (``CorruptShard`` says it)."""
    writes: int
    """The schema version a new object of this kind is created at: the task's."""

    def decode(self, key: str, body: bytes) -> D:
        data = load_json(key, body, self.schema)
        try:
            doc = self.model.model_validate(data)
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
        commits = remembered(doc.commits, commit_id)
        return doc.replaced(version=doc.version + 1, commits=commits)

    def commit_ids(self, doc: D) -> Sequence[str]:
        return doc.commits

    def version(self, doc: D) -> int | None:
        return doc.version

    def journal(self, doc: D) -> tuple[str | None, tuple[JournalRecord, ...]] | None:
        """The journal id and the records ``doc`` carries; None below ``JOURNAL_SCHEMA``."""
        if doc.schema_version < JOURNAL_SCHEMA:
            return None
        return doc.journal_id, doc.journal or ()

    def with_journal(self, doc: D, journal_id: str, records: Sequence[JournalRecord]) -> D:
        return doc.replaced(journal_id=journal_id, journal=tuple(records))

    def schema_of(self, doc: D) -> int:
        return doc.schema_version

    def migrated(self, doc: D, schema_version: int) -> D:
        """``doc`` at a newer schema version (the journal starts with its next version)."""
        return doc.model_copy(update={"schema_version": schema_version})


@dataclass(frozen=True)
class ShardCodec(VersionedCodec[Shard]):
    """A stage's shard; its transitions are the entries a commit changed."""

    model = Shard
    schema: ClassVar[int] = SCHEMA_VERSION
    what: ClassVar[str] = "shard"
    repair: ClassVar[str] = SHARD_REPAIR

    task_id: str
    stage: str
    writes: int = SCHEMA_VERSION
    creation_id: str = ""
    """The task's ``creation_id``: a shard made here carries it, and one read with another
    belongs to a task created anew under the same id (``check``); "" checks nothing."""
    fragments: Fragments = field(default_factory=Fragments, compare=False, repr=False)

    def encode(self, doc: Shard) -> bytes:
        """Byte for byte ``model_dump_json(exclude_none=True)``, but a shard written warm
        has only the entries, journal records and archived ids a commit changed encoded, and
        its small fields not at all while they stay the same (``Fragments``)."""
        return self.fragments.shard(doc)

    def check(self, key: str, doc: Shard) -> None:
        if doc.stage != self.stage or doc.task_id != self.task_id:
            raise CorruptShard(key, f"belongs to task {doc.task_id!r} stage {doc.stage!r}")
        if self.creation_id and doc.creation_id and doc.creation_id != self.creation_id:
            raise NotFound(
                f"task {self.task_id!r} was deleted and created again since this process "
                f"opened it ({key} belongs to the new one): nothing was changed; open the task "
                "again (a claim of the old task holds nothing in the new one)"
            )

    def empty(self) -> Shard:
        return Shard(
            task_id=self.task_id,
            stage=self.stage,
            schema_version=self.writes,
            creation_id=self.creation_id or None,
        )

    def transitions(self, before: Shard, after: Shard) -> list[Change]:
        """The entries removed (in the order ``before`` had them), then those changed or
        added (in ``after``'s order). Found at C speed when ``after`` keeps ``before``'s
        ids in order (a commit's usual change: entries replaced, new ones last), or from what
        ``Shard.with_entries`` said it set, so a warm commit's cost does not grow with the
        entries it left alone; the encoding of ``after`` then finds the same ``Delta`` again
        without looking."""
        old, new = before.entries, after.entries
        candidates = self.fragments.delta(old, new).changed
        changed: list[Change] = []
        if candidates is None:
            gone = old.keys() - new.keys()
            changed = [
                Change(item=file_id, before=was.state._value_, after=REMOVED, epoch=was.epoch)
                for file_id, was in (old.items() if gone else ())
                if file_id in gone
            ]
            candidates = list(new)
        for file_id in candidates:
            entry, was = new[file_id], old.get(file_id)
            if was is not None and (
                was is entry or (was.__dict__ == entry.__dict__ and was == entry)
            ):  # the same, or equal (pydantic's comparison, once their fields look alike)
                continue
            changed.append(
                change_of(
                    file_id,
                    entry.state._value_,
                    before=was.state._value_ if was is not None else None,
                    epoch=entry.epoch,
                    retry_count=entry.retry_count,
                    error=entry.error,
                    checksum=entry.checksum,
                    **_rebuild_fields(was, entry),
                )
            )
        return changed


def _rebuild_fields(was: Entry | None, entry: Entry) -> dict[str, Any]:
    """What a repair needs beyond state, epoch and checksum to rebuild ``entry`` from its
    journal, recorded only where it applies (so a record stays small): the data of an entry
    that has some, the consumers' marks, when it was claimed and became ready (when that
    changed), when it may be retried (while it waits), and the declaration when the entry
    is new."""
    fields: dict[str, Any] = {}
    if entry.checksum is not None:
        fields.update(key=entry.key, size=entry.size)
        if entry.part_size is not None:
            fields.update(part_size=entry.part_size, parts_key=entry.parts_key)
            if entry.whole_checksum is not None:
                fields["whole_checksum"] = entry.whole_checksum
    if entry.consumed_by:
        fields["consumed_by"] = entry.consumed_by
    for name in ("claimed_at", "ready_at"):
        value = getattr(entry, name)
        if value is not None and (was is None or getattr(was, name) != value):
            fields[name] = value
    if entry.retry_at is not None:
        fields["retry_at"] = entry.retry_at
    if was is None:
        if entry.depends_on:
            fields["depends_on"] = entry.depends_on
        if entry.consumers:
            fields["consumers"] = entry.consumers
    return fields


class ShardCodecs(Mapping[str, ShardCodec]):
    """The codec of every shard of a task, each made when first asked for: a task object
    holds those of the shards it touches, not thousands (an agent of a split stage works in
    one or two partitions)."""

    def __init__(
        self, layout: TaskLayout, stages: tuple[str, ...], schema: int, creation_id: str = ""
    ) -> None:
        self._layout, self._stages, self._schema = layout, stages, schema
        self._creation_id = creation_id
        self._made: dict[str, ShardCodec] = {}

    def __getitem__(self, shard: str) -> ShardCodec:
        codec = self._made.get(shard)
        if codec is None:
            if not self._layout.is_shard(shard, self._stages):
                raise KeyError(shard)
            codec = self._made[shard] = ShardCodec(
                self._layout.task_id, shard, self._schema, self._creation_id
            )
        return codec

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.all_shards(self._stages))

    def __len__(self) -> int:
        return len(self._layout.all_shards(self._stages))


@dataclass(frozen=True)
class IndexCodec:
    """The cross-shard index: ``shard_index``'s strict JSON, parsed once. From schema 2 on it
    carries its last commit ids and its journal records like every manifest object (as
    ``shard_index.Meta``, JSON that package does not interpret). Its version goes up in
    ``declare_many`` (and ``migrated``), once per written version, not in ``stamp``."""

    repair: ClassVar[str] = INDEX_REPAIR
    writes: int = SCHEMA_VERSION

    def decode(self, key: str, body: bytes) -> shard_index.ShardIndex:
        if nesting_bound(body) > MAX_NESTING:
            raise CorruptShard(key, NESTED_TOO_DEEPLY)
        try:
            return shard_index.ShardIndex.from_json(body)
        except shard_index.UnsupportedIndexSchema as e:
            raise UnsupportedSchema(key, e.version, shard_index.ShardIndex.SCHEMA_VERSION) from None
        except shard_index.IndexFormatError as e:
            raise CorruptShard(key, str(e)) from None

    def encode(self, doc: shard_index.ShardIndex) -> bytes:
        return doc.to_json()

    def empty(self) -> shard_index.ShardIndex:
        return shard_index.ShardIndex.empty(self.writes)

    def stamp(self, doc: shard_index.ShardIndex, commit_id: str) -> shard_index.ShardIndex:
        meta = doc.meta
        if meta.schema_version < JOURNAL_SCHEMA:
            return doc
        return doc.with_meta(replace(meta, commits=remembered(meta.commits, commit_id)))

    def commit_ids(self, doc: shard_index.ShardIndex) -> Sequence[str]:
        return doc.meta.commits

    def version(self, doc: shard_index.ShardIndex) -> int | None:
        return doc.version

    def journal(
        self, doc: shard_index.ShardIndex
    ) -> tuple[str | None, tuple[JournalRecord, ...]] | None:
        meta = doc.meta
        if meta.schema_version < JOURNAL_SCHEMA:
            return None
        try:
            records = tuple(JournalRecord.model_validate(r) for r in meta.journal)
        except ValidationError as e:
            problem = f"a journal record is malformed: {schema_problems(e)}"
            raise CorruptShard("index.json", problem) from None
        return meta.journal_id or None, records

    def with_journal(
        self, doc: shard_index.ShardIndex, journal_id: str, records: Sequence[JournalRecord]
    ) -> shard_index.ShardIndex:
        stored = tuple(r.model_dump(mode="json", exclude_none=True) for r in records)
        return doc.with_meta(replace(doc.meta, journal_id=journal_id, journal=stored))

    def schema_of(self, doc: shard_index.ShardIndex) -> int:
        return doc.meta.schema_version

    def migrated(self, doc: shard_index.ShardIndex, schema_version: int) -> shard_index.ShardIndex:
        """``doc`` at a newer schema version, one version later."""
        return doc.with_meta(replace(doc.meta, schema_version=schema_version), doc.version + 1)

    def transitions(
        self, before: shard_index.ShardIndex, after: shard_index.ShardIndex
    ) -> list[Change]:
        return [
            *(
                Change(item=file_id, before=None, after="declared")
                for file_id in sorted(after.file_ids() - before.file_ids())
            ),
            *(
                Change(item=file_id, before="declared", after=REMOVED)
                for file_id in sorted(before.file_ids() - after.file_ids())
            ),
        ]


def index_error(e: shard_index.ShardIndexError) -> DeclarationConflict:
    """The index package knows nothing of objmanifest; give its refusals our types."""
    if isinstance(e, shard_index.DependencyCycle):
        return DependencyCycle(f"refused: it would make a dependency cycle: {e}")
    return DeclarationConflict(str(e))


@dataclass(frozen=True)
class HeaderCodec:
    """``task.json``, written once at create and changed only by ``Task.migrate``: no
    version counter, no journal (what a migration did is journaled by the objects it
    moves)."""

    task_id: str
    repair: ClassVar[str] = HEADER_REPAIR

    def decode(self, key: str, body: bytes) -> TaskHeader:
        header = decode_model(key, body, HEADER_SCHEMA, TaskHeader, "a task header")
        if header.task_id != self.task_id:
            raise CorruptShard(key, f"it is the header of task {header.task_id!r}")
        return header

    def encode(self, doc: TaskHeader) -> bytes:
        return doc.model_dump_json(exclude_none=True).encode()

    def empty(self) -> TaskHeader:
        raise NotFound(f"task {self.task_id!r} has no header: create it first")

    def stamp(self, doc: TaskHeader, commit_id: str) -> TaskHeader:
        return doc

    def commit_ids(self, doc: TaskHeader) -> Sequence[str]:
        return ()

    def version(self, doc: TaskHeader) -> int | None:
        return None

    def transitions(self, before: TaskHeader, after: TaskHeader) -> list[Change]:
        return [
            Change(
                item="task",
                before=f"schema {before.schema_version}",
                after=f"schema {after.schema_version}",
            )
        ]

    def journal(self, doc: TaskHeader) -> None:
        return None

    def with_journal(
        self, doc: TaskHeader, journal_id: str, records: Sequence[JournalRecord]
    ) -> TaskHeader:
        return doc
