"""How each kind of manifest object is read, written and stamped for the CAS loop.

A shard and an upload state are pydantic documents with a schema version, a version counter
and their last commit ids (``VersionedCodec``); the index is ``shard_index``'s own strict
JSON. Decoding refuses what does not parse (``CorruptShard``) and what a newer objmanifest
wrote (``UnsupportedSchema``), so neither is ever overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import is_not
from typing import Any, ClassVar, Generic, TypeVar

import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

import shard_index

from ..core.commit_events import Change
from ..core.layout import TaskLayout
from ..core.model import (
    COMMITS_KEPT,
    HEADER_SCHEMA,
    JOURNAL_SCHEMA,
    SCHEMA_VERSION,
    Archived,
    Entry,
    Journaled,
    JournalRecord,
    Shard,
    TaskHeader,
)
from ..core.plain import MAX_NESTING, nesting_bound
from ..errors import CorruptShard, DeclarationConflict, DependencyCycle, NotFound, UnsupportedSchema

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


def _starts_with(keys: list[str], first: list[str]) -> bool:
    """Whether ``keys`` are ``first`` and maybe more after (compared at C speed)."""
    n = len(first)
    return len(keys) >= n and (keys if len(keys) == n else keys[:n]) == first


def _piece(key: str | None, item: BaseModel) -> bytes:
    """One item's JSON as it sits in its shard: ``"key":value`` for an item of a mapping."""
    body = item.model_dump_json(exclude_none=True).encode()
    return body if key is None else pydantic_core.to_json(key) + b":" + body


@dataclass(frozen=True)
class _Run:
    """The items of one field of the last shard encoded, their JSON joined, and each item's
    piece once the field is being written warm (None before: it was encoded whole)."""

    keys: list[str] | None
    values: list[BaseModel]
    pieces: list[bytes] | None
    joined: bytes
    warm: int = 0
    """How many encodings in a row found most items the same objects as the one before."""


class Fragments:
    """The encoded JSON of each item (entry, journal record, archived id) of the last shard
    a codec encoded, known by the identity of the item's object.

    Items are frozen models, and a commit carries every item it did not change over as the
    same object (and a mapping's keys in the same order, new ones last), so a commit encodes
    only the items it changed: the others are found by comparing the new version's objects
    with the last one's, at C speed, and their pieces are joined again. Pieces cost about
    twice pydantic's one pass over the whole field to make, so they are made only once the
    field was encoded twice in a row with most of its items unchanged; before that (a fresh
    read, where every item is a new object, as after each lost race on a busy shard), and
    after any other change (items removed or reordered), the field is encoded whole. Only
    the last encoding is kept (about the size of the shard's body), each field's as one
    immutable ``_Run``: two threads encoding at once only lose some reuse, never correctness
    (a piece is reused only for the very object, under the very key, it was made from)."""

    WARM = 2
    """Encodings in a row with most items unchanged after which pieces are made."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    def join(
        self,
        name: str,
        keys: list[str] | None,
        values: list[BaseModel],
        whole: Callable[[], bytes] | None = None,
    ) -> bytes:
        """The items of field ``name`` (a mapping's ``keys`` and ``whole``, which encodes
        them in one pass; or None for a sequence) as JSON, joined by commas, and kept for
        the next encoding."""
        old = self._runs.get(name)
        if keys is None or whole is None:
            run = self._sequence(old, values) if old is not None else None
            run = run or self._rebuilt(old, values)
        else:
            run = self._mapping(old, keys, values, whole)
        self._runs[name] = run
        return run.joined

    def _mapping(
        self,
        old: _Run | None,
        keys: list[str],
        values: list[BaseModel],
        whole: Callable[[], bytes],
    ) -> _Run:
        """A mapping's run: the old pieces and those of the items that are other objects
        (or new, last), once warm; encoded whole otherwise."""
        n = len(old.values) if old is not None else 0
        changed: list[int] | None = None
        if old is not None and old.keys is not None and _starts_with(keys, old.keys):
            changed = list(compress(range(n), map(is_not, values, old.values)))
        if old is None or changed is None or 2 * len(changed) > n:
            return _Run(keys, values, None, whole())
        warm = old.warm + 1
        if old.pieces is None:
            if warm < self.WARM:
                return _Run(keys, values, None, whole(), warm)
            pieces = [_piece(k, v) for k, v in zip(keys, values, strict=True)]
            return _Run(keys, values, pieces, b",".join(pieces), warm)
        if not changed and len(keys) == n:
            return _Run(keys, values, old.pieces, old.joined, warm)
        pieces = old.pieces.copy()
        for i in changed:
            pieces[i] = _piece(keys[i], values[i])
        pieces += [_piece(k, v) for k, v in zip(keys[n:], values[n:], strict=True)]
        return _Run(keys, values, pieces, b",".join(pieces), warm)

    @staticmethod
    def _sequence(old: _Run, values: list[BaseModel]) -> _Run | None:
        """A sequence's run when it is the old one less some first items, more some new
        ones (a journal: records appended, a flushed block dropped); None otherwise."""
        n = len(old.values)
        if old.keys is not None or old.pieces is None:
            return None
        first = next((i for i, v in enumerate(old.values) if values and v is values[0]), None)
        kept = n - first if first is not None else 0
        if first is None or len(values) < kept or any(map(is_not, values, old.values[first:])):
            return None
        pieces = old.pieces[first:] + [_piece(None, v) for v in values[kept:]]
        return _Run(None, values, pieces, b",".join(pieces))

    @staticmethod
    def _rebuilt(old: _Run | None, values: list[BaseModel]) -> _Run:
        """A sequence's run made piece by piece, taking an old piece wherever the same object
        was (the old run holds its objects, so no other has their ids)."""
        known: dict[int, bytes] = {}
        if old is not None and old.pieces is not None:
            known = {id(v): p for v, p in zip(old.values, old.pieces, strict=True)}
        pieces = [known.get(id(v)) or _piece(None, v) for v in values]
        return _Run(None, values, pieces, b",".join(pieces))


_WHOLE: dict[str, TypeAdapter[Any]] = {
    "entries": TypeAdapter(dict[str, Entry]),
    "archived": TypeAdapter(dict[str, Archived]),
}
"""How a mapping field of a shard is encoded in one pass, as inside the shard."""


_HOLES: tuple[tuple[str, bytes], ...] = (
    ("journal", b'"journal":[]'),
    ("entries", b'"entries":{}'),
    ("archived", b'"archived":{}'),
)
"""The shard's fields that grow with it, in the order pydantic writes them (the fields
before each are numbers and strings, so the first such text after the one before is the
field itself: a string's quotes are escaped, so no string can hold it)."""


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
    fragments: Fragments = field(default_factory=Fragments, compare=False, repr=False)

    def encode(self, doc: Shard) -> bytes:
        """Byte for byte ``model_dump_json(exclude_none=True)``, but a shard written warm
        has only the entries, journal records and archived ids a commit changed encoded
        (``Fragments``): the shard's small fields are encoded with its big ones left empty,
        and those are put into the holes, from the cached pieces or whole."""
        present = [(name, hole) for name, hole in _HOLES if getattr(doc, name) is not None]
        empty: dict[str, Any] = {n: () if n == "journal" else {} for n, _ in present}
        skeleton = doc.replaced(**empty).model_dump_json(exclude_none=True).encode()
        out, pos = [], 0
        for name, hole in present:
            value = getattr(doc, name)
            inside = skeleton.index(hole, pos) + len(hole) - 1  # at its closing bracket
            out.append(skeleton[pos:inside])
            if isinstance(value, dict):
                adapter = _WHOLE[name]

                def whole(value: Any = value, adapter: TypeAdapter[Any] = adapter) -> bytes:
                    return adapter.dump_json(value, exclude_none=True)[1:-1]

                out.append(self.fragments.join(name, list(value), list(value.values()), whole))
            else:
                out.append(self.fragments.join(name, None, list(value)))
            pos = inside
        out.append(skeleton[pos:])
        return b"".join(out)

    def check(self, key: str, doc: Shard) -> None:
        if doc.stage != self.stage or doc.task_id != self.task_id:
            raise CorruptShard(key, f"belongs to task {doc.task_id!r} stage {doc.stage!r}")

    def empty(self) -> Shard:
        return Shard(task_id=self.task_id, stage=self.stage, schema_version=self.writes)

    def transitions(self, before: Shard, after: Shard) -> list[Change]:
        """The entries removed (in the order ``before`` had them), then those changed or
        added (in ``after``'s order). Found at C speed when ``after`` keeps ``before``'s
        ids in order (a commit's usual change: entries replaced, new ones last), so a warm
        commit's cost does not grow with the entries it left alone."""
        old, new = before.entries, after.entries
        gone, candidates = _differences(old, new)
        changed = [
            Change(item=file_id, before=was.state.value, after=REMOVED, epoch=was.epoch)
            for file_id, was in (old.items() if gone else ())
            if file_id in gone
        ]
        for file_id, entry in candidates:
            was = old.get(file_id)
            if was is entry or was == entry:
                continue
            changed.append(
                Change(
                    item=file_id,
                    before=was.state.value if was is not None else None,
                    after=entry.state.value,
                    epoch=entry.epoch,
                    retry_count=entry.retry_count,
                    error=entry.error,
                    checksum=entry.checksum,
                    **_rebuild_fields(was, entry),
                )
            )
        return changed


def _differences(
    old: dict[str, Entry], new: dict[str, Entry]
) -> tuple[set[str], list[tuple[str, Entry]]]:
    """The ids ``new`` lost, and its items that may differ from ``old``, in its order: when
    ``new`` starts with ``old``'s ids in order, none lost, and only the items that are other
    objects than before and the ones after; otherwise every item."""
    n = len(old)
    keys = list(new)
    if not _starts_with(keys, list(old)):
        return set(old.keys() - new.keys()), list(new.items())
    values = list(new.values())
    moved = [(keys[i], values[i]) for i in compress(range(n), map(is_not, values, old.values()))]
    return set(), moved + list(zip(keys[n:], values[n:], strict=True))


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

    def __init__(self, layout: TaskLayout, stages: tuple[str, ...], schema: int) -> None:
        self._layout, self._stages, self._schema = layout, stages, schema
        self._made: dict[str, ShardCodec] = {}

    def __getitem__(self, shard: str) -> ShardCodec:
        codec = self._made.get(shard)
        if codec is None:
            if not self._layout.is_shard(shard, self._stages):
                raise KeyError(shard)
            codec = self._made[shard] = ShardCodec(self._layout.task_id, shard, self._schema)
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
