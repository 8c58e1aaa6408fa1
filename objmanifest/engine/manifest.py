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
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, ClassVar, TypeVar

import shard_index

from ..cas.codecs import IndexCodec, ShardCodec
from ..cas.loop import Documents
from ..cas.policy import CasPolicy
from ..core import changes
from ..core.events import Observer, Observers
from ..core.layout import TaskLayout
from ..core.model import (
    SCHEMA_VERSION,
    ArchiveReport,
    Claim,
    DamageNote,
    Declaration,
    Entry,
    JournalRecord,
    Shard,
    State,
    TaskHeader,
    TaskStatus,
)
from ..core.names import check_file_id
from ..data import transfer
from ..data.chunked import Scope, sweep
from ..data.chunked.state import UploadCodec
from ..data.effects import TransitionEffects
from ..data.transfer import TransferConfig
from ..errors import NotFound
from ..journal.history import Dropped, History, Lineage, Transition
from ..ops import deletion
from ..ops.archive import Archives
from ..ops.gc import GcReport
from ..ops.reports import RepairReport
from ..store import ObjectStore
from . import declaring, journaling, opening, operations, reads, status
from .commands import Migratable

M = TypeVar("M", bound="Manifest")


class Manifest:
    """The manifest of one job, and the reads and commits on it. Safe to share between
    threads."""

    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION
    index_codec: IndexCodec
    _codecs: dict[str, ShardCodec]
    uploads: Scope

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
        opening._configure(self, header)

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
        return opening.create(
            cls,
            store,
            task_id,
            stages,
            lease_seconds,
            max_retries,
            policy=policy,
            transfer=transfer,
            journal_keep_seconds=journal_keep_seconds,
            journal_keep_versions=journal_keep_versions,
            partitions=partitions,
            layout=layout,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            deadlines=deadlines,
        )

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
        return opening.open(cls, store, task_id, policy=policy, transfer=transfer)

    def is_current(self) -> bool:
        """Whether the task this object was opened on is still the one under its id: not
        deleted, not being deleted, not created anew (with other settings, say), and its
        header unchanged. One conditional GET of the header (a 304 while it is). A reader
        that keeps a ``Task`` for long (the web page) opens it again once this is False."""
        return opening.is_current(self)

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
        return reads.shard_key(self, stage, file_id)

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

    def request_counts(self) -> dict[str, int]:
        """What this task object's commit loop has done since it was opened, a snapshot:
        ``commits`` that landed, ``writes`` (the PUTs they took: a group commit's members
        share one; ``grouped`` counts the rest), ``conflicts`` (lost races), ``reads``,
        ``not_modified`` (304s), ``lost_responses`` and ``journal_blocks`` written. No I/O."""
        stats = self.docs.stats
        return {**dataclasses.asdict(stats), "writes": stats.writes}

    # -- reading -------------------------------------------------------------------------

    def read_shard(self, shard: str) -> Shard:
        """A fresh read of one shard (a 304 when nothing changed)."""
        return self.docs.read(self.layout.shard(shard), self.codec(shard))

    def read_shards(self, shards: Iterable[str]) -> dict[str, Shard]:
        """Fresh reads of several shards, in parallel (304s when nothing changed)."""
        return reads.read_shards(self, shards)

    def shard(self, stage: str) -> Shard:
        """A fresh read of one stage's entries: its shard, or a view of all its partitions
        (or of its entries in the task's one shard). A view is no stored object: its
        version is 0; commit to a shard by name (``claim.shard``) instead."""
        return reads.shard(self, stage)

    def _view(
        self,
        stage: str,
        docs: Mapping[str, Shard],
        index: Callable[[], shard_index.ShardIndex | None],
    ) -> Shard:
        """``stage``'s entries from the shards ``docs`` holds (read already); ``index`` is
        asked only to place the archived ids of a task's one shard (None: they are left
        out)."""
        return reads._view(self, stage, docs, index)

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
        return reads.entry(self, file_id)

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
        return reads.routed(self, claim)

    def resumed(self, agent: str, held: list[tuple[str, int]]) -> list[Claim]:
        """The claims ``agent`` got at each (file id, epoch), rebuilt from the index and the
        entries (each shard read once); see ``Agent.resume``."""
        return declaring.resumed(self, agent, held)

    def held(self, claim: Claim) -> Entry:
        """The entry, read fresh, if ``claim`` still holds it; else ``LeaseLost``."""
        return declaring.held(self, claim)

    # -- declaring ---------------------------------------------------------------------

    def declare(
        self,
        file_id: str,
        stage: str,
        depends_on: Iterable[str] = (),
        consumers: Iterable[str] = (),
    ) -> Entry:
        """Declare one file. The same declaration again is a no-op."""
        return declaring.declare(self, file_id, stage, depends_on, consumers)

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
        return declaring.declare_many(self, decls)

    def _all_shards(self, read: dict[str, Shard] | None = None) -> dict[str, Shard]:
        """Every shard of the task, read fresh (those in ``read`` are taken as they are)."""
        return reads._all_shards(self, read)

    def _refuse_unindexed(self, batch: list[Declaration], shards: dict[str, Shard]) -> None:
        """Refuse to declare an id that a shard holds but the index lacks (the index was
        deleted or replaced by hand): declaring it again could put it in a second stage."""
        declaring._refuse_unindexed(self, batch, shards)

    def repair_index(self) -> list[str]:
        """Put back into the index every entry a shard holds and the index lacks (after the
        index was deleted or replaced by hand); returns their file ids.

        An id held by two shards, or by a shard other than the stage the index gives it,
        cannot be placed: the others are added, then ``CorruptShard`` names those.
        """
        return declaring.repair_index(self)

    # -- dependencies, status, reaping, cleaning up, gc ----------------------------------

    def claim_base(self, shard: str) -> Shard:
        """The version of ``shard`` a claim chooses from: the cached one while it is likely
        current (``Documents.likely_current``: the claim's write is conditional on it, so a
        stale one costs a 412 and the claim chooses again on the version read then), else a
        fresh read (a 304 when nothing changed)."""
        return reads.claim_base(self, shard)

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
        return declaring.lookup_for(self, shard, candidates)

    def _sound_shards(self, damaged: list[DamageNote]) -> dict[str, Shard]:
        """Every shard of the task read fresh; a corrupt one is noted in ``damaged`` and
        reads as empty (a newer schema is still refused: ``UnsupportedSchema``)."""
        return status._sound_shards(self, damaged)

    def _damage(self, key: str, kind: str, problem: str) -> DamageNote:
        return DamageNote(key=key, kind=kind, problem=problem, address=self.store.describe(key))

    def _parts_damage(self, entries: Iterable[Entry]) -> list[DamageNote]:
        """The upload states that ready (and consumed) chunked entries need and that are
        missing or do not decode. One listing finds those missing; a state is read (once
        for each entry and checksum: a ready entry's part list never changes) to find it
        sound."""
        return status._parts_damage(self, entries)

    def unclaimable(self, stage: str) -> str:
        """Why no entry of ``stage`` is claimable now, in words (what a refusal says): no
        entries at all, failed entries waiting out a retry backoff (and until when), and
        that the others are taken, done or waiting for dependencies."""
        return status.unclaimable(self, stage)

    def status(self) -> TaskStatus:
        """Counts per stage and state; blocked, overdue and dead entries named, file ids
        the index and the shards disagree about, and manifest objects that are damaged
        (``damaged``: what they hold is left out of the counts)."""
        return status.status(self)

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
        return status.wait(self, stages, until, timeout, on_wait=on_wait)

    def outstanding(
        self, stages: Iterable[str] | None = None, until: str = "ready"
    ) -> tuple[dict[str, State], list[str]]:
        """One look at what ``wait`` waits for, without waiting: the state of every entry of
        ``stages`` (default: all; file id -> state) and the ids not yet ``until``.
        Raises ``DeadWaitedFor`` when one of them is dead, as ``wait`` does."""
        return status.outstanding(self, stages, until)

    def reap(self) -> list[Entry]:
        """Release every expired lease of the task; returns the entries released.

        Any agent may call it at any time: the CAS makes each release happen once. An entry
        that dies of it has its upload aborted (by the task's commit observer).
        """
        return status.reap(self)

    def sweep_uploads(self) -> list[str]:
        """Abort the multipart uploads nobody can adopt any more; returns their keys."""
        return sweep(self.uploads)

    def gc(self, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
        """Remove what no entry references any more (see ``ops.gc``): data of fenced
        holders, objects of fenced uploads, uploads nobody can adopt, finished probe
        objects; with ``consumed_older_than`` (seconds) also the data of consumed entries
        last changed before then, marking them first (``DataRemoved`` on a later read).
        Safe while agents work; ``dry_run`` removes nothing and reports the same."""
        return status.gc(self, dry_run, consumed_older_than)

    # -- history and retention -----------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The format of the task's objects: 1 (no journal) or 2 (every version journaled).
        (The header of a task with a shard layout other than one per stage is at 3.)"""
        return self.header.objects_schema

    def _upload_codec(self, key: str) -> UploadCodec | None:
        return reads._upload_codec(self, key)

    def journaled_objects(self) -> list[tuple[str, Migratable[Any]]]:
        """Every manifest object of the task that keeps a journal, with its codec."""
        return journaling.journaled_objects(self)

    def history(self, file_id: str) -> list[Transition]:
        """The transitions of one entry, oldest first, across takeovers: every committed
        version of its shard that changed it (from the journal)."""
        return journaling.history(self, file_id)

    def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
    ) -> list[JournalRecord]:
        """The task's journal records (every object: shards, index, upload states), in the
        order they were decided; only those at or after ``since`` (store time), of
        ``stage``'s objects, or committed by ``agent`` if given."""
        return journaling.log(self, since, stage, agent)

    def stage_namer(self) -> Callable[[str], str | None] | None:
        """What names an entry's stage for the journal's readers: the index, on a task that
        keeps every stage in one shard (read again for an id it does not know yet: one
        declared since); None otherwise (each shard is of one stage)."""
        return journaling.stage_namer(self)

    def lineage(self, file_id: str) -> Lineage:
        """The upstream graph of ``file_id`` through ``depends_on``, across shards: each
        node with its producer, epoch, checksum, size and times."""
        return journaling.lineage(self, file_id)

    def flush_journal(self) -> None:
        """Wait for the journal blocks this process started writing."""
        self.docs.flush()

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
        return journaling.trim_journal(self, keep_seconds, keep_versions, dry_run=dry_run)

    def dropped(self, file_id: str | None = None) -> list[Dropped]:
        """What journal retention dropped: of every journaled object, or of the shard that
        holds ``file_id`` (whose ``history`` then starts after it)."""
        return journaling.dropped(self, file_id)

    def migrate(self) -> list[str]:
        """Move the task to this release's schema (``SCHEMA_VERSION``): the header first, so
        agents that open the task from now on use it, then every shard, the index and every
        upload state, each by a commit (journaled from that version on). Run it once every
        agent runs this release: an older release then refuses the task
        (``UnsupportedSchema``) and changes nothing. Returns the keys it moved; running it
        again moves nothing."""
        return journaling.migrate(self)

    # -- operators' verbs: revive, undeclare, delete, repair, archive ---------------------

    def revive(self, file_id: str) -> Entry:
        """A dead entry back to ``failed`` with ``retry_count`` 0, so it is claimable again
        (once its cause is fixed); ``WrongState`` if it is not dead. An archived dead entry
        comes back into its live shard."""
        return operations.revive(self, file_id)

    def undeclare(self, file_id: str) -> Entry | None:
        """Remove a pending entry nobody depends on: from its shard, then from the index
        (an interrupted undeclare is finished by running it again). ``WrongState`` if it is
        not pending, ``HasDependents`` naming the entries that depend on it. Returns the
        removed entry (None if only the index still had it)."""
        return operations.undeclare(self, file_id)

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
        return opening.delete(self, force)

    @classmethod
    def delete_by_id(
        cls, store: ObjectStore, task_id: str, *, force: bool = False
    ) -> deletion.Deleted:
        """``delete`` a task by its id, also one a crashed delete left half-deleted (whose
        ``open`` is refused); ``NotFound`` if nothing of it is left."""
        return opening.delete_by_id(cls, store, task_id, force=force)

    def repair(self, dry_run: bool = False) -> RepairReport:
        """Rebuild every stage shard and the index that was deleted or is corrupt: a shard
        from its journal (and the index), the index from the shards; a corrupt object is
        copied to ``TASK/damaged/`` first. An index that is sound but lacks ids the shards
        hold gets them (``repair_index``). Returns what was restored and what could not
        be; with ``dry_run``, what would be, writing nothing. See ``ops.repair`` for the
        rules each rebuilt entry follows."""
        return operations.repair(self, dry_run)

    def archive(self, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
        """Move every terminal entry (consumed, dead) last updated ``older_than`` seconds
        ago or more (the store's clock) out of the live shards into write-once archive
        objects, one commit per shard. Safe while agents work; ``entry``, ``history``,
        ``lineage``, ``status``, dependency checks and declarations still find them."""
        return operations.archive(self, older_than, actor)


__all__ = ["Manifest"]
