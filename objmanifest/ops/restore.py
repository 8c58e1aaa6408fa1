"""Repair from the versions a store keeps: a deleted or damaged manifest object put back
exactly as its newest sound version holds it.

Where the bucket or container keeps versions (S3 bucket versioning, Azure blob versioning,
GCS object versioning, ``MemoryStore(versioning=True)``), a lost shard, index or upload
state need not be rebuilt from its journal. The version before the damage holds it whole:
the records it still carried unflushed (which a rebuild from the journal cannot bring back,
and so must fence every entry they may have touched), and every claim it held, which stays
valid. A store that keeps no versions, or none that will do, leaves the rebuild from the
journal as it was, and the report says why.

**Choosing** (``choose``): the versions newest first; delete markers, versions that do not
decode (or belong elsewhere) and versions written by a newer objmanifest are passed over, at
most ``LOOKS`` read. The first sound one must be at least as new as the object's journal: no
record of its blocks, nor of the records its damaged bytes still carry, nor a damaged block,
is of a later version, and a record of a version it carries too is the same commit. A
journal that goes further means the version is not the object's last state (its later
versions expired, or versioning was turned on late): what came after it is known only from
the journal, so the object is rebuilt from the journal, fenced as before. Replaying the
newer records on top of the version instead would restore nothing more: the blocks are
whole up to their last record, so the journal's own rebuild already holds all of it, and
what came after that record is lost either way.

**Restoring** (``restore``): a damaged object's bytes are copied aside first, as every
repair does. The version's bytes are then written back unchanged, by the CAS loop like any
write of a manifest object (``PutBack`` through ``Exact``, a codec that writes the kept
bytes as they are: no stamp, no record): create-only over a deleted object, conditional on
exactly the damaged bytes over a corrupt one, so nothing written meanwhile is replaced (a
valid object found there instead is left alone). Last, a named commit (``repair``) records
the restore in the object's journal: a version of its own that changes nothing (its
entries are as the kept version holds them). The object is thus exactly the kept version,
one journal record later, and the store keeps the kept bytes as a version of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

import shard_index

from ..cas.policy import Codec
from ..core.commit_events import Change
from ..core.model import JournalRecord, Shard
from ..errors import AccessDenied, CorruptShard, UnsupportedSchema
from ..store import Versioned
from ..store.errors import NoSuchObject
from .mend import Found, Place, copy_aside
from .reports import Action, KeptVersion, Kind, ObjectRepair, RestoredEntry

T = TypeVar("T")

LOOKS = 32
"""How many kept versions of one object repair reads at most, newest first, for a sound
one (delete markers cost no read)."""

NONE_KEPT = (
    "the store keeps no versions of it (where the bucket keeps object versions, repair "
    "restores such an object exactly: see the stores page, 'Object versions')"
)


@dataclass(frozen=True)
class Chosen(Generic[T]):
    """The kept version an object is restored from: what it is, its bytes and its document."""

    version: KeptVersion
    body: bytes
    doc: T


def choose(
    place: Place,
    key: str,
    codec: Codec[T],
    records: Sequence[JournalRecord],
    unknown_last: int = 0,
) -> Chosen[T] | str:
    """The newest sound version the store keeps of ``key`` that is at least as new as its
    journal (``records``: its blocks' and its damaged bytes'; ``unknown_last``: the last
    version a damaged block of it covered), or why there is none, in words."""
    store = place.store
    if not isinstance(store, Versioned):
        return NONE_KEPT
    try:
        kept = store.versions(key)
        if kept is None:
            return NONE_KEPT
        read = markers = unsound = 0
        for version in kept:
            if version.deleted:
                markers += 1
                continue
            if read == LOOKS:
                return f"none of the newest {LOOKS} versions the store keeps of it is sound"
            read += 1
            try:
                blob = store.get_version(key, version.version_id)
            except NoSuchObject:  # expired since the listing
                continue
            try:
                doc = codec.decode(key, blob.body)
                codec.journal(doc)  # the index's records are read here: malformed is damage
            except (CorruptShard, UnsupportedSchema):
                unsound += 1
                continue
            found = KeptVersion(version.version_id, version.at, blob.etag, codec.version(doc))
            problem = _behind(codec, doc, records, unknown_last)
            if problem:
                return f"its newest sound version ({said(found)}) {problem}"
            return Chosen(found, blob.body, doc)
    except AccessDenied:
        return (
            "the store refused to list or read its versions (AccessDenied): the role that "
            "runs repair needs them (`objmanifest iam-policy --for admin`)"
        )
    if not read:
        gone = f" but {markers} delete marker(s)" if markers else ""
        return f"the store keeps no earlier version of it{gone}"
    return f"none of the {read} version(s) the store keeps of it is sound ({unsound} damaged)"


def _behind(codec: Codec[T], doc: T, records: Sequence[JournalRecord], unknown_last: int) -> str:
    """Why ``doc`` is not the object's last known state, or "" if it is."""
    version = codec.version(doc) or 0
    newest = max([unknown_last, *(r.version for r in records)])
    if version < newest:
        return f"is older than its journal, which goes on to version {newest}"
    journal = codec.journal(doc)
    carried = {r.version: r.commit_id for r in journal[1]} if journal is not None else {}
    for record in records:
        if carried.get(record.version, record.commit_id) != record.commit_id:
            return (
                f"is of another history than its journal (version {record.version} is "
                "another commit there)"
            )
    return ""


def said(version: KeptVersion) -> str:
    """A kept version, for a person: its id, when, and the object's own version."""
    at = f" of {version.at.isoformat()}" if version.at is not None else ""
    own = f", object version {version.object_version}" if version.object_version else ""
    return f"version {version.version_id}{at}{own}"


@dataclass(frozen=True)
class RecordRestore:
    """The restore of a kept version in the object's journal: a version of its own that
    changes nothing (``bump`` makes the next version where the codec's stamp does not: the
    index); nothing to write once the object is no longer the version restored or a later
    one (deleted again meanwhile)."""

    codec: Codec[Any]
    restored: int
    bump: Callable[[Any], Any]
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(self, doc: Any, now: datetime) -> tuple[Any, bool]:
        if (self.codec.version(doc) or 0) < self.restored:
            return None, False
        return self.bump(doc), True


def same(doc: T) -> T:
    """The next version of a document whose codec's stamp counts versions itself."""
    return doc


def next_index(doc: shard_index.ShardIndex) -> shard_index.ShardIndex:
    """The next version of the index (its codec's stamp leaves the version to its changes)."""
    return doc.with_meta(doc.meta, doc.version + 1)


@dataclass(frozen=True)
class Exact(Generic[T]):
    """``inner``, but a write of ``doc`` sends ``body``, the bytes it was decoded from, as
    they are: nothing stamped, no journal record (the kept version's own records are in
    it)."""

    inner: Codec[T]
    doc: T
    body: bytes

    @property
    def repair(self) -> str:
        return self.inner.repair

    def decode(self, key: str, body: bytes) -> T:
        return self.inner.decode(key, body)

    def encode(self, doc: T) -> bytes:
        return self.body if doc is self.doc else self.inner.encode(doc)

    def empty(self) -> T:
        return self.inner.empty()

    def stamp(self, doc: T, commit_id: str) -> T:
        return doc

    def commit_ids(self, doc: T) -> Sequence[str]:
        return self.inner.commit_ids(doc)

    def version(self, doc: T) -> int | None:
        return self.inner.version(doc)

    def transitions(self, before: T, after: T) -> Sequence[Change]:
        return ()

    def journal(self, doc: T) -> None:
        return None

    def with_journal(self, doc: T, journal_id: str, records: Sequence[JournalRecord]) -> T:
        return doc


@dataclass(frozen=True)
class PutBack(Generic[T]):
    """The kept version in place of a deleted or corrupt object (which the loop shows as
    empty); True once the object is it, whoever wrote it (a lost answer re-read), False if
    a valid object is there instead, which is left alone."""

    codec: Exact[T]
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(self, doc: T, now: datetime) -> tuple[T | None, bool]:
        inner, kept = self.codec.inner, self.codec.doc
        if inner.version(doc) or inner.commit_ids(doc):
            there = inner.version(doc) == inner.version(kept)
            return None, there and inner.commit_ids(doc) == inner.commit_ids(kept)
        return kept, True


def restore(
    place: Place,
    found: Found,
    codec: Codec[T],
    chosen: Chosen[T],
    dry_run: bool,
    bump: Callable[[Any], Any] = same,
) -> tuple[Action, str | None]:
    """Put ``chosen``'s bytes back at ``found.key`` (a corrupt object's copied aside first),
    then journal the restore: what was done, and where the damaged bytes went."""
    if dry_run:
        return "would restore", None
    moved = over = None
    if found.damage == "corrupt":
        moved = copy_aside(place.store, place.layout, found.key, found.body, "object")
        over = found.etag
    else:
        place.docs.forget(found.key)
    exact = Exact(codec, chosen.doc, chosen.body)
    if not place.docs.commit(found.key, exact, PutBack(exact), over=over):
        return "left alone", moved
    restored = codec.version(chosen.doc) or 0
    place.docs.commit(found.key, codec, RecordRestore(codec, restored, bump))
    return "restored", moved


def attempt(
    place: Place,
    found: Found,
    kind: Kind,
    codec: Codec[T],
    records: Sequence[JournalRecord],
    dry_run: bool,
    unknown_last: int = 0,
    bump: Callable[[Any], Any] = same,
) -> tuple[ObjectRepair, T | None] | str:
    """``found`` restored from the newest kept version that will do (``choose``, then
    ``restore``): the report, and the document it holds now (None if it was left alone);
    or why no kept version will do, in words."""
    chosen = choose(place, found.key, codec, records, unknown_last)
    if isinstance(chosen, str):
        return chosen
    action, moved = restore(place, found, codec, chosen, dry_run, bump)
    journal = codec.journal(chosen.doc)
    doc = chosen.doc
    entries = shard_entries(doc, chosen.version) if isinstance(doc, Shard) else ()
    report = ObjectRepair(
        key=found.key,
        kind=kind,
        damage=found.damage or "deleted",
        problem=found.problem,
        action=action,
        moved_to=moved,
        records=len(journal[1]) if journal is not None else 0,
        journal_complete=True,
        entries=entries,
        source="version",
        version=chosen.version,
    )
    return report, None if action == "left alone" else doc


def shard_entries(doc: Shard, version: KeptVersion) -> tuple[RestoredEntry, ...]:
    """Every entry of a restored shard, as the kept version holds it."""
    rule = f"as {said(version)} holds it"
    return tuple(
        RestoredEntry(e.file_id, e.state.value, e.epoch, e.state.value, e.epoch, rule)
        for e in sorted(doc.entries.values(), key=lambda e: e.file_id)
    )


__all__ = ["LOOKS", "Chosen", "RecordRestore", "attempt", "choose", "next_index", "restore"]
