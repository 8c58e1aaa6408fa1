"""The manifest of one task: its header, its shards and its dependency index, in one store.

A shard or the index that does not exist yet reads as empty, and its first commit creates
it with ``If-None-Match: *``: creating a task writes one object, and a crash in the middle
of anything leaves nothing half-made that a rerun cannot finish. Keys come from
``layout.TaskLayout``; every change is a named command committed through ``cas.Documents``,
whose events the task's observers receive (``Manifest.subscribe``), side effects included
(``data.effects``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import ValidationError

import shard_index

from ..cas.codecs import (
    HEADER_REPAIR,
    HeaderCodec,
    IndexCodec,
    ShardCodec,
    index_error,
    load_json,
    schema_problems,
)
from ..cas.loop import Documents
from ..cas.policy import CasPolicy, Codec
from ..core import changes, commands, leases, states, verbs
from ..core.events import Observer, Observers
from ..core.layout import TaskLayout
from ..core.model import (
    HEADER_SCHEMA,
    READERS,
    SCHEMA_VERSION,
    ArchiveReport,
    Claim,
    DamageNote,
    Declaration,
    Entry,
    EntryNote,
    IndexNote,
    JournalRecord,
    Shard,
    State,
    TaskHeader,
    TaskStatus,
    validated,
)
from ..core.names import check_file_id
from ..data import transfer
from ..data.chunked import Scope, sweep
from ..data.chunked.rebuild import needs_parts
from ..data.chunked.state import UploadCodec
from ..data.effects import TransitionEffects
from ..data.transfer import TransferConfig
from ..errors import (
    AlreadyExists,
    CorruptShard,
    DeadWaitedFor,
    DeclarationConflict,
    InvalidInput,
    LeaseLost,
    NotFound,
    TaskBeingDeleted,
    UnsupportedSchema,
    UnsupportedStore,
    WaitTimeout,
)
from ..journal.history import Dropped, History, Lineage, Transition, lineage, transitions_of
from ..journal.retention import Trimmer
from ..ops import deletion
from ..ops.archive import Archives, check_age
from ..ops.gc import Collector, GcReport
from ..ops.repair import Repairer
from ..ops.reports import RepairReport
from ..store import CREATE, PROBE_PREFIX, ObjectStore, list_keys, probe_conditional_writes
from ..store.errors import OutcomeUnknown, PreconditionFailed

_PARALLEL_READS = 16
"""The most shards read at once for a view of a split stage."""

M = TypeVar("M", bound="Manifest")
D = TypeVar("D")


class Migratable(Codec[D], Protocol[D]):
    """A codec whose objects can be moved to a newer schema version."""

    def schema_of(self, doc: D) -> int: ...
    def migrated(self, doc: D, schema_version: int) -> D: ...


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


MAX_JOURNAL_KEEP_SECONDS = 10 * 366 * 24 * 3600.0
"""The longest journal retention by age a task may set (about ten years)."""
MAX_JOURNAL_KEEP_VERSIONS = 10**9


def check_retention(keep_seconds: object, keep_versions: object) -> tuple[float | None, int | None]:
    """A task's journal retention settings (None: no bound), or ``InvalidInput`` saying
    what is allowed."""
    seconds_ok = keep_seconds is None or (
        isinstance(keep_seconds, (int, float))
        and not isinstance(keep_seconds, bool)
        and math.isfinite(keep_seconds)
        and 0 < keep_seconds <= MAX_JOURNAL_KEEP_SECONDS
    )
    if not seconds_ok:
        raise InvalidInput(
            f"journal_keep_seconds must be a number of seconds above 0 and at most "
            f"{MAX_JOURNAL_KEEP_SECONDS:.0f} (about ten years), or None to keep every "
            f"record, not {keep_seconds!r}"
        )
    if keep_versions is not None and (
        not isinstance(keep_versions, int)
        or isinstance(keep_versions, bool)
        or not (1 <= keep_versions <= MAX_JOURNAL_KEEP_VERSIONS)
    ):
        raise InvalidInput(
            f"journal_keep_versions must be a whole number from 1 to "
            f"{MAX_JOURNAL_KEEP_VERSIONS}, or None to keep every record, not {keep_versions!r}"
        )
    seconds = float(keep_seconds) if keep_seconds is not None else None  # type: ignore[arg-type]
    return seconds, keep_versions


WAIT_FIRST_DELAY, WAIT_GROWTH, WAIT_MAX_DELAY = 0.2, 1.5, 2.0
"""``wait`` polls 0.2 s apart at first, each delay 1.5 times the last, up to 2 s (as the
command line's ``--wait``)."""


def _some(file_ids: list[str], shown: int = 10) -> str:
    """Up to ``shown`` file ids, and how many more."""
    more = len(file_ids) - shown
    return ", ".join(file_ids[:shown]) + (f" and {more} more" if more > 0 else "")


MAX_BACKOFF_SECONDS = 30 * 24 * 3600.0
"""The longest retry backoff or stage deadline a task may set (30 days)."""


def _seconds(name: str, value: object) -> float:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_BACKOFF_SECONDS
    )
    if not ok:
        raise InvalidInput(
            f"{name} must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:.0f} "
            f"(30 days), not {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def check_timing(
    retry_backoff: object, retry_backoff_max: object, deadlines: object, stages: Iterable[str]
) -> tuple[float | None, float | None, dict[str, float] | None]:
    """A task's retry backoff and stage deadlines (None: unset), or ``InvalidInput``."""
    base = _seconds("retry_backoff", retry_backoff) or None
    cap = None
    if retry_backoff_max is not None:
        cap = _seconds("retry_backoff_max", retry_backoff_max)
        if base is None or cap < base:
            raise InvalidInput(
                f"retry_backoff_max ({retry_backoff_max!r}) needs a retry_backoff of at most "
                f"it (retry_backoff is {retry_backoff!r})"
            )
    if deadlines is None:
        return base, cap, None
    if not isinstance(deadlines, Mapping):
        raise InvalidInput(
            f"deadlines must map stage names to seconds, like {{'collect': 600}}, not the "
            f"{type(deadlines).__name__} {deadlines!r}"
        )
    known = list(stages)
    out: dict[str, float] = {}
    for stage, seconds in deadlines.items():
        if stage not in known:
            raise InvalidInput(
                f"deadlines name {stage!r}, which is not a stage of the task "
                f"(its stages are {', '.join(known)})"
            )
        value = _seconds(f"the deadline of stage {stage!r}", seconds)
        if value <= 0:
            raise InvalidInput(f"the deadline of stage {stage!r} must be above 0 seconds")
        out[stage] = value
    return base, cap, out or None


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
        header_etag: str | None = None,
    ) -> None:
        self.store = store
        self.header = header
        self._header_etag = header_etag
        self.layout = TaskLayout.of(header)
        self.observers = Observers()
        self.docs = Documents(
            store,
            policy or CasPolicy(),
            observers=self.observers,
            block_key=self.layout.journal_block,
        )
        self.rules = changes.Rules(
            header.task_id,
            header.lease_seconds,
            header.max_retries,
            header.retry_backoff or 0.0,
            header.backoff_cap,
        )
        self._transfer = transfer
        self._sound_parts: set[tuple[str, str | None]] = set()
        """(upload state key, entry checksum) of the part lists ``status`` read sound."""
        self._configure(header)
        self.journal = History(store, self.docs, self.layout, self.journaled_objects)
        self.archives = Archives(store, self.layout)
        self.observers.subscribe(TransitionEffects(self.uploads))

    def _configure(self, header: TaskHeader) -> None:
        """The codecs and the upload scope for the task's schema version."""
        self.header = header
        self.index_codec = IndexCodec(header.objects_schema)
        self._codecs = {
            shard: ShardCodec(header.task_id, shard, header.objects_schema)
            for shard in self.layout.all_shards(header.stages)
        }
        self.uploads = Scope(
            store=self.store,
            docs=self.docs,
            layout=self.layout,
            stages=header.stages,
            held=self.held,
            entry=self._entry_now,
            schema=header.objects_schema,
        )

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
        journal_keep_seconds: float | None = None,
        journal_keep_versions: int | None = None,
        partitions: Mapping[str, int] | None = None,
        layout: str | None = None,
        retry_backoff: float = 0,
        retry_backoff_max: float | None = None,
        deadlines: Mapping[str, float] | None = None,
    ) -> M:
        """Create a task (``AlreadyExists`` if it is there) after checking the store is safe.

        ``journal_keep_seconds``/``journal_keep_versions`` bound its journal (see
        ``trim_journal``); by default every record is kept. ``partitions`` splits hot stages
        into hash partitions, each a shard of its own (``{"collect": 16}``), so agents of
        one stage do not all commit to one object; ``layout="task"`` keeps every entry in
        one shard (only as a baseline to compare against). Both are fixed for the life of
        the task.

        ``retry_backoff`` (seconds, default 0: none) makes a failed entry claimable again
        only that long after its failure, doubling per retry up to ``retry_backoff_max``
        (default 64 times ``retry_backoff``), on the store's clock. ``deadlines`` gives
        stages the seconds an entry may stay writing (from its claim) or ready without
        being consumed (from ``ready_at``) before ``status`` lists it as ``late``.
        """
        keys = TaskLayout(task_id)
        lease, retries = check_settings(lease_seconds, max_retries)
        keep_seconds, keep_versions = check_retention(journal_keep_seconds, journal_keep_versions)
        if isinstance(stages, (str, bytes, dict)):
            raise InvalidInput(
                f"stages must be a list of stage names, not the {type(stages).__name__} "
                f"{stages!r}: write stages=[{stages!r}] for one stage"
                if not isinstance(stages, dict)
                else f"stages must be a list of stage names, not a dict: {stages!r}"
            )
        if partitions is not None and not isinstance(partitions, Mapping):
            raise InvalidInput(
                f"partitions must map stage names to partition counts, like "
                f'{{"collect": 16}}, not the {type(partitions).__name__} {partitions!r}'
            )
        stages = tuple(stages)
        backoff, backoff_max, stage_deadlines = check_timing(
            retry_backoff, retry_backoff_max, deadlines, stages
        )
        layered = bool(layout is not None or any(n != 1 for n in (partitions or {}).values()))
        # A backoff or deadlines need header schema 3 too: 0.2.0 would claim a failed entry
        # at once, blind to its retry_at.
        timed = backoff is not None or stage_deadlines is not None
        schema = HEADER_SCHEMA if layered or timed else SCHEMA_VERSION
        runtime = store.runtime
        problems = probe_conditional_writes(store, PROBE_PREFIX + runtime.new_id())
        if problems:
            raise UnsupportedStore(
                f"{store.url} does not enforce conditional writes, so agents could overwrite "
                f"each other: {'; '.join(problems)}. Use a store that enforces "
                "If-Match / If-None-Match on PUT, also under concurrent writers (AWS S3, "
                "SeaweedFS, MinIO, LocalStack); `objmanifest doctor` shows what it enforces."
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
            schema_version=schema,
            requires=READERS[schema],
            journal_keep_seconds=keep_seconds,
            journal_keep_versions=keep_versions,
            layout=layout,
            partitions=dict(partitions) if partitions is not None else None,
            retry_backoff=backoff,
            retry_backoff_max=backoff_max,
            deadlines=stage_deadlines,
        )
        key = keys.header
        body = header.model_dump_json(exclude_none=True).encode()
        for _ in range(3):
            try:
                etag = store.put(key, body, mode=CREATE, content_type="application/json")
                return cls(store, header, policy, transfer=transfer, header_etag=etag)
            except (PreconditionFailed, OutcomeUnknown):
                try:
                    existing = cls.open(store, task_id, policy=policy, transfer=transfer)
                except TaskBeingDeleted as e:
                    raise AlreadyExists(f"{e}; then create it") from None
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
        where = store.describe(key)
        try:
            data = load_json(key, blob.body, HEADER_SCHEMA)
        except (CorruptShard, UnsupportedSchema) as e:
            raise e.at(where, HEADER_REPAIR) from None
        try:
            header = TaskHeader.model_validate(data)
        except ValidationError as e:
            problem = f"not a task header: {schema_problems(e)}"
            raise CorruptShard(key, problem, where, HEADER_REPAIR) from None
        if header.task_id != task_id:
            problem = f"it is the header of task {header.task_id!r}"
            raise CorruptShard(key, problem, where, HEADER_REPAIR)
        if header.deleting_at is not None:
            raise TaskBeingDeleted(
                f"task {task_id!r} at {where} is being deleted (since "
                f"{header.deleting_at.isoformat()}): run `objmanifest delete --yes` "
                "(Task.delete_by_id) again to finish it"
            )
        return cls(store, header, policy, transfer=transfer, header_etag=blob.etag)

    def is_current(self) -> bool:
        """Whether the task this object was opened on is still the one under its id: not
        deleted, not being deleted, not created anew (with other settings, say), and its
        header unchanged. One conditional GET of the header (a 304 while it is). A reader
        that keeps a ``Task`` for long (the web page) opens it again once this is False."""
        key = self.layout.header
        try:
            blob = self.store.get(key, if_none_match=self._header_etag)
        except NotFound:
            return False
        if blob is None:
            return True
        try:
            header = HeaderCodec(self.task_id).decode(key, blob.body)
        except (CorruptShard, UnsupportedSchema):
            return False
        return header == self.header

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
        return self._transfer or transfer.TransferConfig()

    def shard_key(self, stage: str, file_id: str | None = None) -> str:
        """The key of ``stage``'s shard; of a split stage, the key of the partition that
        holds ``file_id``."""
        self._check_stage(stage)
        shards = self.layout.shards_of(stage)
        if file_id is not None:
            return self.layout.shard(self.layout.shard_of(stage, file_id))
        if len(shards) > 1:
            raise InvalidInput(
                f"stage {stage!r} is split into {len(shards)} partitions, each a shard: "
                "name the file id whose shard you want"
            )
        return self.layout.shard(shards[0])

    def check_stage(self, stage: str) -> None:
        """``NotFound``, naming the task's stages, unless ``stage`` is one of them."""
        self._check_stage(stage)

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
            raise NotFound(
                f"{shard!r} is not a shard of task {self.task_id!r}; its shards are "
                f"{', '.join(self._codecs)}"
            ) from None

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer`` with every commit this task object makes (a ``CommitEvent``:
        object, version, command, actor and the entries' transitions); returns the function
        that stops it."""
        return self.observers.subscribe(observer)

    # -- reading -------------------------------------------------------------------------

    def read_shard(self, shard: str) -> Shard:
        """A fresh read of one shard (a 304 when nothing changed)."""
        return self.docs.read(self.layout.shard(shard), self.codec(shard))

    def read_shards(self, shards: Iterable[str]) -> dict[str, Shard]:
        """Fresh reads of several shards, in parallel (304s when nothing changed)."""
        names = list(dict.fromkeys(shards))
        if len(names) <= 1:
            return {name: self.read_shard(name) for name in names}
        with self.store.runtime.pool(min(len(names), _PARALLEL_READS), "read-shards") as pool:
            return dict(zip(names, pool.map(self.read_shard, names), strict=True))

    def shard(self, stage: str) -> Shard:
        """A fresh read of one stage's entries: its shard, or a view of all its partitions
        (or of its entries in the task's one shard). A view is no stored object: its
        version is 0; commit to a shard by name (``claim.shard``) instead."""
        self._check_stage(stage)
        names = self.layout.shards_of(stage)
        if names == [stage]:
            return self.read_shard(stage)
        return self._view(stage, self.read_shards(names), self.index)

    def _view(
        self,
        stage: str,
        docs: Mapping[str, Shard],
        index: Callable[[], shard_index.ShardIndex | None],
    ) -> Shard:
        """``stage``'s entries from the shards ``docs`` holds (read already); ``index`` is
        asked only to place the archived ids of a task's one shard (None: they are left
        out)."""
        names = self.layout.shards_of(stage)
        if names == [stage]:
            return docs[stage]
        parts = [docs[name] for name in names]
        entries = {f: e for p in parts for f, e in p.entries.items() if e.stage == stage}
        archived = {f: a for p in parts for f, a in (p.archived or {}).items()}
        if archived and self.layout.single:
            found = index()
            archived = {
                f: a
                for f, a in archived.items()
                if found is not None and found.stage_of(f) == stage
            }
        return Shard(
            task_id=self.task_id,
            stage=stage,
            entries=entries,
            archived=archived or None,
            schema_version=self.header.objects_schema,
        )

    def index(self) -> shard_index.ShardIndex:
        return self.docs.read(self.layout.index, self.index_codec)

    def stage_of(self, file_id: str) -> str:
        check_file_id(file_id)
        stage = self.index().stage_of(file_id)
        if stage is None:
            raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
        return stage

    def entry(self, file_id: str) -> Entry:
        """The entry as the store has it now."""
        stage = self.stage_of(file_id)
        shard = self.read_shard(self.layout.shard_of(stage, file_id))
        entry = shard.entries.get(file_id) or self.archives.entry(shard, file_id)
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

    def routed(self, claim: Claim) -> Claim:
        """``claim`` naming the shard its entry lives in, as the layout routes it: a claim
        rebuilt from its printed fields (task, file, stage, agent, epoch) names only its
        stage, which is not its shard on a split stage or a one-shard task."""
        self._check_stage(claim.stage)
        shard = self.layout.shard_of(claim.stage, claim.file_id)
        return claim if claim.shard == shard else dataclasses.replace(claim, shard=shard)

    def resumed(self, agent: str, held: list[tuple[str, int]]) -> list[Claim]:
        """The claims ``agent`` got at each (file id, epoch), rebuilt from the index and the
        entries (each shard read once); see ``Agent.resume``."""
        index = self.index()
        shards: dict[str, Shard] = {}
        claims = []
        for file_id, epoch in held:
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
                raise InvalidInput(
                    f"the epoch of a claim on {file_id!r} is a whole number of at least 1 "
                    f"(the one its claim printed), not {epoch!r}"
                )
            stage = index.stage_of(check_file_id(file_id))
            if stage is None:
                raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
            shard = self.layout.shard_of(stage, file_id)
            if shard not in shards:
                shards[shard] = self.read_shard(shard)
            entry = shards[shard].entries.get(file_id)
            expiry = entry.lease_expires_at if entry is not None else None
            claims.append(
                Claim(
                    task_id=self.task_id,
                    file_id=file_id,
                    stage=stage,
                    agent=agent,
                    epoch=epoch,
                    lease_expires_at=expiry or self.store.now(),
                    shard=shard,
                )
            )
        return claims

    def held(self, claim: Claim) -> Entry:
        """The entry, read fresh, if ``claim`` still holds it; else ``LeaseLost``."""
        claim = self.routed(claim)
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

        A conflict anywhere in the batch (stage, dependencies, consumers, a cycle, the same
        id twice with different declarations) is found before anything is written. The index
        goes first, so an entry is never in a shard without being in the index; rerunning
        after a crash finishes the batch. An id that a shard holds but the index lacks means
        the index was damaged: it is refused (``CorruptShard``) until ``repair_index``.
        """
        if isinstance(decls, (str, bytes, dict, Declaration)):
            raise InvalidInput(
                f"declare_many() takes a list of declarations, not a {type(decls).__name__}: "
                f"wrap it in a list ([...]), or call declare() for one file"
            )
        batch = [Declaration.of(d) for d in decls]
        _refuse_twice(batch)
        by_shard: dict[str, list[Declaration]] = {}
        for decl in batch:
            self._check_stage(decl.stage)
            by_shard.setdefault(self.layout.shard_of(decl.stage, decl.file_id), []).append(decl)
        # Refuse a conflicting batch before writing anything: the index checks stages,
        # dependencies and cycles, the shards (read fresh: 304s) check consumers. Shards are
        # read before the index: a declaration in flight writes the index first, so an id
        # found in a shard and missing from a later read of the index is damage, not a race.
        shards = {shard: self.read_shard(shard) for shard in by_shard}
        self._refuse_unindexed(batch, shards)
        for shard, group in by_shard.items():
            changes.declare(shards[shard], self.store.now(), group)
        if batch:
            self.docs.commit(self.layout.index, self.index_codec, DeclareInIndex(batch))
        declared: dict[str, Entry] = {}
        for shard, group in by_shard.items():
            entries = self.docs.commit(
                self.layout.shard(shard), self.codec(shard), commands.Declare(group)
            )
            declared.update((e.file_id, e) for e in entries)
            fresh = self.docs.cached(self.layout.shard(shard), self.codec(shard))
            for decl in group:
                whole = self.archives.entry(fresh, decl.file_id)
                if whole is not None:
                    declared[decl.file_id] = whole  # archived: declared again, a no-op
        return [declared[d.file_id] for d in batch]

    def _all_shards(self, read: dict[str, Shard] | None = None) -> dict[str, Shard]:
        """Every shard of the task, read fresh (those in ``read`` are taken as they are)."""
        shards = dict(read or {})
        for shard in self.layout.all_shards(self.stages):
            if shard not in shards:
                shards[shard] = self.read_shard(shard)
        return shards

    def _refuse_unindexed(self, batch: list[Declaration], shards: dict[str, Shard]) -> None:
        """Refuse to declare an id that a shard holds but the index lacks (the index was
        deleted or replaced by hand): declaring it again could put it in a second stage."""
        index = self.index()
        new = {d.file_id for d in batch if d.file_id not in index}
        if not new:
            return
        everything = self._all_shards(shards)
        index = self.index()  # again, after the shards
        for shard_name, shard in everything.items():
            for file_id in sorted(new & set(shard.entries)):
                if file_id in index:
                    continue
                raise CorruptShard(
                    self.layout.index,
                    f"it lacks {file_id!r}, which shard {shard_name!r} holds: the index was "
                    "deleted or replaced by hand",
                    self.store.describe(self.layout.index),
                    "run `objmanifest repair` (Task.repair_index()) to add what the shards "
                    "hold, then declare again",
                )

    def repair_index(self) -> list[str]:
        """Put back into the index every entry a shard holds and the index lacks (after the
        index was deleted or replaced by hand); returns their file ids.

        An id held by two shards, or by a shard other than the stage the index gives it,
        cannot be placed: the others are added, then ``CorruptShard`` names those.
        """
        shards = self._all_shards()
        index = self.index()
        held: dict[str, list[Entry]] = {}
        for shard in shards.values():
            for file_id, entry in shard.entries.items():
                held.setdefault(file_id, []).append(entry)
        missing: list[tuple[str, str, tuple[str, ...]]] = []
        unplaced: list[str] = []
        for file_id, entries in sorted(held.items()):
            stages = sorted({e.stage for e in entries})
            known = index.stage_of(file_id)
            if len(stages) > 1:
                unplaced.append(f"{file_id!r} is in the shards of {', '.join(stages)}")
            elif known is None:
                missing.append((file_id, entries[0].stage, entries[0].depends_on))
            elif known != stages[0]:
                unplaced.append(
                    f"{file_id!r} is in the shard of {stages[0]}, the index puts it in {known}"
                )
        if missing:
            self.docs.commit(self.layout.index, self.index_codec, RepairIndex(missing))
        if unplaced:
            raise CorruptShard(
                self.layout.index,
                f"it cannot be repaired for {len(unplaced)} file ids: {'; '.join(unplaced[:20])}",
                self.store.describe(self.layout.index),
                "remove each of these entries from the shard where it does not belong",
            )
        return [file_id for file_id, _, _ in missing]

    # -- dependencies, status, reaping, cleaning up --------------------------------------

    def claim_base(self, shard: str) -> Shard:
        """The version of ``shard`` a claim chooses from: the cached one while it is likely
        current (``Documents.likely_current``: the claim's write is conditional on it, so a
        stale one costs a 412 and the claim chooses again on the version read then), else a
        fresh read (a 304 when nothing changed)."""
        if self.docs.likely_current(self.layout.shard(shard)):
            return self.docs.cached(self.layout.shard(shard), self.codec(shard))
        return self.read_shard(shard)

    def lookup_for(self, shard: str, candidates: Iterable[Entry]) -> changes.Lookups:
        """Build dependency look-ups for entries of ``shard``: the shard's own entries are
        taken from the version the CAS loop hands over, foreign ones from fresh reads of
        the index and their shards, never from a cache.

        ``candidates`` come from ``claim_base`` (the cached version, or a fresh read), and
        the foreign dependencies they name are read here. Entries the CAS loop's version
        has that the base lacked (declared since; the loop re-read after a 412) have theirs
        read when that version is handed over, so no entry finds a dependency "not
        declared" for want of a read.
        """
        key, codec = self.layout.shard(shard), self.codec(shard)
        here = self.docs.cached(key, codec)
        known_here = {*here.entries, *(here.archived or {})}
        found = _Foreign(self, shard)
        found.read({d for e in candidates for d in e.depends_on if d not in known_here})

        def make(doc: Shard) -> changes.Lookup:
            if doc is not here:
                new = [doc.entries[f] for f in doc.entries.keys() - here.entries.keys()]
                found.read(
                    {
                        d
                        for e in new
                        for d in e.depends_on
                        if d not in found.asked and _live_or_archived(doc, d) is None
                    }
                )

            def lookup(dep: str) -> Entry | None:
                mine = _live_or_archived(doc, dep)
                return mine if mine is not None else found.entry(dep)

            return lookup

        return make

    def _sound_shards(self, damaged: list[DamageNote]) -> dict[str, Shard]:
        """Every shard of the task read fresh; a corrupt one is noted in ``damaged`` and
        reads as empty (a newer schema is still refused: ``UnsupportedSchema``)."""

        def read(name: str) -> Shard | CorruptShard:
            try:
                return self.read_shard(name)
            except CorruptShard as e:
                return e

        names = self.layout.all_shards(self.stages)
        with self.store.runtime.pool(min(len(names), _PARALLEL_READS), "read-shards") as pool:
            got = dict(zip(names, pool.map(read, names), strict=True))
        docs: dict[str, Shard] = {}
        for name, doc in got.items():
            if isinstance(doc, CorruptShard):
                damaged.append(self._damage(self.layout.shard(name), "shard", doc.detail))
                doc = self.codec(name).empty()
            docs[name] = doc
        return docs

    def _damage(self, key: str, kind: str, problem: str) -> DamageNote:
        return DamageNote(key=key, kind=kind, problem=problem, address=self.store.describe(key))

    def _parts_damage(self, entries: Iterable[Entry]) -> list[DamageNote]:
        """The upload states that ready (and consumed) chunked entries need and that are
        missing or do not decode. One listing finds those missing; a state is read (once
        for each entry and checksum: a ready entry's part list never changes) to find it
        sound."""
        wanted = [e for e in entries if needs_parts(e)]
        if not wanted:
            return []
        present = set(list_keys(self.store, self.layout.uploads_prefix))

        def problem(entry: Entry) -> str | None:
            key = entry.parts_key
            assert key is not None
            if key not in present:
                return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
            if (key, entry.checksum) in self._sound_parts:
                return None
            codec = self._upload_codec(key)
            try:
                blob = self.store.get(key)
                assert blob is not None and codec is not None
                codec.decode(key, blob.body)
            except NotFound:
                return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
            except CorruptShard as e:
                return e.detail
            except UnsupportedSchema:
                return None  # a newer release's: not damage
            self._sound_parts.add((key, entry.checksum))
            return None

        with self.store.runtime.pool(min(len(wanted), _PARALLEL_READS), "read-parts") as pool:
            problems = list(pool.map(problem, wanted))
        return [
            self._damage(e.parts_key or "", "upload state", p)
            for e, p in zip(wanted, problems, strict=True)
            if p is not None
        ]

    def unclaimable(self, stage: str) -> str:
        """Why no entry of ``stage`` is claimable now, in words (what a refusal says): no
        entries at all, failed entries waiting out a retry backoff (and until when), and
        that the others are taken, done or waiting for dependencies."""
        entries = list(self.shard(stage).entries.values())
        if not entries:
            return "it has no entries: declare some first"
        now = self.store.now()
        waiting = sorted(
            (e.retry_at, e.file_id)
            for e in entries
            if leases.backing_off(e, now) and e.retry_at is not None
        )
        rest = "taken, done, or waiting for dependencies (see `objmanifest status`)"
        if not waiting:
            return f"all are {rest}"
        n = len(waiting)
        first_at, first = waiting[0]
        return (
            f"{n} failed entr{'y waits' if n == 1 else 'ies wait'} out a retry backoff "
            f"({first!r} is claimable again at {first_at.isoformat()}); the others are {rest}"
        )

    def status(self) -> TaskStatus:
        """Counts per stage and state; blocked, overdue and dead entries named, file ids
        the index and the shards disagree about, and manifest objects that are damaged
        (``damaged``: what they hold is left out of the counts)."""
        damaged: list[DamageNote] = []
        docs = self._sound_shards(damaged)
        index: shard_index.ShardIndex | None
        try:
            index = self.index()  # after the shards: see declare_many
        except CorruptShard as e:
            damaged.append(self._damage(self.layout.index, "index", e.detail))
            index = None
        shards = {s: self._view(s, docs, lambda: index) for s in self.stages}
        everything = {fid: e for sh in shards.values() for fid, e in sh.entries.items()}
        for sh in shards.values():  # archiving: archived entries count in their state
            for fid, ref in (sh.archived or {}).items():
                everything.setdefault(fid, changes.archived_stub(fid, sh.stage, ref))
        now = self.store.now()
        counts: dict[str, dict[str, int]] = {}
        archived: dict[str, int] = {}
        notes: dict[str, list[EntryNote]] = {
            "blocked": [],
            "overdue": [],
            "dead": [],
            "late": [],
            "backing_off": [],
        }
        deadlines = self.header.deadlines or {}
        unindexed: list[IndexNote] = []
        for stage, shard in shards.items():
            counts[stage] = {s.value: 0 for s in State}
            archived[stage] = len(shard.archived or {})
            for ref in (shard.archived or {}).values():
                counts[stage][ref.state.value] += 1
            for entry in shard.entries.values():
                counts[stage][entry.state.value] += 1
                found = [attention(entry, now, everything.get)]
                found.append(timing(entry, now, deadlines.get(entry.stage)))
                for kind, reason in filter(None, found):
                    notes[kind].append(
                        EntryNote(
                            file_id=entry.file_id, stage=stage, state=entry.state, reason=reason
                        )
                    )
                indexed = index.stage_of(entry.file_id) if index is not None else stage
                if indexed != stage:
                    where = "not in the index" if indexed is None else f"indexed in {indexed}"
                    unindexed.append(
                        IndexNote(
                            file_id=entry.file_id,
                            stage=stage,
                            reason=f"in this stage's shard but {where} (damaged): run "
                            "`objmanifest repair`",
                        )
                    )
        broken = {n.key for n in damaged if n.kind == "shard"}

        def why(stage: str, file_id: str) -> str:
            key = self.layout.shard(self.layout.shard_of(stage, file_id))
            if key in broken:
                return f"its shard {key} is damaged: run `objmanifest repair`"
            return "declared, not yet in its shard: rerun the declare"

        unfinished = [
            IndexNote(file_id=file_id, stage=stage, reason=why(stage, file_id))
            for file_id in sorted(index.file_ids() if index is not None else ())
            if index is not None
            and (stage := index.stage_of(file_id) or "") in shards
            and file_id not in shards[stage].entries
            and file_id not in (shards[stage].archived or {})
        ]
        return TaskStatus(
            task_id=self.task_id,
            store_time=now,
            stages=counts,
            unfinished=unfinished,
            unindexed=unindexed,
            archived=archived,
            damaged=damaged + self._parts_damage(everything.values()),
            **notes,
        )

    def wait(
        self,
        stages: Iterable[str] | None = None,
        until: str = "ready",
        timeout: float | None = None,
        *,
        on_wait: Callable[[list[str]], None] | None = None,
    ) -> dict[str, State]:
        """Return once every entry of ``stages`` (default: all) is at least ``until``:
        ``"ready"`` (ready or consumed) or ``"consumed"``, counting entries declared while
        waiting; the state of each as it was then (file id -> state).

        Raises ``DeadWaitedFor`` at once when an entry waited for is dead, naming it, and
        ``WaitTimeout`` (naming those not there yet) after ``timeout`` seconds (None: wait
        for ever). Polls the stages' shards with conditional GETs (a 304 while nothing
        changed), 0.2 s apart at first, growing to 2 s. ``on_wait`` is called with the ids
        still outstanding before the first sleep.
        """
        wanted = self._wait_plan(stages, until, timeout)
        runtime = self.store.runtime
        start = runtime.monotonic()
        delay = WAIT_FIRST_DELAY
        while True:
            found, waiting = self._wait_round(wanted, until)
            if not waiting:
                return found
            remaining = math.inf if timeout is None else start + timeout - runtime.monotonic()
            if remaining <= 0:
                raise self._wait_timeout(wanted, until, timeout, waiting)
            if on_wait is not None:
                on_wait(waiting)
                on_wait = None
            runtime.sleep(min(delay, remaining))
            delay = min(delay * WAIT_GROWTH, WAIT_MAX_DELAY)

    # The parts of ``wait``, shared with ``objmanifest.aio`` (which sleeps on its loop).

    def _wait_plan(
        self, stages: Iterable[str] | None, until: str, timeout: float | None
    ) -> list[str]:
        """The stages waited for, once the arguments are known to be good (no I/O)."""
        if isinstance(stages, str):
            raise InvalidInput(f"stages must be a list of stage names, not the string {stages!r}")
        wanted = list(self.stages if stages is None else dict.fromkeys(stages))
        for stage in wanted:
            self._check_stage(stage)
        if until not in states.UNTIL:
            raise InvalidInput(f"until must be 'ready' or 'consumed', not {until!r}")
        if timeout is not None and not (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout >= 0
        ):
            raise InvalidInput(
                f"timeout must be a finite number of seconds from 0, or None to wait for "
                f"ever, not {timeout!r}"
            )
        return wanted

    def _wait_round(self, wanted: list[str], until: str) -> tuple[dict[str, State], list[str]]:
        """One look at the stages: every entry's state, and the ids not there yet;
        ``DeadWaitedFor`` if one of them is dead."""
        found: dict[str, State] = {}
        for stage in wanted:
            shard = self.shard(stage)
            found.update({fid: ref.state for fid, ref in (shard.archived or {}).items()})
            found.update({fid: e.state for fid, e in shard.entries.items()})
        waiting, dead = states.outstanding(found, until)
        if dead:
            raise DeadWaitedFor(
                f"{_some(dead)} of {', '.join(wanted)} {'is' if len(dead) == 1 else 'are'} "
                f"dead, so waiting for them to be {until} would never end: revive "
                "(`objmanifest revive`) or undeclare them, or stop waiting for them",
                tuple(dead),
            )
        return found, waiting

    @staticmethod
    def _wait_timeout(
        wanted: list[str], until: str, timeout: float | None, waiting: list[str]
    ) -> WaitTimeout:
        return WaitTimeout(
            f"timed out after {timeout:g}s waiting for {len(waiting)} entries of "
            f"{', '.join(wanted)} to be {until}: {_some(waiting)}",
            tuple(waiting),
        )

    def reap(self) -> list[Entry]:
        """Release every expired lease of the task; returns the entries released.

        Any agent may call it at any time: the CAS makes each release happen once. An entry
        that dies of it has its upload aborted (by the task's commit observer).
        """
        released: list[Entry] = []
        for shard in self.layout.all_shards(self.stages):
            released += self.docs.commit(
                self.layout.shard(shard), self.codec(shard), commands.Reap(self.rules)
            )
        return released

    def sweep_uploads(self) -> list[str]:
        """Abort the multipart uploads nobody can adopt any more; returns their keys."""
        return sweep(self.uploads)

    # -- gc (cleanup) ----------------------------------------------------------------------

    def gc(self, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
        """Remove what no entry references any more (see ``ops.gc``): data of fenced
        holders, objects of fenced uploads, uploads nobody can adopt, finished probe
        objects; with ``consumed_older_than`` (seconds) also the data of consumed entries
        last changed before then, marking them first (``DataRemoved`` on a later read).
        Safe while agents work; ``dry_run`` removes nothing and reports the same."""
        if consumed_older_than is not None and not (
            isinstance(consumed_older_than, (int, float))
            and not isinstance(consumed_older_than, bool)
            and math.isfinite(consumed_older_than)
            and consumed_older_than >= 0
        ):
            raise InvalidInput(
                f"consumed_older_than must be a number of seconds >= 0, not {consumed_older_than!r}"
            )
        collector = Collector(
            self.store,
            self.docs,
            self.layout,
            self.stages,
            self.uploads,
            self.codec,
            self.store.now,
            self.archives,
        )
        return collector.run(dry_run, consumed_older_than)

    # -- history ---------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The format of the task's objects: 1 (no journal) or 2 (every version journaled).
        (The header of a task with a shard layout other than one per stage is at 3.)"""
        return self.header.objects_schema

    def _upload_codec(self, key: str) -> UploadCodec | None:
        parsed = self.layout.parse(key)
        if parsed.kind != "upload" or parsed.stage is None or parsed.file_id is None:
            return None
        return UploadCodec(self.task_id, parsed.stage, parsed.file_id, self.schema_version)

    def journaled_objects(self) -> list[tuple[str, Migratable[Any]]]:
        """Every manifest object of the task that keeps a journal, with its codec."""
        objects: list[tuple[str, Migratable[Any]]] = [
            (self.layout.shard(shard), codec) for shard, codec in self._codecs.items()
        ]
        objects.append((self.layout.index, self.index_codec))
        for row in self.store.list(self.layout.uploads_prefix):
            codec = self._upload_codec(row.key)
            if codec is not None:
                objects.append((row.key, codec))
        return objects

    def history(self, file_id: str) -> list[Transition]:
        """The transitions of one entry, oldest first, across takeovers: every committed
        version of its shard that changed it (from the journal)."""
        stage = self.stage_of(file_id)
        shard = self.layout.shard_of(stage, file_id)
        return self.journal.history(file_id, self.layout.shard(shard), self.codec(shard))

    def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
    ) -> list[JournalRecord]:
        """The task's journal records (every object: shards, index, upload states), in the
        order they were decided; only those at or after ``since`` (store time), of
        ``stage``'s objects, or committed by ``agent`` if given."""
        if stage is not None:
            self._check_stage(stage)
        return self.journal.log(since=since, stage=stage, agent=agent, stage_of=self.stage_namer())

    def stage_namer(self) -> Callable[[str], str | None] | None:
        """What names an entry's stage for the journal's readers: the index, on a task that
        keeps every stage in one shard (read again for an id it does not know yet: one
        declared since); None otherwise (each shard is of one stage)."""
        if not self.layout.single:
            return None
        index = self.index()

        def stage_of(file_id: str) -> str | None:
            nonlocal index
            found = index.stage_of(file_id)
            if found is None:
                index = self.index()
                found = index.stage_of(file_id)
            return found

        return stage_of

    def lineage(self, file_id: str) -> Lineage:
        """The upstream graph of ``file_id`` through ``depends_on``, across shards: each
        node with its producer, epoch, checksum, size and times."""
        check_file_id(file_id)
        index = self.index()
        if file_id not in index:
            raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
        shards: dict[str, Shard] = {}

        def entry(fid: str) -> Entry | None:
            stage = index.stage_of(fid)
            if stage is None or stage not in self.stages:
                return None
            shard = self.layout.shard_of(stage, fid)
            if shard not in shards:
                shards[shard] = self.read_shard(shard)
            found = shards[shard].entries.get(fid)
            return found if found is not None else self.archives.entry(shards[shard], fid)

        journals: dict[str, list[JournalRecord]] = {}

        def ready_at(found: Entry) -> datetime | None:
            shard = self.layout.shard_of(found.stage, found.file_id)
            if shard not in journals:
                key = self.layout.shard(shard)
                journals[shard] = self.journal.records(key, self.codec(shard))
            made = [
                t.at
                for t in transitions_of(found.file_id, journals[shard])
                if t.to_state == State.ready.value and t.epoch == found.epoch
            ]
            return made[-1] if made else None

        return lineage(file_id, index, entry, ready_at)

    def flush_journal(self) -> None:
        """Wait for the journal blocks this process started writing."""
        self.docs.flush()

    # -- journal retention -------------------------------------------------------------------

    def trim_journal(
        self,
        keep_seconds: float | None = None,
        keep_versions: int | None = None,
        *,
        dry_run: bool = False,
    ) -> list[Dropped]:
        """Delete the journal blocks beyond the task's retention (``journal_keep_seconds``,
        ``journal_keep_versions`` of its header; the arguments, if given, instead): whole
        blocks only, never a record still inside a live object or not yet in a block.
        Returns what was dropped (what would be, with ``dry_run``); readers say it too
        (``dropped``)."""
        if keep_seconds is None and keep_versions is None:
            keep_seconds = self.header.journal_keep_seconds
            keep_versions = self.header.journal_keep_versions
        seconds, versions = check_retention(keep_seconds, keep_versions)
        trimmer = Trimmer(self.store, self.docs.detached(), self.layout, seconds, versions)
        return trimmer.trim(self.journaled_objects(), dry_run=dry_run)

    def dropped(self, file_id: str | None = None) -> list[Dropped]:
        """What journal retention dropped: of every journaled object, or of the shard that
        holds ``file_id`` (whose ``history`` then starts after it)."""
        if file_id is not None:
            stage = self.stage_of(file_id)
            keys = [self.layout.shard(self.layout.shard_of(stage, file_id))]
        else:
            keys = [key for key, _ in self.journaled_objects()]
        return [d for key in keys for d in self.journal.dropped(key)]

    def migrate(self) -> list[str]:
        """Move the task to this release's schema (``SCHEMA_VERSION``): the header first, so
        agents that open the task from now on use it, then every shard, the index and every
        upload state, each by a commit (journaled from that version on). Run it once every
        agent runs this release: an older release then refuses the task
        (``UnsupportedSchema``) and changes nothing. Returns the keys it moved; running it
        again moves nothing."""
        target = SCHEMA_VERSION
        moved: list[str] = []
        header_codec = HeaderCodec(self.task_id)
        header = self.docs.read(self.layout.header, header_codec)
        if header.schema_version < target:
            header = self.docs.commit(
                self.layout.header, header_codec, MigrateHeader(target, READERS[target])
            )
            moved.append(self.layout.header)
        self._configure(header)
        for key, codec in self.journaled_objects():
            try:
                if self.docs.commit(key, codec, Migrate(codec, target)):
                    moved.append(key)
            except NotFound:
                continue
        return moved

    # -- lifecycle verbs (issue 10: revive, undeclare, delete) ----------------------------

    def revive(self, file_id: str) -> Entry:
        """A dead entry back to ``failed`` with ``retry_count`` 0, so it is claimable again
        (once its cause is fixed); ``WrongState`` if it is not dead. An archived dead entry
        comes back into its live shard."""
        stage = self.stage_of(file_id)
        shard = self.layout.shard_of(stage, file_id)
        doc = self.read_shard(shard)
        archived = self.archives.entry(doc, file_id) if file_id not in doc.entries else None
        command = verbs.Revive(file_id, archived=archived)
        return self.docs.commit(self.layout.shard(shard), self.codec(shard), command)

    def undeclare(self, file_id: str) -> Entry | None:
        """Remove a pending entry nobody depends on: from its shard, then from the index
        (an interrupted undeclare is finished by running it again). ``WrongState`` if it is
        not pending, ``HasDependents`` naming the entries that depend on it. Returns the
        removed entry (None if only the index still had it)."""
        stage = self.stage_of(file_id)
        waiting = sorted(self.index().dependents(file_id))
        if waiting:
            raise verbs.dependents_error(file_id, waiting)
        shard = self.layout.shard_of(stage, file_id)
        removed = self.docs.commit(
            self.layout.shard(shard), self.codec(shard), verbs.Undeclare(file_id)
        )
        self.docs.commit(self.layout.index, self.index_codec, verbs.UndeclareInIndex(file_id))
        return removed

    def delete(self, force: bool = False) -> deletion.Deleted:
        """Remove the task: its shards, index, data, journal, upload states (multipart
        uploads aborted) and, last, its header.

        Refused (``LeasesLive``, naming the holders) while an entry is written under an
        unexpired lease on the store's clock, unless ``force``. It first marks the header
        (a ``delete`` commit): from then on ``Task.open`` refuses the task and ``Task.list``
        omits it, and a crashed delete is finished by running it again
        (``Task.delete_by_id``). The rest is not journaled: the journal is deleted too. An
        agent that still has the task open sees ``NotFound`` or ``LeaseLost`` on its next
        change, except a ``declare``, which would create a shard and the index again: stop
        declarers first (``delete`` again removes what they wrote).
        """
        codec = HeaderCodec(self.task_id)
        try:
            header = self.docs.read(self.layout.header, codec)
        except NotFound:
            return deletion.remove_leftovers(self.store, self.layout)
        if header.deleting_at is None:
            shards: list[Shard] = []
            for shard in self.layout.all_shards(self.stages):
                try:
                    shards.append(self.read_shard(shard))
                except CorruptShard:
                    if not force:
                        raise
            if not force:
                deletion.refuse_live(self.task_id, deletion.live_holders(shards, self.store.now()))
            self.docs.commit(self.layout.header, codec, deletion.MarkDeleting())
        self.docs.flush()  # journal blocks this process is still writing land first
        return deletion.remove_all(self.store, self.layout)

    @classmethod
    def delete_by_id(
        cls, store: ObjectStore, task_id: str, *, force: bool = False
    ) -> deletion.Deleted:
        """``delete`` a task by its id, also one a crashed delete left half-deleted (whose
        ``open`` is refused); ``NotFound`` if nothing of it is left."""
        layout = TaskLayout(task_id)
        codec = HeaderCodec(task_id)
        try:
            blob = store.get(layout.header)
        except NotFound:
            return deletion.remove_leftovers(store, layout)
        assert blob is not None
        try:
            header = codec.decode(layout.header, blob.body)
        except (CorruptShard, UnsupportedSchema) as e:
            raise e.at(store.describe(layout.header), HEADER_REPAIR) from None
        return cls(store, header).delete(force=force)

    # -- repair (issue 10: Repair) -----------------------------------------------------------

    def repair(self, dry_run: bool = False) -> RepairReport:
        """Rebuild every stage shard and the index that was deleted or is corrupt: a shard
        from its journal (and the index), the index from the shards; a corrupt object is
        copied to ``TASK/damaged/`` first. An index that is sound but lacks ids the shards
        hold gets them (``repair_index``). Returns what was restored and what could not
        be; with ``dry_run``, what would be, writing nothing. See ``ops.repair`` for the
        rules each rebuilt entry follows."""
        repairer = Repairer(
            self.store,
            self.docs,
            self.layout,
            self.journal,
            self._codecs,
            self.index_codec,
            self.stages,
            self.journaled_objects,
            self._upload_codec,
        )
        return repairer.run(dry_run, self.repair_index)

    # -- archiving -------------------------------------------------------------------------

    def archive(self, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
        """Move every terminal entry (consumed, dead) last updated ``older_than`` seconds
        ago or more (the store's clock) out of the live shards into write-once archive
        objects, one commit per shard. Safe while agents work; ``entry``, ``history``,
        ``lineage``, ``status``, dependency checks and declarations still find them."""
        age = check_age(older_than)
        archived: dict[str, list[str]] = {}
        written: list[str] = []
        adopted: list[str] = []

        def commit(shard: str, command: commands.Archive) -> list[str]:
            return self.docs.commit(self.layout.shard(shard), self.codec(shard), command)

        for shard in self.layout.all_shards(self.stages):
            ids, new, left = self.archives.archive_shard(self.read_shard(shard), age, commit, actor)
            own = self.layout.stage_of_shard(shard)
            index = self.index() if own is None and ids else None
            for fid in ids:
                stage = own or (index.stage_of(fid) if index is not None else None) or shard
                archived.setdefault(stage, []).append(fid)
            written += new
            adopted += left
        return ArchiveReport(
            archived={s: archived.get(s, []) for s in dict.fromkeys((*self.stages, *archived))},
            objects=written,
            adopted=adopted,
        )


class _Foreign:
    """The entries of other shards a claim's dependencies name, from fresh reads of the
    index and those shards (each shard read once per claim, the index once per batch)."""

    def __init__(self, task: Manifest, shard: str) -> None:
        self.task = task
        self.shard = shard
        self.asked: set[str] = set()
        self.index: shard_index.ShardIndex | None = None
        self.shards: dict[str, Shard] = {}

    def read(self, deps: set[str]) -> None:
        if not deps:
            return
        self.asked |= deps
        task = self.task
        self.index = index = task.index()
        wanted = {
            task.layout.shard_of(stage, dep)
            for dep in deps
            if (stage := index.stage_of(dep)) is not None
        } - {self.shard, *self.shards}
        self.shards.update((s, task.read_shard(s)) for s in sorted(wanted))

    def entry(self, dep: str) -> Entry | None:
        stage = self.index.stage_of(dep) if self.index is not None else None
        other = self.shards.get(self.task.layout.shard_of(stage, dep)) if stage else None
        return _live_or_archived(other, dep) if other is not None else None


def _live_or_archived(doc: Shard, file_id: str) -> Entry | None:
    """A dependency as a shard knows it: its live entry, or its archived state."""
    found = doc.entries.get(file_id)
    if found is not None:
        return found
    ref = (doc.archived or {}).get(file_id)
    return changes.archived_stub(file_id, doc.stage, ref) if ref is not None else None


@dataclass(frozen=True)
class MigrateHeader:
    """The task header at a newer schema version (and the release that reads it)."""

    schema_version: int
    requires: str
    name: ClassVar[str] = "migrate"
    actor: ClassVar[str] = ""

    def apply(self, doc: TaskHeader, now: datetime) -> tuple[TaskHeader | None, TaskHeader]:
        if doc.schema_version >= self.schema_version:
            return None, doc
        moved = doc.model_copy(
            update={"schema_version": self.schema_version, "requires": self.requires}
        )
        return moved, moved


@dataclass(frozen=True)
class Migrate(Generic[D]):
    """A manifest object at a newer schema version; nothing to write if it is there."""

    codec: Migratable[D]
    schema_version: int
    name: ClassVar[str] = "migrate"
    actor: ClassVar[str] = ""

    def apply(self, doc: D, now: datetime) -> tuple[D | None, bool]:
        if self.codec.schema_of(doc) >= self.schema_version:
            return None, False
        return self.codec.migrated(doc, self.schema_version), True


def _refuse_twice(batch: list[Declaration]) -> None:
    """One batch may name an id twice only with the same declaration."""
    first: dict[str, Declaration] = {}
    for decl in batch:
        seen = first.setdefault(decl.file_id, decl)
        if seen != decl:
            diffs = [
                f"{name}: {getattr(seen, name)!r} vs {getattr(decl, name)!r}"
                for name in ("stage", "depends_on", "consumers")
                if getattr(seen, name) != getattr(decl, name)
            ]
            raise DeclarationConflict(
                f"the batch declares {decl.file_id!r} twice, differently ({'; '.join(diffs)}); "
                "nothing was declared. Keep one of them."
            )


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


class RepairIndex(DeclareInIndex):
    """Put entries the shards hold back into the index (file id, stage, dependencies)."""

    name: ClassVar[str] = "repair_index"

    def __init__(self, tuples: list[tuple[str, str, tuple[str, ...]]]) -> None:
        self.tuples = tuples


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


def timing(entry: Entry, now: datetime, deadline: float | None) -> tuple[str, str] | None:
    """Whether a status report should name this entry for its timing: ("late", why) past
    its stage's deadline, ("backing_off", until when) waiting out a retry backoff."""
    if leases.late(entry, now, deadline):
        due = leases.due_at(entry, deadline)
        assert due is not None
        what = "ready" if entry.state is State.writing else "consumed"
        return (
            "late",
            f"{entry.state.value} past its stage's deadline: due {what} by {due.isoformat()}",
        )
    if leases.backing_off(entry, now):
        assert entry.retry_at is not None
        return "backing_off", f"may be retried from {entry.retry_at.isoformat()}"
    return None


__all__ = ["Manifest", "attention", "check_retention", "check_settings", "timing"]
