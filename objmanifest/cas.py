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

Every commit that lands is published once to the observers (``events.py``). This module
knows nothing of shards, entries or uploads: a ``Codec`` says how to read, write and stamp
one kind of object, and what a change did to it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
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
from .events import CommitEvent, Observers, Transition
from .store import CREATE, ObjectStore, PutMode

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
    def transitions(self, before: T, after: T) -> Sequence[Transition]: ...


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

    def __post_init__(self) -> None:
        self._cache: dict[str, _Version[Any]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def detached(self) -> Documents:
        return Documents(self.store, self.policy, self.stats, self.observers)

    def _lock(self, key: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(key, threading.RLock())

    def _refresh(self, key: str, codec: Codec[T]) -> _Version[T]:
        cached = self._cache.get(key)
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
        except (CorruptShard, UnsupportedSchema) as e:
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

    def commit(self, key: str, codec: Codec[T], command: Command[T, R]) -> R:
        """Apply ``command`` to the object until a conditional write of its result wins.

        Outcomes decided on a cached version that was not just validated (a refusal, or
        nothing to write) are checked against a fresh read before they are believed.
        """
        with self._lock(key):
            result, event = self._commit(key, codec, command)
        if event is not None:
            self.observers.publish(event)
        return result

    def _commit(
        self, key: str, codec: Codec[T], command: Command[T, R]
    ) -> tuple[R, CommitEvent | None]:
        runtime = self.store.runtime
        op = runtime.new_id()[:16]
        sent: dict[str, _Sent[T, R]] = {}  # commit id -> attempt that may have landed
        current: _Version[T] | None = self._cache.get(key)
        validated = current is None
        if current is None:
            current = self._refresh(key, codec)
        attempt = 0
        while True:
            if sent:
                for commit_id in reversed(codec.commit_ids(current.doc)):
                    if commit_id in sent:
                        landed = sent[commit_id]
                        self.stats.count("commits")
                        return landed.result, self._event(
                            key, codec, command, commit_id, landed.before, landed.after, landed.at
                        )
            now = self.store.now()
            try:
                new_doc, result = command.apply(current.doc, now)
            except ObjManifestError:
                if validated:
                    raise
                current, validated = self._refresh(key, codec), True
                continue
            if new_doc is None:
                if validated:
                    return result, None
                current, validated = self._refresh(key, codec), True
                continue
            attempt += 1
            if attempt > self.policy.max_attempts:
                raise ConflictRetriesExhausted(
                    f"gave up changing {self.store.describe(key)} after "
                    f"{self.policy.max_attempts} lost races; nothing was changed by this "
                    "call. Retry later, or spread the work over more stages."
                )
            commit_id = f"{op}.{attempt}"
            stamped = codec.stamp(new_doc, commit_id)
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
                current, validated = self._refresh(key, codec), True
                continue
            except OutcomeUnknown:
                self.stats.count("lost_responses")
                sent[commit_id] = _Sent(result, current.doc, stamped, now)
                current, validated = self._refresh(key, codec), True
                continue
            before = current.doc
            self._cache[key] = _Version(stamped, etag)
            self.stats.count("commits")
            return result, self._event(key, codec, command, commit_id, before, stamped, now)

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
