"""The manifest of one task: its header, its shards and its dependency index, in one store.

A shard or the index that does not exist yet reads as empty, and its first commit creates
it with ``If-None-Match: *``: creating a task writes one object, and a crash in the middle
of anything leaves nothing half-made that a rerun cannot finish. Keys come from
``layout.TaskLayout``; every change is a named command committed through ``cas.Documents``,
whose events the task's observers receive (``Manifest.subscribe``), side effects included
(``effects.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from pydantic import ValidationError

import shard_index

from . import changes, leases, transfer
from .cas import CasPolicy, Documents
from .codecs import INDEX, ShardCodec, index_error, load_json
from .effects import TransitionEffects
from .errors import (
    AlreadyExists,
    CorruptShard,
    InvalidInput,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    UnsupportedStore,
)
from .events import Observer, Observers
from .layout import TaskLayout
from .model import (
    SCHEMA_VERSION,
    Claim,
    Declaration,
    Entry,
    EntryNote,
    Shard,
    State,
    TaskHeader,
    TaskStatus,
    validated,
)
from .store import CREATE, PROBE_PREFIX, ObjectStore, probe_conditional_writes
from .transfer import TransferConfig
from .uploads import Scope, sweep

M = TypeVar("M", bound="Manifest")

MAX_LEASE_SECONDS = 30 * 24 * 3600.0
"""The longest lease a task may set (30 days); a lease renews itself while its holder works."""


def check_settings(lease_seconds: object, max_retries: object) -> tuple[float, int]:
    """A task's lease and retry settings, or ``InvalidInput`` saying what is allowed."""
    lease_ok = (
        isinstance(lease_seconds, (int, float))
        and not isinstance(lease_seconds, bool)
        and math.isfinite(lease_seconds)
        and 0 < lease_seconds <= MAX_LEASE_SECONDS
    )
    if not lease_ok:
        raise InvalidInput(
            f"lease_seconds must be a number of seconds above 0 and at most "
            f"{MAX_LEASE_SECONDS:.0f} (30 days), not {lease_seconds!r}"
        )
    if (
        not isinstance(max_retries, int)
        or isinstance(max_retries, bool)
        or not (0 <= max_retries <= 1000)
    ):
        raise InvalidInput(
            f"max_retries must be a whole number from 0 to 1000, not {max_retries!r}"
        )
    return float(lease_seconds), max_retries  # type: ignore[arg-type]


class Manifest:
    """The manifest of one job, and the reads and commits on it. Safe to share between
    threads."""

    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION

    def __init__(
        self,
        store: ObjectStore,
        header: TaskHeader,
        policy: CasPolicy | None = None,
        *,
        transfer: TransferConfig | None = None,
    ) -> None:
        self.store = store
        self.header = header
        self.layout = TaskLayout(header.task_id)
        self.observers = Observers()
        self.docs = Documents(store, policy or CasPolicy(), observers=self.observers)
        self.rules = changes.Rules(header.task_id, header.lease_seconds, header.max_retries)
        self._transfer = transfer
        self._codecs = {
            shard: ShardCodec(header.task_id, shard)
            for stage in header.stages
            for shard in self.layout.shards_of(stage)
        }
        self.uploads = Scope(
            store=store,
            docs=self.docs,
            layout=self.layout,
            stages=header.stages,
            held=self.held,
            entry=self._entry_now,
        )
        self.observers.subscribe(TransitionEffects(self.uploads))

    def __repr__(self) -> str:
        return f"Task({self.task_id!r} at {self.store.url})"

    # -- creating and opening ----------------------------------------------------------

    @classmethod
    def create(
        cls: type[M],
        store: ObjectStore,
        task_id: str,
        stages: Iterable[str],
        lease_seconds: float = 300,
        max_retries: int = 3,
        *,
        policy: CasPolicy | None = None,
        transfer: TransferConfig | None = None,
    ) -> M:
        """Create a task (``AlreadyExists`` if it is there) after checking the store is safe."""
        layout = TaskLayout(task_id)
        lease, retries = check_settings(lease_seconds, max_retries)
        runtime = store.runtime
        problems = probe_conditional_writes(store, PROBE_PREFIX + runtime.new_id())
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
            lease_seconds=lease,
            max_retries=retries,
            created_at=store.now(),
            creation_id=runtime.new_id(),
        )
        key = layout.header
        body = header.model_dump_json().encode()
        for _ in range(3):
            try:
                store.put(key, body, mode=CREATE, content_type="application/json")
                return cls(store, header, policy, transfer=transfer)
            except (PreconditionFailed, OutcomeUnknown):
                try:
                    existing = cls.open(store, task_id, policy=policy, transfer=transfer)
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
    def open(
        cls: type[M],
        store: ObjectStore,
        task_id: str,
        *,
        policy: CasPolicy | None = None,
        transfer: TransferConfig | None = None,
    ) -> M:
        """Open an existing task (``NotFound`` if there is none)."""
        key = TaskLayout(task_id).header
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
        if header.task_id != task_id:
            raise CorruptShard(key, f"it is the header of task {header.task_id!r}")
        return cls(store, header, policy, transfer=transfer)

    # -- settings and keys ---------------------------------------------------------------

    @staticmethod
    def header_key(task_id: str) -> str:
        return TaskLayout(task_id).header

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

    @property
    def transfer(self) -> TransferConfig:
        """How data moves: ``transfer=`` given to ``create``/``open``, else the defaults."""
        return self._transfer or transfer.defaults()

    def shard_key(self, stage: str) -> str:
        """The key of ``stage``'s shard."""
        self._check_stage(stage)
        return self.layout.shard(self.layout.shard_of(stage))

    @property
    def index_key(self) -> str:
        return self.layout.index

    def _check_stage(self, stage: str) -> None:
        if stage not in self.stages:
            raise NotFound(
                f"{stage!r} is not a stage of task {self.task_id!r}; "
                f"its stages are {', '.join(self.stages)}"
            )

    def codec(self, shard: str) -> ShardCodec:
        """The codec of a shard (``claim.shard``, or a stage's own shard)."""
        try:
            return self._codecs[shard]
        except KeyError:
            self._check_stage(self.layout.stage_of_shard(shard))
            raise

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer`` with every commit this task object makes (a ``CommitEvent``:
        object, version, command, actor and the entries' transitions); returns the function
        that stops it."""
        return self.observers.subscribe(observer)

    # -- reading -------------------------------------------------------------------------

    def read_shard(self, shard: str) -> Shard:
        """A fresh read of one shard (a 304 when nothing changed)."""
        return self.docs.read(self.layout.shard(shard), self.codec(shard))

    def shard(self, stage: str) -> Shard:
        """A fresh read of one stage's shard."""
        self._check_stage(stage)
        return self.read_shard(self.layout.shard_of(stage))

    def index(self) -> shard_index.ShardIndex:
        return self.docs.read(self.layout.index, INDEX)

    def stage_of(self, file_id: str) -> str:
        stage = self.index().stage_of(file_id)
        if stage is None:
            raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
        return stage

    def entry(self, file_id: str) -> Entry:
        """The entry as the store has it now."""
        stage = self.stage_of(file_id)
        entry = self.read_shard(self.layout.shard_of(stage, file_id)).entries.get(file_id)
        if entry is None:
            raise NotFound(
                f"{file_id!r} is in the index but not in shard {stage!r}: its declaration "
                "was interrupted; declare it again to finish it"
            )
        return entry

    def entries(self, stage: str | None = None) -> list[Entry]:
        stages = [stage] if stage else list(self.stages)
        return [e for s in stages for e in self.shard(s).entries.values()]

    def _entry_now(self, stage: str, file_id: str) -> Entry | None:
        if stage not in self.stages:
            return None
        return self.read_shard(self.layout.shard_of(stage, file_id)).entries.get(file_id)

    def held(self, claim: Claim) -> Entry:
        """The entry, read fresh, if ``claim`` still holds it; else ``LeaseLost``."""
        entry = self.read_shard(claim.shard).entries.get(claim.file_id)
        if entry is None or (entry.state, entry.epoch, entry.owner) != (
            State.writing,
            claim.epoch,
            claim.agent,
        ):
            now = f"{entry.state.value} at epoch {entry.epoch}" if entry else "gone"
            raise LeaseLost(
                f"lease on {claim.file_id!r} (epoch {claim.epoch}, agent {claim.agent}) is "
                f"lost: the entry is now {now}. Stop working on it."
            )
        return entry

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
        by_shard: dict[str, list[Declaration]] = {}
        for decl in batch:
            self._check_stage(decl.stage)
            by_shard.setdefault(self.layout.shard_of(decl.stage, decl.file_id), []).append(decl)
        # Refuse a conflicting batch before writing anything: the index checks stages,
        # dependencies and cycles, the shards (read fresh: 304s) check consumers.
        for shard, group in by_shard.items():
            changes.declare(self.read_shard(shard), self.store.now(), group)
        if batch:
            self.docs.commit(self.layout.index, INDEX, DeclareInIndex(batch))
        declared: dict[str, Entry] = {}
        for shard, group in by_shard.items():
            entries = self.docs.commit(
                self.layout.shard(shard), self.codec(shard), changes.Declare(group)
            )
            declared.update((e.file_id, e) for e in entries)
        return [declared[d.file_id] for d in batch]

    # -- dependencies, status, reaping, cleaning up --------------------------------------

    def lookup_for(self, shard: str, candidates: Iterable[Entry]) -> changes.Lookups:
        """Build dependency look-ups for entries of ``shard``: foreign shards are read once
        here, the shard's own entries are taken from the version the CAS loop hands over.

        ``candidates`` must come from a fresh read of the shard (a 304 when nothing
        changed): an entry missing from it would find its foreign dependencies "not
        declared".
        """
        known_here = self.docs.cached(self.layout.shard(shard), self.codec(shard)).entries
        foreign = {d for e in candidates for d in e.depends_on if d not in known_here}
        if not foreign:
            return lambda doc: doc.entries.get
        index = self.index()
        wanted = {
            self.layout.shard_of(stage, dep)
            for dep in foreign
            if (stage := index.stage_of(dep)) is not None
        } - {shard}
        shards = {s: self.read_shard(s) for s in wanted}

        def make(doc: Shard) -> changes.Lookup:
            def lookup(dep: str) -> Entry | None:
                if dep in doc.entries:
                    return doc.entries[dep]
                stage = index.stage_of(dep)
                other = shards.get(self.layout.shard_of(stage, dep)) if stage else None
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

        Any agent may call it at any time: the CAS makes each release happen once. An entry
        that dies of it has its upload aborted (by the task's commit observer).
        """
        released: list[Entry] = []
        for stage in self.stages:
            for shard in self.layout.shards_of(stage):
                released += self.docs.commit(
                    self.layout.shard(shard), self.codec(shard), changes.Reap(self.rules)
                )
        return released

    def sweep_uploads(self) -> list[str]:
        """Abort the multipart uploads nobody can adopt any more; returns their keys."""
        return sweep(self.uploads)


class DeclareInIndex:
    """The index's half of a declaration: every file id, its stage and dependencies."""

    name: ClassVar[str] = "declare"
    actor: ClassVar[str] = ""

    def __init__(self, batch: list[Declaration]) -> None:
        self.tuples = [(d.file_id, d.stage, d.depends_on) for d in batch]

    def apply(
        self, index: shard_index.ShardIndex, now: datetime
    ) -> tuple[shard_index.ShardIndex | None, None]:
        try:
            new = index.declare_many(self.tuples)
        except shard_index.ShardIndexError as e:
            raise index_error(e) from None
        return (None if new is index else new), None


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


__all__ = ["Manifest", "attention", "check_settings"]
