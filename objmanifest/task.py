"""A task: its header, its per-stage shards and its dependency index, in one store.

Layout under the store prefix::

    TASK_ID/task.json            header, written once
    TASK_ID/index.json           cross-shard dependency index
    TASK_ID/shards/STAGE.json    one shard per stage
    TASK_ID/data/STAGE/FILE_ID@EPOCH

A shard or the index that does not exist yet reads as empty, and its first commit creates
it with ``If-None-Match: *``: creating a task writes one object, and a crash in the middle
of anything leaves nothing half-made that a rerun cannot finish.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

import shard_index

from . import changes, leases
from .errors import AlreadyExists, CorruptShard, NotFound, UnsupportedStore
from .model import (
    SCHEMA_VERSION,
    Declaration,
    Entry,
    EntryNote,
    Shard,
    State,
    TaskHeader,
    TaskStatus,
    check_name,
    validated,
)
from .shards import CasPolicy, Documents, IndexCodec, ShardCodec, index_error, load_json
from .store import OutcomeUnknown, PreconditionFailed, Store, probe_conditional_writes

if TYPE_CHECKING:
    from .agent import Agent

_INDEX = IndexCodec()


class Task:
    """The manifest of one job. Safe to share between threads."""

    def __init__(self, store: Store, header: TaskHeader, policy: CasPolicy | None = None) -> None:
        self.store = store
        self.header = header
        self.docs = Documents(store, policy or CasPolicy())
        self.rules = changes.Rules(header.task_id, header.lease_seconds, header.max_retries)
        self._codecs = {s: ShardCodec(header.task_id, s) for s in header.stages}

    def __repr__(self) -> str:
        return f"Task({self.task_id!r} at {self.store.url})"

    # -- creating and opening ----------------------------------------------------------

    @classmethod
    def create(
        cls,
        store: Store,
        task_id: str,
        stages: Iterable[str],
        lease_seconds: float = 300,
        max_retries: int = 3,
        *,
        policy: CasPolicy | None = None,
    ) -> Task:
        """Create a task (``AlreadyExists`` if it is there) after checking the store is safe."""
        check_name("task id", task_id)
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a whole number >= 0, not {max_retries!r}")
        problems = probe_conditional_writes(store, f".objmanifest-probe/{uuid.uuid4().hex}")
        if problems:
            raise UnsupportedStore(
                f"{store.url} does not enforce conditional writes, so agents could overwrite "
                f"each other: {'; '.join(problems)}. Use a store that supports "
                "If-Match / If-None-Match on PUT (AWS S3, SeaweedFS, MinIO, LocalStack)."
            )
        header = validated(
            TaskHeader,
            f"task {task_id!r}",
            task_id=task_id,
            stages=tuple(stages),
            lease_seconds=float(lease_seconds),
            max_retries=max_retries,
            created_at=store.now(),
            creation_id=uuid.uuid4().hex,
        )
        key = cls.header_key(task_id)
        body = header.model_dump_json().encode()
        for _ in range(3):
            try:
                store.put(key, body, if_none_match=True, content_type="application/json")
                return cls(store, header, policy)
            except (PreconditionFailed, OutcomeUnknown):
                try:
                    existing = cls.open(store, task_id, policy=policy)
                except NotFound:
                    continue  # the write did not land: try again
                if existing.header.creation_id == header.creation_id:
                    return existing  # our write landed; its answer was lost
                raise AlreadyExists(
                    f"task {task_id!r} already exists at {store.describe(key)}; "
                    "open it with Task.open, or pick another task id"
                ) from None
        raise UnsupportedStore(f"could not create {store.describe(key)}: writes are not landing")

    @classmethod
    def open(cls, store: Store, task_id: str, *, policy: CasPolicy | None = None) -> Task:
        """Open an existing task (``NotFound`` if there is none)."""
        check_name("task id", task_id)
        key = cls.header_key(task_id)
        try:
            blob = store.get(key)
        except NotFound:
            raise NotFound(
                f"task {task_id!r} does not exist at {store.describe(key)}; "
                "create it with Task.create (or `objmanifest init`)"
            ) from None
        assert blob is not None
        data = load_json(key, blob.body, SCHEMA_VERSION)
        try:
            header = TaskHeader.model_validate(data)
        except ValidationError as e:
            raise CorruptShard(key, f"not a task header: {e.errors()[:3]}") from None
        return cls(store, header, policy)

    # -- keys and reads ----------------------------------------------------------------

    @staticmethod
    def header_key(task_id: str) -> str:
        return f"{task_id}/task.json"

    @property
    def task_id(self) -> str:
        return self.header.task_id

    @property
    def stages(self) -> tuple[str, ...]:
        return self.header.stages

    @property
    def lease_seconds(self) -> float:
        return self.header.lease_seconds

    @property
    def max_retries(self) -> int:
        return self.header.max_retries

    def shard_key(self, stage: str) -> str:
        return f"{self.task_id}/shards/{stage}.json"

    @property
    def index_key(self) -> str:
        return f"{self.task_id}/index.json"

    def codec(self, stage: str) -> ShardCodec:
        try:
            return self._codecs[stage]
        except KeyError:
            raise NotFound(
                f"{stage!r} is not a stage of task {self.task_id!r}; "
                f"its stages are {', '.join(self.stages)}"
            ) from None

    def shard(self, stage: str) -> Shard:
        """A fresh read of one stage's shard."""
        return self.docs.read(self.shard_key(stage), self.codec(stage))

    def index(self) -> shard_index.ShardIndex:
        return self.docs.read(self.index_key, _INDEX)

    def stage_of(self, file_id: str) -> str:
        stage = self.index().stage_of(file_id)
        if stage is None:
            raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
        return stage

    def entry(self, file_id: str) -> Entry:
        """The entry as the store has it now."""
        stage = self.stage_of(file_id)
        entry = self.shard(stage).entries.get(file_id)
        if entry is None:
            raise NotFound(
                f"{file_id!r} is in the index but not in shard {stage!r}: its declaration "
                "was interrupted; declare it again to finish it"
            )
        return entry

    def entries(self, stage: str | None = None) -> list[Entry]:
        stages = [stage] if stage else list(self.stages)
        return [e for s in stages for e in self.shard(s).entries.values()]

    # -- declaring ---------------------------------------------------------------------

    def declare(
        self,
        file_id: str,
        stage: str,
        depends_on: Iterable[str] = (),
        consumers: Iterable[str] = (),
    ) -> Entry:
        """Declare one file. The same declaration again is a no-op."""
        decl = {
            "file_id": file_id,
            "stage": stage,
            "depends_on": depends_on,
            "consumers": consumers,
        }
        return self.declare_many([decl])[0]

    def declare_many(
        self, decls: Iterable[Declaration | dict[str, Any] | tuple[Any, ...]]
    ) -> list[Entry]:
        """Declare many files: one commit to the index, then one per shard touched.

        A conflict anywhere in the batch (stage, dependencies, consumers, a cycle) is found
        before anything is written. The index goes first, so an entry is never in a shard
        without being in the index; rerunning after a crash finishes the batch.
        """
        batch = [Declaration.of(d) for d in decls]
        by_stage: dict[str, list[Declaration]] = {}
        for decl in batch:
            self.codec(decl.stage)
            by_stage.setdefault(decl.stage, []).append(decl)
        # Refuse a conflicting batch before writing anything: the index checks stages,
        # dependencies and cycles, the shards (read fresh: 304s) check consumers.
        for stage, group in by_stage.items():
            changes.declare(self.shard(stage), self.store.now(), group)
        tuples = [(d.file_id, d.stage, d.depends_on) for d in batch]

        def add_to_index(
            index: shard_index.ShardIndex, now: object
        ) -> tuple[shard_index.ShardIndex | None, None]:
            try:
                new = index.declare_many(tuples)
            except shard_index.ShardIndexError as e:
                raise index_error(e) from None
            return (None if new is index else new), None

        if batch:
            self.docs.commit(self.index_key, _INDEX, add_to_index)
        declared: dict[str, Entry] = {}
        for stage, group in by_stage.items():
            entries = self.docs.commit(
                self.shard_key(stage), self.codec(stage), partial(changes.declare, decls=group)
            )
            declared.update((e.file_id, e) for e in entries)
        return [declared[d.file_id] for d in batch]

    # -- agents, status, reaping -------------------------------------------------------

    def agent(self, name: str, role: str | None = None) -> Agent:
        """An agent working on this task; ``role`` (for consumers) defaults to the name."""
        from .agent import Agent

        return Agent(self, name, role)

    def lookup_for(
        self, stage: str, candidates: Iterable[Entry]
    ) -> Callable[[Shard], changes.Lookup]:
        """Build dependency look-ups for entries of ``stage``: foreign shards are read once
        here, the stage's own entries are taken from the shard the CAS loop hands over.

        ``candidates`` must come from a fresh read of the stage (a 304 when nothing changed):
        an entry missing from it would find its foreign dependencies "not declared".
        """
        known_here = self.docs.cached(self.shard_key(stage), self.codec(stage)).entries
        foreign = {d for e in candidates for d in e.depends_on if d not in known_here}
        if not foreign:
            return lambda shard: shard.entries.get
        index = self.index()
        stages = {index.stage_of(d) for d in foreign} - {None, stage}
        shards = {s: self.shard(s) for s in stages if s is not None}

        def make(shard: Shard) -> changes.Lookup:
            def lookup(dep: str) -> Entry | None:
                if dep in shard.entries:
                    return shard.entries[dep]
                other = shards.get(index.stage_of(dep) or "")
                return other.entries.get(dep) if other is not None else None

            return lookup

        return make

    def status(self) -> TaskStatus:
        """Counts per stage and state; blocked, overdue and dead entries named."""
        shards = {s: self.shard(s) for s in self.stages}
        everything = {fid: e for sh in shards.values() for fid, e in sh.entries.items()}
        now = self.store.now()
        counts: dict[str, dict[str, int]] = {}
        notes: dict[str, list[EntryNote]] = {"blocked": [], "overdue": [], "dead": []}
        for stage, shard in shards.items():
            counts[stage] = {s.value: 0 for s in State}
            for entry in shard.entries.values():
                counts[stage][entry.state.value] += 1
                found = attention(entry, now, everything.get)
                if found is not None:
                    kind, reason = found
                    notes[kind].append(
                        EntryNote(
                            file_id=entry.file_id, stage=stage, state=entry.state, reason=reason
                        )
                    )
        return TaskStatus(task_id=self.task_id, store_time=now, stages=counts, **notes)

    def reap(self) -> list[Entry]:
        """Release every expired lease of the task; returns the entries released.

        Any agent may call it at any time: the CAS makes each release happen once.
        """
        from . import chunks  # chunks builds on Task: import it when it is needed

        released: list[Entry] = []
        for stage in self.stages:
            released += self.docs.commit(
                self.shard_key(stage),
                self.codec(stage),
                lambda shard, now: changes.reap(shard, now, self.rules),
            )
        for entry in released:
            if entry.state is State.dead:  # nobody will adopt its upload: free the parts
                chunks.abandon(self, entry.stage, entry.file_id)
        return released


def attention(entry: Entry, now: datetime, lookup: changes.Lookup) -> tuple[str, str] | None:
    """Whether a status report should name this entry: (dead|overdue|blocked, why)."""
    if entry.state is State.dead:
        return "dead", entry.error or "retries exhausted"
    if leases.expired(entry, now):
        expiry = entry.lease_expires_at.isoformat() if entry.lease_expires_at else "?"
        return "overdue", f"lease of {entry.owner} expired at {expiry}"
    if entry.state not in (State.pending, State.failed):
        return None
    waiting, dead = changes.blockers(entry, lookup)
    if dead:
        return "blocked", f"depends on dead entries: {', '.join(dead)}"
    if waiting:
        return "blocked", f"waiting for {', '.join(waiting)}"
    return None
