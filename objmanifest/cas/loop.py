"""The one compare-and-swap loop over manifest objects, with a per-object read cache.

Everything that changes a manifest object hands ``Documents.commit`` a named command (a
pure change with a name and an actor); this is the only code that writes manifest objects.
Updates use ``If-Match`` and creations ``If-None-Match: *``. A commit is tried first on the
cached version, so a warm, uncontended commit is one PUT; a lost race re-reads (a 304 if
nothing changed), re-applies the change and tries again with jittered backoff, a bounded
number of times.

Commits of one object from threads of one process are grouped: while a write of the
object is in flight, further commits to it queue up; when it finishes, one of them leads
the next write, which carries every queued command (up to ``CasPolicy.max_group``),
applied in order, each on the result of the one before, in one conditional PUT. Each
member is a version of its own (its own journal record and event), and each caller gets
its own result, or its own refusal: a refused member is left out of the write, the others
go on. A group is retried, recognised after a lost answer and judged fresh as one.

Each write carries its commit id, and every attempt's id differs, so after a write whose
answer was lost (or a client retry that met its own earlier write) the re-read tells "my
attempt landed" from "someone else won": a change is never applied twice.

Every commit that lands is published once to the observers (``core.commit_events``), and, for an
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

import logging
import math
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from ..core.commit_events import Change, CommitEvent, Observers
from ..core.model import JournalRecord
from ..errors import ConflictRetriesExhausted, CorruptShard, UnsupportedSchema
from ..store import CREATE, ObjectStore, PutMode
from ..store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed
from .blocks import BlockKey, BlockWriter
from .policy import CasPolicy, Codec, Command, Stats

log = logging.getLogger(__name__)


T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Version(Generic[T]):
    doc: T
    etag: str | None  # None: the object does not exist yet
    confirmed: float = -math.inf
    """When (the runtime's monotonic clock) this process last knew it was the object's
    current version: read (200 or 304), or written by a write that landed."""


@dataclass(eq=False)
class _Member(Generic[T, R]):
    """One call of ``commit``: its command, and once settled, what its caller gets."""

    command: Command[T, R]
    codec: Codec[T]
    over: str | None
    started: float = 0.0
    """When ``commit`` was called, on the runtime's monotonic clock."""
    done: bool = False
    result: R = field(init=False, repr=False)
    """What the command returned (set by ``settle``, with ``error``)."""
    error: BaseException | None = None
    event: CommitEvent | None = None

    def settle(self, result: R, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.done = True  # last: a caller woken early sees a member settled in full

    def outcome(self, observers: Observers) -> R:
        """Publish the member's event (if it landed a change), then its result or refusal:
        in its caller's thread, whichever thread wrote it."""
        if self.event is not None:
            observers.publish(self.event)
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Tried:
    """What one member's command did in one attempt: its result or refusal, and whether it
    changed the object (then the version it made, and what changed)."""

    member: _Member[Any, Any]
    result: Any = None
    error: Exception | None = None
    changed: bool = False
    version: int | None = None
    transitions: tuple[Change, ...] = ()


@dataclass
class _Attempt:
    """One write's members as they were applied, at the store's time ``at``."""

    commit_id: str
    at: datetime
    tried: list[_Tried]


class _Lane:
    """The commits of one object in this process: the write in flight, and the members
    queued behind it for the next one.

    A caller queues its member and waits until it is settled, or until no write is in
    flight: it then leads the next write, which carries its own member and those queued
    with it (``_take``). ``writing`` is held while a write is in flight; the leader's own
    thread may take it again (a store call, codec or command of the write that commits to
    the same object again runs alone, as inside a lock it holds)."""

    def __init__(self, max_group: int) -> None:
        self.max_group = max_group
        self.writing = threading.RLock()
        self.guard = threading.RLock()
        """Held to look at or change the queue and the leader (``changed``'s lock)."""
        self.changed = threading.Condition(self.guard)
        self.queue: list[_Member[Any, Any]] = []
        self.leader: int | None = None
        """The thread whose write is in flight, if one is."""

    def join(self, member: _Member[Any, Any]) -> None:
        with self.guard:
            self.queue.append(member)

    def lead(self, member: _Member[Any, Any]) -> list[_Member[Any, Any]] | None:
        """Wait until ``member`` is settled (None), or until this thread may lead the next
        write: the members it carries, taken from the queue."""
        with self.guard:
            while self.leader is not None and not member.done:
                self.changed.wait()
            if member.done:
                return None
            self.leader = threading.get_ident()
            return self._take(member)

    def _take(self, member: _Member[Any, Any]) -> list[_Member[Any, Any]]:
        """``member`` and those queued of its codec, in the order they came, up to
        ``max_group``; a commit over a corrupt version (``over``) goes alone."""
        if member.over is not None:
            batch = [member]
        else:
            codec = member.codec
            batch = [m for m in self.queue if m.over is None and m.codec == codec][: self.max_group]
            if member not in batch:  # members compare as themselves only
                batch[-1:] = [member]
        taken = {id(m) for m in batch}
        self.queue = [m for m in self.queue if id(m) not in taken]
        return batch

    def release(self) -> None:
        with self.guard:
            self.leader = None
            self.changed.notify_all()

    def withdraw(self, member: _Member[Any, Any]) -> None:
        """Take ``member`` out of the queue if no write has taken it yet."""
        with self.guard:
            self.queue = [m for m in self.queue if m is not member]


@dataclass
class Documents:
    """Cached, compare-and-swap access to manifest objects of one store.

    ``detached()`` gives a view with its own cache (and its own groups of commits) that
    shares the store, policy, counts and observers, for objects that should not stay cached
    for long.
    """

    store: ObjectStore
    policy: CasPolicy = field(default_factory=CasPolicy)
    stats: Stats = field(default_factory=Stats)
    observers: Observers = field(default_factory=Observers)
    block_key: BlockKey | None = None
    """Where journal blocks go; None: records stay in their objects (never flushed)."""

    def __post_init__(self) -> None:
        self._cache: dict[str, _Version[Any]] = {}
        self._lost: dict[str, float] = {}
        """When a write of each object last lost a race (the runtime's monotonic clock)."""
        self._lanes: dict[str, _Lane] = {}
        self._guard = threading.Lock()  # the lanes and every change of the cache
        self._blocks = BlockWriter(self.store, self.stats, self.block_key)

    def detached(self) -> Documents:
        docs = Documents(self.store, self.policy, self.stats, self.observers)
        docs._blocks = self._blocks
        return docs

    def _lane(self, key: str) -> _Lane:
        with self._guard:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(self.policy.max_group)
            return lane

    def _cache_from(self, key: str, seen: _Version[Any] | None, new: _Version[Any] | None) -> None:
        """Cache ``new`` (None: nothing) for ``key`` unless the cache changed since it held
        ``seen``: a read that raced a write never puts an older version over the newer."""
        with self._guard:
            if self._cache.get(key) is seen:
                if new is None:
                    self._cache.pop(key, None)
                else:
                    self._cache[key] = new

    def _refresh(self, key: str, codec: Codec[T], over: str | None = None) -> _Version[T]:
        cached = self._cache.get(key) if over is None else None
        self.stats.count("reads")
        try:
            blob = self.store.get(key, if_none_match=cached.etag if cached else None)
        except NoSuchObject:  # not created yet, or deleted: the codec's empty document
            self._cache_from(key, cached, None)
            return _Version(codec.empty(), None)
        if blob is None:
            assert cached is not None
            self.stats.count("not_modified")
            cached.confirmed = self.store.runtime.monotonic()
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
        version = _Version(doc, blob.etag, self.store.runtime.monotonic())
        self._cache_from(key, cached, version)
        return version

    def read(self, key: str, codec: Codec[T]) -> T:
        """The current version: a conditional GET, so an unchanged object costs no body. It
        does not wait for a write in flight (it returns the version before or after it)."""
        return self._refresh(key, codec).doc

    def peek(self, key: str) -> Any | None:
        """The cached version of ``key``, if there is one; no request."""
        found = self._cache.get(key)
        return None if found is None else found.doc

    def cached(self, key: str, codec: Codec[T]) -> T:
        """The cached version if there is one, else a read."""
        cached = self._cache.get(key)
        return cached.doc if cached is not None else self._refresh(key, codec).doc

    def likely_current(self, key: str) -> bool:
        """Whether the cached version of ``key`` was confirmed current less than
        ``policy.fresh_seconds`` ago, and no write of it has lost a race since (a loss at
        the same reading of the clock came first: the confirmation is its re-read); while
        one lost a race less than ``fresh_seconds`` ago, only a confirmation less than
        ``policy.contended_seconds`` old counts.

        A caller may then choose on the cached version without reading first, as long as
        what it chose is a commit: the commit's write is conditional on that version, so a
        stale one costs a 412, a re-read and the command applied again on the fresh version
        (and a refusal or no-op decided on it is checked by a read anyway). Saves the read
        of an object this process alone is writing. Where others write too, a version
        confirmed a while ago is likely stale, so it is read first; one this process wrote
        a moment ago is as fresh as a read would be, since the other writers' chance to
        come in between is the same one round trip either way."""
        cached = self._cache.get(key)
        if cached is None:
            return False
        now, policy = self.store.runtime.monotonic(), self.policy
        age = now - cached.confirmed
        lost = self._lost.get(key, -math.inf)
        if age >= policy.fresh_seconds or lost > cached.confirmed:
            return False
        return now - lost >= policy.fresh_seconds or age < policy.contended_seconds

    def lost_since(self, key: str, since: float) -> bool:
        """Whether a write of ``key`` lost a race at or after ``since`` (the runtime's
        monotonic clock): another writer was there meanwhile."""
        return self._lost.get(key, -math.inf) >= since

    def forget(self, key: str) -> None:
        """Drop the cached version of ``key`` (after the write in flight, if any)."""
        with self._lane(key).writing, self._guard:
            self._cache.pop(key, None)

    def commit(
        self, key: str, codec: Codec[T], command: Command[T, R], *, over: str | None = None
    ) -> R:
        """Apply ``command`` to the object until a conditional write of its result wins.

        Outcomes decided on a cached version that was not just validated (a refusal, or
        nothing to write) are believed only once a fresh read, or a write conditional on
        that version, shows it was current. ``over`` is the ETag of a corrupt version that
        may be replaced (a repair copied it aside first): while the object holds exactly it,
        ``command`` sees an empty object and its write is conditional on that ETag; any
        other corrupt version is refused. Such a commit is never grouped with others.

        While a write of ``key`` is in flight, the call waits, and its command goes out
        with the others queued meanwhile in the next write (see the module's docstring).
        """
        lane = self._lane(key)
        member: _Member[T, R] = _Member(command, codec, over, self.store.runtime.monotonic())
        if lane.leader == threading.get_ident():
            # Called again from within this thread's write in flight: it goes alone, first.
            self._write(key, lane, [member])
            return member.outcome(self.observers)
        try:
            lane.join(member)
            batch = lane.lead(member)
        except BaseException:  # interrupted while waiting: never applied after this
            lane.withdraw(member)
            raise
        if batch is not None:
            try:
                self._write(key, lane, batch)
            finally:
                lane.release()
        return member.outcome(self.observers)

    def _write(self, key: str, lane: _Lane, batch: list[_Member[T, Any]]) -> None:
        """Run one write carrying ``batch`` and settle every member; when the write fails,
        each gets the error (the leader's own caller too, through its member). Then start
        the journal blocks the version that landed made whole."""
        codec, over = batch[0].codec, batch[0].over
        try:
            with lane.writing:
                if over is not None:
                    with self._guard:
                        self._cache.pop(key, None)
                landed = self._commit(key, codec, batch, over)
        except BaseException as e:
            for member in batch:
                member.settle(None, e)
            return
        if landed is not None:
            self._flush_due(key, codec, *landed)

    def _commit(
        self, key: str, codec: Codec[T], members: list[_Member[T, Any]], over: str | None = None
    ) -> tuple[_Version[T], _Attempt] | None:
        """The version this write landed in and the attempt that made it; None when there
        was nothing to write."""
        runtime = self.store.runtime
        op = runtime.new_id()[:16]
        sent: dict[str, _Attempt] = {}  # commit id -> attempt that may have landed
        # Over a corrupt version the first version is a fresh read, whatever a read of
        # another thread cached meanwhile.
        current: _Version[T] | None = self._cache.get(key) if over is None else None
        validated = current is None
        if current is None:
            current = self._refresh(key, codec, over)
        attempt = lost = 0
        while True:
            if sent:
                for commit_id in reversed(codec.commit_ids(current.doc)):
                    if commit_id in sent:
                        self._landed(key, sent[commit_id])
                        return current, sent[commit_id]
            self._store_old_blocks(key, codec, current.doc)
            now = self.store.now()
            commit_id = f"{op}.{attempt + 1}"
            applied = self._apply(key, codec, members, commit_id, current.doc, now, lost)
            tried, stamped = applied
            if stamped is None:
                if validated:
                    for t in tried:
                        t.member.settle(t.result, t.error)
                    return None
                current, validated = self._refresh(key, codec, over), True
                continue
            attempt += 1
            if attempt > self.policy.max_attempts:
                raise ConflictRetriesExhausted(
                    f"gave up changing {self.store.describe(key)} after "
                    f"{self.policy.max_attempts} lost races; nothing was changed by this "
                    "call. Retry later, or spread the work over more stages."
                )
            mode = CREATE if current.etag is None else PutMode.update(current.etag)
            try:
                etag = self.store.put(
                    key, codec.encode(stamped), mode=mode, content_type="application/json"
                )
            except PreconditionFailed:
                self.stats.count("conflicts")
                lost += 1
                self._lost[key] = runtime.monotonic()
                sent[commit_id] = _Attempt(commit_id, now, tried)
                if validated:
                    runtime.sleep(self.policy.backoff(attempt, runtime.random()))
                current, validated = self._refresh(key, codec, over), True
                continue
            except OutcomeUnknown:
                self.stats.count("lost_responses")
                sent[commit_id] = _Attempt(commit_id, now, tried)
                current, validated = self._refresh(key, codec, over), True
                continue
            written_version = _Version(stamped, etag, runtime.monotonic())
            with self._guard:
                self._cache[key] = written_version
            landed = _Attempt(commit_id, now, tried)
            self._landed(key, landed)
            return written_version, landed

    def _apply(
        self,
        key: str,
        codec: Codec[T],
        members: list[_Member[T, Any]],
        commit_id: str,
        doc: T,
        now: datetime,
        lost: int,
    ) -> tuple[list[_Tried], T | None]:
        """Every member's command applied in order, each on the version the one before
        made, stamped with ``commit_id`` and carrying its journal record (a refused member,
        or one with nothing to write, leaves the version as it was); and the version the
        last change made, None if none changed anything. The first record of the write
        carries the races it ``lost`` before this attempt."""
        tried: list[_Tried] = []
        written: T | None = None
        for member in members:
            command = member.command
            try:
                new_doc, result = command.apply(doc, now)
            except Exception as e:  # a refusal (or a broken command): this member's own
                tried.append(_Tried(member, error=e))
                continue
            if new_doc is None:
                tried.append(_Tried(member, result))
                continue
            stamped = codec.stamp(new_doc, commit_id)
            transitions = tuple(codec.transitions(doc, stamped))
            doc = written = self._journaled(
                key, codec, command, commit_id, stamped, now, transitions, lost
            )
            lost = 0
            tried.append(_Tried(member, result, None, True, codec.version(doc), transitions))
        return tried, written

    def _landed(self, key: str, attempt: _Attempt) -> None:
        """Settle every member of a write that landed; each that changed the object gets
        the event of its own version."""
        changed = 0
        landed_at = self.store.runtime.monotonic()
        for t in attempt.tried:
            if t.changed:
                changed += 1
                t.member.event = CommitEvent(
                    key=key,
                    version=t.version,
                    command=t.member.command.name,
                    actor=t.member.command.actor,
                    commit_id=attempt.commit_id,
                    at=attempt.at,
                    transitions=t.transitions,
                    seconds=max(0.0, landed_at - t.member.started),
                )
            t.member.settle(t.result, t.error)
        self.stats.landed(changed)

    # -- the journal ---------------------------------------------------------------------

    def _journaled(
        self,
        key: str,
        codec: Codec[T],
        command: Command[T, Any],
        commit_id: str,
        after: T,
        at: datetime,
        transitions: tuple[Change, ...],
        lost: int,
    ) -> T:
        """``after`` carrying its own journal record, without the records whose block is
        known to be stored."""
        journal = codec.journal(after)
        version = codec.version(after)
        if journal is None or version is None:
            return after
        journal_id, records = journal
        journal_id = journal_id or self.store.runtime.new_id()
        record = JournalRecord.of_commit(
            version, commit_id, command.name, command.actor, at, transitions, lost or None
        )
        kept = self._blocks.unstored(key, journal_id, records)
        return codec.with_journal(after, journal_id, (*kept, record))

    def _flush_due(self, key: str, codec: Codec[T], landed: _Version[T], attempt: _Attempt) -> None:
        """Start writing every whole block the write that landed made whole, unless it is
        known to be stored."""
        journal = codec.journal(landed.doc)
        if journal is not None:
            journal_id, records = journal
            assert journal_id is not None  # every journaled version was given one
            # Each member that changed a journaled object made a version with its number.
            since = min(t.version for t in attempt.tried if t.version is not None)
            self._blocks.write_due(key, journal_id, records, since)

    def _store_old_blocks(self, key: str, codec: Codec[T], doc: T) -> None:
        """Before a write over ``doc``: its old whole blocks stored (``BlockWriter.store_old``)
        so the write drops them."""
        journal = codec.journal(doc)
        version = codec.version(doc)
        if journal is not None and version is not None:
            self._blocks.store_old(key, journal[0], journal[1], version)

    def flush(self) -> None:
        """Wait until every journal block started so far is written (or failed)."""
        self._blocks.flush()
