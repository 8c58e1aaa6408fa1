"""The one compare-and-swap loop over manifest objects, with a per-object read cache.

Everything that changes a shard or the index hands ``Documents.commit`` a pure change; this
is the only code that writes them. Updates use ``If-Match`` and creations
``If-None-Match: *``. A commit is tried first on the cached version, so a warm, uncontended
commit is one PUT; a lost race re-reads (a 304 if nothing changed), re-applies the change
and tries again with jittered backoff, a bounded number of times.

Each written version carries its commit id, and every attempt's id differs, so after a
write whose answer was lost (or a client retry that met its own earlier write) the re-read
tells "my attempt landed" from "someone else won": a change is never applied twice.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from pydantic import ValidationError

import shard_index

from .errors import (
    ConflictRetriesExhausted,
    CorruptShard,
    DeclarationConflict,
    DependencyCycle,
    NotFound,
    ObjManifestError,
    UnsupportedSchema,
)
from .model import COMMITS_KEPT, SCHEMA_VERSION, Shard
from .store import OutcomeUnknown, PreconditionFailed, Store

T = TypeVar("T")
R = TypeVar("R")

Change = Callable[[T, datetime], "tuple[T | None, R]"]


class Codec(Protocol[T]):
    """How one kind of manifest object is read, written and stamped."""

    def decode(self, key: str, body: bytes) -> T: ...
    def encode(self, doc: T) -> bytes: ...
    def empty(self) -> T: ...
    def stamp(self, doc: T, commit_id: str) -> T: ...
    def commit_ids(self, doc: T) -> Sequence[str]: ...


def load_json(key: str, body: bytes, supported: int) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptShard(key, f"not JSON: {e}") from None
    if not isinstance(data, dict):
        raise CorruptShard(key, "not a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise CorruptShard(key, "no integer schema_version")
    if version > supported:
        raise UnsupportedSchema(key, version, supported)
    return data


@dataclass(frozen=True)
class ShardCodec:
    task_id: str
    stage: str

    def decode(self, key: str, body: bytes) -> Shard:
        data = load_json(key, body, SCHEMA_VERSION)
        try:
            shard = Shard.model_validate(data)
        except ValidationError as e:
            raise CorruptShard(key, f"does not match the shard schema: {e.errors()[:3]}") from None
        if shard.stage != self.stage or shard.task_id != self.task_id:
            raise CorruptShard(key, f"belongs to task {shard.task_id!r} stage {shard.stage!r}")
        return shard

    def encode(self, doc: Shard) -> bytes:
        return doc.model_dump_json(exclude_none=True).encode()

    def empty(self) -> Shard:
        return Shard(task_id=self.task_id, stage=self.stage)

    def stamp(self, doc: Shard, commit_id: str) -> Shard:
        commits = (*doc.commits, commit_id)[-COMMITS_KEPT:]
        return doc.model_copy(update={"version": doc.version + 1, "commits": commits})

    def commit_ids(self, doc: Shard) -> Sequence[str]:
        return doc.commits


class IndexCodec:
    """The cross-shard index. Its changes are idempotent declarations, so it needs no
    commit ids: re-applying a change that landed is a no-op."""

    def decode(self, key: str, body: bytes) -> shard_index.ShardIndex:
        load_json(key, body, shard_index.ShardIndex.SCHEMA_VERSION)
        try:
            return shard_index.ShardIndex.from_json(body)
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


def index_error(e: shard_index.ShardIndexError) -> ObjManifestError:
    """The index package knows nothing of objmanifest; give its refusals our types."""
    if isinstance(e, shard_index.DependencyCycle):
        return DependencyCycle(f"refused: it would make a dependency cycle: {e}")
    return DeclarationConflict(str(e))


@dataclass(frozen=True)
class CasPolicy:
    """How hard a commit tries before giving up with ``ConflictRetriesExhausted``."""

    max_attempts: int = 100
    base_delay: float = 0.01
    max_delay: float = 1.0

    def backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2 ** min(attempt, 16)))


@dataclass
class Stats:
    """Counts for metrics and the demo's summary."""

    commits: int = 0
    conflicts: int = 0
    reads: int = 0
    not_modified: int = 0
    lost_responses: int = 0


@dataclass
class _Version(Generic[T]):
    doc: T
    etag: str | None  # None: the object does not exist yet


@dataclass
class Documents:
    """Cached, compare-and-swap access to the manifest objects of one store."""

    store: Store
    policy: CasPolicy = field(default_factory=CasPolicy)
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self._cache: dict[str, _Version[Any]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(key, threading.RLock())

    def _refresh(self, key: str, codec: Codec[T]) -> _Version[T]:
        cached = self._cache.get(key)
        self.stats.reads += 1
        try:
            blob = self.store.get(key, if_none_match=cached.etag if cached else None)
        except NotFound:
            self._cache.pop(key, None)
            return _Version(codec.empty(), None)
        if blob is None:
            assert cached is not None
            self.stats.not_modified += 1
            return cached
        version = _Version(codec.decode(key, blob.body), blob.etag)
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

    def commit(self, key: str, codec: Codec[T], change: Change[T, R]) -> R:
        """Apply ``change`` to the object until a conditional write of its result wins.

        Outcomes decided on a cached version that was not just validated (a refusal, or
        nothing to write) are checked against a fresh read before they are believed.
        """
        op = uuid.uuid4().hex[:16]
        sent: dict[str, R] = {}  # commit id -> result, for attempts that may have landed
        with self._lock(key):
            current: _Version[T] | None = self._cache.get(key)
            validated = current is None
            if current is None:
                current = self._refresh(key, codec)
            attempt = 0
            while True:
                if sent:
                    for commit_id in reversed(codec.commit_ids(current.doc)):
                        if commit_id in sent:
                            return sent[commit_id]
                try:
                    new_doc, result = change(current.doc, self.store.now())
                except ObjManifestError:
                    if validated:
                        raise
                    current, validated = self._refresh(key, codec), True
                    continue
                if new_doc is None:
                    if validated:
                        return result
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
                try:
                    etag = self.store.put(
                        key,
                        codec.encode(stamped),
                        if_match=current.etag,
                        if_none_match=current.etag is None,
                        content_type="application/json",
                    )
                except PreconditionFailed:
                    self.stats.conflicts += 1
                    sent[commit_id] = result
                    if validated:
                        time.sleep(self.policy.backoff(attempt))
                    current, validated = self._refresh(key, codec), True
                    continue
                except OutcomeUnknown:
                    self.stats.lost_responses += 1
                    sent[commit_id] = result
                    current, validated = self._refresh(key, codec), True
                    continue
                self._cache[key] = _Version(stamped, etag)
                self.stats.commits += 1
                return result
