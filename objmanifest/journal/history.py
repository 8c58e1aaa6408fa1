"""Reading the journal: every record of a manifest object, an entry's history, the task's
log, and an entry's lineage.

A manifest object's records are in two places: the write-once blocks under
``TASK/journal/OBJECT/`` (see ``cas.loop``) and the newest ones, still inside the object.
Readers merge both and keep one record per version (a block and the object may both hold a
record for a while; they are the same record). Objects written before the task moved to
the journal's schema have no records for those versions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import shard_index

from ..cas.codecs import REMOVED, decode_model
from ..cas.loop import Documents
from ..cas.policy import Codec
from ..core.layout import BlockRef, TaskLayout
from ..core.model import (
    DroppedRange,
    Entry,
    JournalBlock,
    JournalRecord,
    LostRange,
    RetentionMarker,
)
from ..core.plain import fields_json
from ..errors import CorruptShard, NotFound
from ..store import ObjectStore, get_if_any

log = logging.getLogger(__name__)

BLOCK_SCHEMA = 1
MARKER_SCHEMA = 1
BLOCK_REPAIR = (
    "run `objmanifest repair` (Task.repair()): it copies the block aside and puts its "
    "records back from the object if it still carries them, else records them as lost, so "
    "readers say so"
)


def decided_order(groups: Iterable[Sequence[JournalRecord]]) -> list[JournalRecord]:
    """Records of several objects (each group one object's, in version order) in the order
    they were decided: by store time, then object and version, except that within one
    object its versions are the order. Agents' store clocks are estimates (the ``Date``
    header has whole seconds), so a later version written by another process may carry an
    earlier time; it is placed at the time of the version before it, never before it."""
    keyed: list[tuple[tuple[datetime, str, int], JournalRecord]] = []
    for records in groups:
        latest: datetime | None = None
        for record in records:
            latest = record.at if latest is None or record.at > latest else latest
            keyed.append(((latest, record.object_key or "", record.version), record))
    keyed.sort(key=lambda pair: pair[0])
    return [record for _, record in keyed]


@dataclass(frozen=True)
class Transition:
    """One step in an entry's history: the commit (object version, command, actor, store
    time) and what it did to the entry."""

    version: int
    command: str
    actor: str
    from_state: str | None
    """None when this commit declared the entry."""
    to_state: str
    epoch: int | None
    retry_count: int | None
    error: str | None
    at: datetime
    checksum: str | None = None
    object_key: str = ""
    commit_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "command": self.command,
            "actor": self.actor,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "epoch": self.epoch,
            "retry_count": self.retry_count,
            "error": self.error,
            "checksum": self.checksum,
            "at": self.at.isoformat(),
            "object_key": self.object_key,
            "commit_id": self.commit_id,
        }


@dataclass(frozen=True)
class LineageNode:
    """One entry of a lineage: who produced it, in which epoch, and what it holds."""

    file_id: str
    stage: str | None
    state: str | None
    """None: declared as a dependency but not (yet) declared itself."""
    producer: str | None
    epoch: int | None
    checksum: str | None
    size: int | None
    depends_on: tuple[str, ...]
    declared_at: datetime | None
    updated_at: datetime | None
    ready_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class Lineage:
    """The upstream graph of an entry through ``depends_on``: ``nodes`` by file id, and
    ``edges`` as (file id, a dependency of it) pairs. The checksums of the nodes say which
    bytes a result was made from."""

    root: str
    nodes: dict[str, LineageNode] = field(default_factory=dict)
    edges: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True)
class Dropped:
    """Records ``first`` to ``last`` of a manifest object that journal retention dropped
    (``records`` of them, the newest decided at ``newest_at``), so a reader can say its
    journal of that object is not complete."""

    object_key: str
    journal_id: str
    first: int
    last: int
    records: int
    newest_at: datetime | None
    trimmed_at: datetime
    """When the last trim that widened it ran (for a loss: when ``repair`` found it)."""
    cause: str = "retention"
    """``retention``, or ``damage``: lost with a damaged or deleted journal block, found by
    ``repair`` (``problem`` says what was wrong, ``moved_to`` where its bytes went)."""
    problem: str | None = None
    moved_to: str | None = None

    def line(self) -> str:
        """What a reader says of it."""
        if self.cause == "damage":
            where = f" (its bytes are in {self.moved_to})" if self.moved_to else ""
            return (
                f"records {self.first}..{self.last} of {self.object_key} were lost with a "
                f"damaged journal block: {self.problem}{where}"
            )
        newest = f", the newest from {self.newest_at.isoformat()}" if self.newest_at else ""
        return (
            f"records before version {self.last + 1} of {self.object_key} were dropped by "
            f"retention (versions {self.first}..{self.last}: {self.records} record(s){newest})"
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "object_key": self.object_key,
            "journal_id": self.journal_id,
            "first": self.first,
            "last": self.last,
            "records": self.records,
            "newest_at": _iso(self.newest_at),
            "trimmed_at": self.trimmed_at.isoformat(),
        }
        if self.cause != "retention":
            out.update(cause=self.cause, problem=self.problem, moved_to=self.moved_to)
        return out

    @staticmethod
    def of(object_key: str, dropped: DroppedRange) -> Dropped:
        return Dropped(
            object_key,
            dropped.journal_id,
            dropped.first,
            dropped.last,
            dropped.records,
            dropped.newest_at,
            dropped.trimmed_at,
        )

    @staticmethod
    def lost(object_key: str, lost: LostRange) -> Dropped:
        return Dropped(
            object_key,
            lost.journal_id,
            lost.first,
            lost.last,
            lost.last - lost.first + 1,
            None,
            lost.found_at,
            cause="damage",
            problem=lost.problem,
            moved_to=lost.moved_to,
        )


def decode_block(store: ObjectStore, key: str, body: bytes, ref: BlockRef) -> JournalBlock:
    """The block at ``key``, or ``CorruptShard`` if it is not the block its key names:
    not JSON, not a block, another object's or incarnation's, or not exactly the
    versions its key covers."""
    where = store.describe(key)
    try:
        block = decode_model(key, body, BLOCK_SCHEMA, JournalBlock, "a journal block")
    except CorruptShard as e:
        raise e.at(where, BLOCK_REPAIR) from None
    names = (block.object_key, block.journal_id, block.first, block.last)
    if names != (ref.object_key, ref.journal_id, ref.first, ref.last):
        problem = (
            f"it holds versions {block.first}..{block.last} of {block.object_key} "
            f"(incarnation {block.journal_id}), not what its key names"
        )
        raise CorruptShard(key, problem, where, BLOCK_REPAIR)
    if [r.version for r in block.records] != list(range(ref.first, ref.last + 1)):
        problem = f"its records are not versions {ref.first}..{ref.last}, one each"
        raise CorruptShard(key, problem, where, BLOCK_REPAIR)
    return block


MARKER_REPAIR = (
    "run `objmanifest repair` (Task.repair()), which copies it aside and writes it again "
    "from the journal blocks there are (the versions no block holds are then said lost)"
)


def decode_marker(key: str, body: bytes, where: str) -> RetentionMarker:
    """A retention marker, or ``CorruptShard`` naming it by its address and repair."""
    try:
        return decode_model(key, body, MARKER_SCHEMA, RetentionMarker, "a journal retention marker")
    except CorruptShard as e:
        raise e.at(where, MARKER_REPAIR) from None


def read_marker(store: ObjectStore, key: str) -> RetentionMarker | None:
    """The retention marker at ``key``; None where there is none (nothing was dropped yet)."""
    blob = get_if_any(store, key)
    return None if blob is None else decode_marker(key, blob.body, store.describe(key))


def covered(marker: RetentionMarker | None, journal_id: str, last: int) -> bool:
    """Whether ``marker`` says the records up to ``last`` of ``journal_id`` were dropped, or
    that the block ending at ``last`` was lost to damage (a reader skips it: ``repair``
    copied it aside)."""
    if marker is None:
        return False
    if any(d.journal_id == journal_id and last <= d.last for d in marker.dropped):
        return True
    return any(d.journal_id == journal_id and d.first <= last <= d.last for d in marker.lost)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


class History:
    """Reads the journal of one task."""

    def __init__(
        self,
        store: ObjectStore,
        docs: Documents,
        layout: TaskLayout,
        objects: Callable[[], Sequence[tuple[str, Codec[Any]]]],
    ) -> None:
        self.store = store
        self.docs = docs.detached()
        self.layout = layout
        self._objects = objects

    # -- one object ------------------------------------------------------------------------

    def blocks(
        self, object_key: str, after: int = 0, damaged: list[CorruptShard] | None = None
    ) -> Iterator[JournalRecord]:
        """The records in the blocks of ``object_key`` (every incarnation), but for those
        journal retention dropped (a block it is still deleting is skipped too) and, with
        ``after``, for blocks that end at or before that version (never read). A damaged
        block raises ``CorruptShard``; with ``damaged``, it is added there and skipped (a
        repair reads what is left)."""
        prefix = self.layout.journal_of(object_key)
        rows = list(self.store.list(prefix))
        marker_key = self.layout.journal_retention(object_key)
        marker = None
        if any(r.key == marker_key for r in rows):
            try:
                marker = self._marker(marker_key)
            except CorruptShard as e:
                if damaged is None:
                    raise
                damaged.append(e)  # a repair reads every block, its own repair says lost
        for row in rows:
            ref = self.layout.parse_block(row.key)
            if ref is None or ref.object_key != object_key or ref.last <= after:
                continue
            if covered(marker, ref.journal_id, ref.last):
                continue
            blob = get_if_any(self.store, row.key)
            if blob is None:  # trimmed since the listing
                continue
            try:
                block = self.decode_block(row.key, blob.body, ref)
            except CorruptShard as e:
                if damaged is None:
                    raise
                damaged.append(e)
                continue
            yield from block.records

    def _marker(self, key: str) -> RetentionMarker | None:
        return read_marker(self.store, key)

    def dropped(self, object_key: str) -> list[Dropped]:
        """What journal retention dropped of ``object_key``'s records (nothing: [])."""
        marker = self._marker(self.layout.journal_retention(object_key))
        if marker is None:
            return []
        return [
            *(Dropped.of(object_key, d) for d in marker.dropped),
            *(Dropped.lost(object_key, d) for d in marker.lost),
        ]

    def decode_block(self, key: str, body: bytes, ref: BlockRef) -> JournalBlock:
        return decode_block(self.store, key, body, ref)

    def records(self, object_key: str, codec: Codec[Any], after: int = 0) -> list[JournalRecord]:
        """Every record of ``object_key``, oldest first, one per version, each with its
        ``object_key`` set (with ``after``, at least those after that version: the blocks
        that end at or before it are not read). The live object is read after the blocks,
        so a record moved to a block in between is still found."""
        found: dict[tuple[str, int], JournalRecord] = {}
        for record in self.blocks(object_key, after):
            found.setdefault((record.commit_id, record.version), record)
        try:
            doc = self.docs.read(object_key, codec)
        except NotFound:
            doc = None
        journal = codec.journal(doc) if doc is not None else None
        if journal is not None:
            for record in journal[1]:
                found.setdefault((record.commit_id, record.version), record)
        ordered = sorted(found.values(), key=lambda r: r.version)
        return [r.model_copy(update={"object_key": object_key}) for r in ordered]

    # -- the task --------------------------------------------------------------------------

    def of_stage(
        self, objects: Iterable[tuple[str, Codec[Any]]], stage: str | None
    ) -> list[tuple[str, Codec[Any]]]:
        """The objects whose records may concern ``stage`` (all, for None): its shards and
        upload states, and a task's one shard, which holds every stage (``narrowed`` then
        keeps only its records of ``stage``)."""
        if stage is None:
            return list(objects)
        kept = []
        for key, codec in objects:
            parsed = self.layout.parse(key)
            shared = parsed.kind == "shard" and parsed.stage is None
            if parsed.stage == stage or shared:
                kept.append((key, codec))
        return kept

    def narrowed(
        self,
        records: Iterable[JournalRecord],
        stage: str | None,
        stage_of: Callable[[str], str | None] | None,
    ) -> list[JournalRecord]:
        """``records`` with only the transitions of entries of ``stage`` (``stage_of`` names
        an entry's stage), leaving out a record of the task's one shard that changed none;
        the records of any other object are of one stage and kept whole."""
        if stage is None or stage_of is None:
            return list(records)
        out = []
        for record in records:
            parsed = self.layout.parse(record.object_key or "")
            if not (parsed.kind == "shard" and parsed.stage is None):
                out.append(record)
                continue
            mine = tuple(c for c in record.transitions if stage_of(c.item) == stage)
            if len(mine) == len(record.transitions):
                out.append(record)
            elif mine:
                out.append(record.model_copy(update={"transitions": mine}))
        return out

    def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
        objects: Iterable[tuple[str, Codec[Any]]] | None = None,
        stage_of: Callable[[str], str | None] | None = None,
    ) -> list[JournalRecord]:
        """The task's records in the order they were decided (``decided_order``), filtered
        by time, stage and actor (``stage_of`` names an entry's stage: needed for the records
        of a task's one shard, which holds every stage)."""
        groups: list[list[JournalRecord]] = []
        chosen = self.of_stage(objects if objects is not None else self._objects(), stage)
        for key, codec in chosen:
            groups.append(
                self.narrowed(
                    [
                        record
                        for record in self.records(key, codec)
                        if (since is None or record.at >= since)
                        and (agent is None or record.actor == agent)
                    ],
                    stage,
                    stage_of,
                )
            )
        return decided_order(groups)

    def newer(
        self, seen: dict[str, int], objects: Iterable[tuple[str, Codec[Any]]] | None = None
    ) -> list[JournalRecord]:
        """The records committed since ``seen`` (object key -> the newest version already
        returned; updated), oldest first. Each object costs a conditional GET (a 304 when
        it did not change); its blocks are read only if records moved there meanwhile, and
        only those."""
        groups: list[list[JournalRecord]] = []
        for key, codec in objects if objects is not None else self._objects():
            try:
                doc = self.docs.read(key, codec)
            except NotFound:
                continue
            journal = codec.journal(doc)
            if journal is None:
                continue
            last = seen.get(key, 0)
            live = [r for r in journal[1] if r.version > last]
            if not live:
                continue
            if live[0].version > last + 1:  # the ones between are in a block by now
                found = [r for r in self.records(key, codec, after=last) if r.version > last]
            else:
                found = [r.model_copy(update={"object_key": key}) for r in live]
            seen[key] = found[-1].version
            groups.append(found)
        return decided_order(groups)

    def history(self, file_id: str, shard_key: str, codec: Codec[Any]) -> list[Transition]:
        """Every transition of ``file_id`` in its shard, oldest first, across takeovers."""
        return transitions_of(file_id, self.records(shard_key, codec))


def transitions_of(file_id: str, records: Iterable[JournalRecord]) -> list[Transition]:
    """What ``records`` did to ``file_id``, in their order."""
    steps: list[Transition] = []
    for record in records:
        for change in record.transitions:
            if change.item != file_id:
                continue
            steps.append(
                Transition(
                    version=record.version,
                    command=record.command,
                    actor=record.actor,
                    from_state=change.before,
                    to_state=change.after,
                    epoch=change.epoch,
                    retry_count=change.retry_count,
                    error=change.error,
                    at=record.at,
                    checksum=change.checksum,
                    object_key=record.object_key or "",
                    commit_id=record.commit_id,
                )
            )
    return steps


def lineage(
    file_id: str,
    index: shard_index.ShardIndex,
    entry: Callable[[str], Entry | None],
    ready_at: Callable[[Entry], datetime | None] | None = None,
) -> Lineage:
    """Walk ``depends_on`` upstream from ``file_id``, across shards (breadth first; the
    index holds no cycle, and each id is visited once)."""
    nodes: dict[str, LineageNode] = {}
    edges: list[tuple[str, str]] = []
    queue = [file_id]
    while queue:
        current = queue.pop(0)
        if current in nodes:
            continue
        found = entry(current) if current in index else None
        deps = tuple(sorted(index.dependencies(current)))
        if found is None:
            nodes[current] = LineageNode(
                current, index.stage_of(current), None, None, None, None, None, deps, None, None
            )
        else:
            produced = found.checksum is not None
            nodes[current] = LineageNode(
                file_id=current,
                stage=found.stage,
                state=found.state.value,
                producer=found.owner if produced else None,
                epoch=found.epoch if produced else None,
                checksum=found.checksum,
                size=found.size,
                depends_on=deps,
                declared_at=found.declared_at,
                updated_at=found.updated_at,
                ready_at=ready_at(found) if ready_at is not None and produced else None,
            )
        for dep in deps:
            edges.append((current, dep))
            queue.append(dep)
    return Lineage(file_id, nodes, tuple(edges))


__all__ = [
    "REMOVED",
    "Dropped",
    "History",
    "Lineage",
    "LineageNode",
    "Transition",
    "lineage",
    "transitions_of",
]
