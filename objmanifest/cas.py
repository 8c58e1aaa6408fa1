"""The one compare-and-swap loop over manifest objects, with a per-object read cache.

Everything that changes a manifest object hands ``Documents.commit`` a named command (a
pure change with a name and an actor); this is the only code that writes manifest objects.
Updates use ``If-Match`` and creations ``If-None-Match: *``. A commit is tried first on the
cached version, so a warm, uncontended commit is one PUT; a lost race re-reads (a 304 if
nothing changed), re-applies the change and tries again with jittered backoff, a bounded
number of times.

Each written version carries its commit id, and every attempt's id differs, so after a
write whose answer was lost (or a client retry that met its own earlier write) the re-read
tells "my attempt landed" from "someone else won": a change is never applied twice.

Every commit that lands is published once to the observers (``events.py``), and, for an
object at the journal's schema, leaves exactly one journal record: it is written inside the
version it describes, so it lands (or not) with the commit itself, and costs no request of
its own. Once the object carries a whole block of ``BLOCK`` records, they are copied to a
write-once block object in the background (``If-None-Match: *`` at a key derived from the
versions it covers, so two writers of one block cannot disagree), and the next commit that
knows the block is stored drops them from the object. A writer that dies anywhere in that
sequence loses nothing: the records stay in the object until a block holds them.

This module knows nothing of shards, entries or uploads: a ``Codec`` says how to read,
write and stamp one kind of object, and what a change did to it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from .errors import (
    ConflictRetriesExhausted,
    CorruptShard,
    NotFound,
    ObjManifestError,
    OutcomeUnknown,
    PreconditionFailed,
    UnsupportedSchema,
)
from .events import Change, CommitEvent, Observers
from .model import JournalBlock, JournalRecord
from .store import CREATE, ObjectStore, PutMode

log = logging.getLogger(__name__)

BLOCK = 32
"""Journal records per block: one block PUT per this many commits of an object, so the
journal costs about 1/32 of a request per commit, and an object carries at most about
twice this many records."""

BlockKey = Callable[[str, str, int, int], str]
"""(object key, journal id, first version, last version) -> the block's key."""

T = TypeVar("T")
R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)
R_co = TypeVar("R_co", covariant=True)


class Codec(Protocol[T]):
    """How one kind of manifest object is read, written and stamped."""

    @property
    def repair(self) -> str:
        """What a user can do about a corrupt object of this kind, for ``CorruptShard``."""
        ...

    def decode(self, key: str, body: bytes) -> T: ...
    def encode(self, doc: T) -> bytes: ...
    def empty(self) -> T: ...
    def stamp(self, doc: T, commit_id: str) -> T: ...
    def commit_ids(self, doc: T) -> Sequence[str]: ...
    def version(self, doc: T) -> int | None: ...
    def transitions(self, before: T, after: T) -> Sequence[Change]: ...
    def journal(self, doc: T) -> tuple[str | None, tuple[JournalRecord, ...]] | None:
        """The journal id and records ``doc`` carries; None if its schema has no journal."""
        ...

    def with_journal(self, doc: T, journal_id: str, records: Sequence[JournalRecord]) -> T: ...


class Command(Protocol[T, R_co]):
    """A named change: ``apply(doc, store_time) -> (new doc | None, result)``.

    ``apply`` must be pure: the loop may call it several times, on fresher versions, until
    its write wins. A new doc of None means "nothing to write"; a refusal is raised as an
    ``ObjManifestError``.
    """

    @property
    def name(self) -> str: ...
    @property
    def actor(self) -> str: ...
    def apply(self, doc: T, now: datetime) -> tuple[T | None, R_co]: ...


@dataclass(frozen=True)
class CasPolicy:
    """How hard a commit tries before giving up with ``ConflictRetriesExhausted``."""

    max_attempts: int = 100
    base_delay: float = 0.01
    max_delay: float = 1.0

    def backoff(self, attempt: int, rand: float) -> float:
        """The pause after lost race number ``attempt``; ``rand`` is uniform in [0, 1)."""
        return rand * min(self.max_delay, self.base_delay * float(2 ** min(attempt, 16)))


_COUNTING = threading.Lock()


@dataclass
class Stats:
    """Counts for metrics and the demo's summary: commits that landed (whether their answer
    came back or the re-read recognised them), lost races, reads, 304s, lost answers."""

    commits: int = 0
    conflicts: int = 0
    reads: int = 0
    not_modified: int = 0
    lost_responses: int = 0
    journal_blocks: int = 0
    """Journal blocks this process wrote (or found written by another)."""

    def count(self, name: str) -> None:
        """Add one to ``name``; safe from any thread (commits of different objects run in
        parallel and share these counts)."""
        with _COUNTING:
            setattr(self, name, getattr(self, name) + 1)


@dataclass
class _Version(Generic[T]):
    doc: T
    etag: str | None  # None: the object does not exist yet


@dataclass
class _Sent(Generic[T, R]):
    """An attempt that may have landed: its result and the event to publish if it did."""

    result: R
    before: T
    after: T
    at: datetime


def block_end(version: int) -> int:
    """The last version of the block ``version`` belongs to: blocks end at multiples of
    ``BLOCK``."""
    return -(-version // BLOCK) * BLOCK


class BlockWriter:
    """Writes whole blocks of journal records in the background, one at a time, and
    remembers which blocks are stored, so a commit drops only records a block holds.

    A block is the records of one object incarnation that end at a multiple of ``BLOCK``;
    it is whole once the object carries the record of its last version (it starts at the
    oldest record the object carries in its range: after a migration, the first block
    starts at the first journaled version).
    """

    def __init__(self, store: ObjectStore, stats: Stats, block_key: BlockKey | None) -> None:
        self.store = store
        self.stats = stats
        self.block_key = block_key
        self._stored: set[tuple[str, str, int]] = set()  # (key, journal id, block end)
        self._started: dict[tuple[str, str, int], cf.Future[None]] = {}
        self._guard = threading.RLock()  # held while a job is submitted; a job takes it too
        self._pool: cf.Executor | None = None

    def unstored(
        self, key: str, journal_id: str, records: Sequence[JournalRecord]
    ) -> list[JournalRecord]:
        with self._guard:
            stored = self._stored
            return [r for r in records if (key, journal_id, block_end(r.version)) not in stored]

    def write_due(self, key: str, journal_id: str, records: Sequence[JournalRecord]) -> None:
        if self.block_key is None:
            return
        blocks: dict[int, list[JournalRecord]] = {}
        for record in records:
            blocks.setdefault(block_end(record.version), []).append(record)
        with self._guard:
            # A finished job is forgotten: stored, or failed and due to be sent again.
            self._started = {j: f for j, f in self._started.items() if not f.done()}
        for end, block in sorted(blocks.items()):
            # Records are contiguous (each version adds the next; only whole blocks leave),
            # so a block is whole once it holds its last version.
            job = (key, journal_id, end)
            with self._guard:
                # A stored block is not sent again, though the doc still carries it.
                if block[-1].version != end or job in self._started or job in self._stored:
                    continue
                if self._pool is None:
                    self._pool = self.store.runtime.pool(1, "objmanifest-journal")
                self._started[job] = self._pool.submit(self._write, key, journal_id, block)

    def _write(self, key: str, journal_id: str, records: list[JournalRecord]) -> None:
        first, last = records[0].version, records[-1].version
        assert self.block_key is not None
        block_key = self.block_key(key, journal_id, first, last)
        block = JournalBlock(
            object_key=key, journal_id=journal_id, first=first, last=last, records=tuple(records)
        )
        try:
            # A 412: written already, by another agent or an earlier attempt of ours.
            with contextlib.suppress(PreconditionFailed):
                body = block.model_dump_json(exclude_none=True).encode()
                self.store.put(block_key, body, mode=CREATE)
            self.stats.count("journal_blocks")
            with self._guard:
                self._stored.add((key, journal_id, last))
        except ObjManifestError as e:
            # The records stay in the object; whoever commits to it next tries again.
            log.warning("could not write journal block %s: %s", block_key, e)

    def flush(self) -> None:
        """Wait until every block started so far is written (or failed)."""
        with self._guard:
            started = list(self._started.values())
        cf.wait(started)


@dataclass
class Documents:
    """Cached, compare-and-swap access to manifest objects of one store.

    ``detached()`` gives a view with its own cache that shares the store, policy, counts
    and observers, for objects that should not stay cached for long.
    """

    store: ObjectStore
    policy: CasPolicy = field(default_factory=CasPolicy)
    stats: Stats = field(default_factory=Stats)
    observers: Observers = field(default_factory=Observers)
    block_key: BlockKey | None = None
    """Where journal blocks go; None: records stay in their objects (never flushed)."""

    def __post_init__(self) -> None:
        self._cache: dict[str, _Version[Any]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self._blocks = BlockWriter(self.store, self.stats, self.block_key)

    def detached(self) -> Documents:
        docs = Documents(self.store, self.policy, self.stats, self.observers)
        docs._blocks = self._blocks
        return docs

    def _lock(self, key: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(key, threading.RLock())

    def _refresh(self, key: str, codec: Codec[T], over: str | None = None) -> _Version[T]:
        cached = self._cache.get(key) if over is None else None
        self.stats.count("reads")
        try:
            blob = self.store.get(key, if_none_match=cached.etag if cached else None)
        except NotFound:
            self._cache.pop(key, None)
            return _Version(codec.empty(), None)
        if blob is None:
            assert cached is not None
            self.stats.count("not_modified")
            return cached
        try:
            doc = codec.decode(key, blob.body)
        except CorruptShard as e:
            if over is not None and blob.etag == over:
                # The damaged version a repair copied aside: it reads as empty, and only a
                # write conditional on exactly these bytes can replace it.
                return _Version(codec.empty(), blob.etag)
            raise e.at(self.store.describe(key), codec.repair) from None
        except UnsupportedSchema as e:
            raise e.at(self.store.describe(key), codec.repair) from None
        version = _Version(doc, blob.etag)
        self._cache[key] = version
        return version

    def read(self, key: str, codec: Codec[T]) -> T:
        """The current version: a conditional GET, so an unchanged object costs no body."""
        with self._lock(key):
            return self._refresh(key, codec).doc

    def cached(self, key: str, codec: Codec[T]) -> T:
        """The cached version if there is one, else a read."""
        with self._lock(key):
            cached = self._cache.get(key)
            return cached.doc if cached is not None else self._refresh(key, codec).doc

    def forget(self, key: str) -> None:
        """Drop the cached version of ``key``."""
        with self._lock(key):
            self._cache.pop(key, None)

    def commit(
        self, key: str, codec: Codec[T], command: Command[T, R], *, over: str | None = None
    ) -> R:
        """Apply ``command`` to the object until a conditional write of its result wins.

        Outcomes decided on a cached version that was not just validated (a refusal, or
        nothing to write) are checked against a fresh read before they are believed.
        ``over`` is the ETag of a corrupt version that may be replaced (a repair copied it
        aside first): while the object holds exactly it, ``command`` sees an empty object
        and its write is conditional on that ETag; any other corrupt version is refused.
        """
        with self._lock(key):
            if over is not None:
                self._cache.pop(key, None)
            result, event, landed = self._commit(key, codec, command, over)
        if event is not None:
            self.observers.publish(event)
        if landed is not None:
            self._flush_due(key, codec, landed.doc)
        return result

    def _commit(
        self, key: str, codec: Codec[T], command: Command[T, R], over: str | None = None
    ) -> tuple[R, CommitEvent | None, _Version[T] | None]:
        runtime = self.store.runtime
        op = runtime.new_id()[:16]
        sent: dict[str, _Sent[T, R]] = {}  # commit id -> attempt that may have landed
        current: _Version[T] | None = self._cache.get(key)
        validated = current is None
        if current is None:
            current = self._refresh(key, codec, over)
        attempt = 0
        while True:
            if sent:
                for commit_id in reversed(codec.commit_ids(current.doc)):
                    if commit_id in sent:
                        landed = sent[commit_id]
                        self.stats.count("commits")
                        event = self._event(
                            key, codec, command, commit_id, landed.before, landed.after, landed.at
                        )
                        return landed.result, event, current
            now = self.store.now()
            try:
                new_doc, result = command.apply(current.doc, now)
            except ObjManifestError:
                if validated:
                    raise
                current, validated = self._refresh(key, codec, over), True
                continue
            if new_doc is None:
                if validated:
                    return result, None, None
                current, validated = self._refresh(key, codec, over), True
                continue
            attempt += 1
            if attempt > self.policy.max_attempts:
                raise ConflictRetriesExhausted(
                    f"gave up changing {self.store.describe(key)} after "
                    f"{self.policy.max_attempts} lost races; nothing was changed by this "
                    "call. Retry later, or spread the work over more stages."
                )
            commit_id = f"{op}.{attempt}"
            stamped = self._journaled(
                key, codec, command, commit_id, current.doc, codec.stamp(new_doc, commit_id), now
            )
            mode = CREATE if current.etag is None else PutMode.update(current.etag)
            try:
                etag = self.store.put(
                    key, codec.encode(stamped), mode=mode, content_type="application/json"
                )
            except PreconditionFailed:
                self.stats.count("conflicts")
                sent[commit_id] = _Sent(result, current.doc, stamped, now)
                if validated:
                    runtime.sleep(self.policy.backoff(attempt, runtime.random()))
                current, validated = self._refresh(key, codec, over), True
                continue
            except OutcomeUnknown:
                self.stats.count("lost_responses")
                sent[commit_id] = _Sent(result, current.doc, stamped, now)
                current, validated = self._refresh(key, codec, over), True
                continue
            before = current.doc
            self._cache[key] = written = _Version(stamped, etag)
            self.stats.count("commits")
            event = self._event(key, codec, command, commit_id, before, stamped, now)
            return result, event, written

    # -- the journal ---------------------------------------------------------------------

    def _journaled(
        self,
        key: str,
        codec: Codec[T],
        command: Command[T, R],
        commit_id: str,
        before: T,
        after: T,
        at: datetime,
    ) -> T:
        """``after`` carrying its own journal record, without the records whose block is
        known to be stored."""
        journal = codec.journal(after)
        version = codec.version(after)
        if journal is None or version is None:
            return after
        journal_id, records = journal
        journal_id = journal_id or self.store.runtime.new_id()
        record = JournalRecord(
            version=version,
            commit_id=commit_id,
            command=command.name,
            actor=command.actor,
            at=at,
            transitions=tuple(codec.transitions(before, after)),
        )
        kept = self._blocks.unstored(key, journal_id, records)
        return codec.with_journal(after, journal_id, [*kept, record])

    def _flush_due(self, key: str, codec: Codec[T], doc: T) -> None:
        """Start writing every whole block ``doc`` carries that is not known to be stored."""
        journal = codec.journal(doc)
        if journal is not None:
            journal_id, records = journal
            assert journal_id is not None  # every journaled version was given one
            self._blocks.write_due(key, journal_id, records)

    def flush(self) -> None:
        """Wait until every journal block started so far is written (or failed)."""
        self._blocks.flush()

    def _event(
        self,
        key: str,
        codec: Codec[T],
        command: Command[T, R],
        commit_id: str,
        before: T,
        after: T,
        at: datetime,
    ) -> CommitEvent:
        return CommitEvent(
            key=key,
            version=codec.version(after),
            command=command.name,
            actor=command.actor,
            commit_id=commit_id,
            at=at,
            transitions=tuple(codec.transitions(before, after)),
        )
