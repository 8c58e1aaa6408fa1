"""A task: the manifest of one job, and the agents that work on it.

``Task`` holds the manifest engine (``engine.manifest.Manifest``) and offers exactly the
calls the documentation presents (creating, opening, declaring, status, waiting, reaping,
the journal, the operators' verbs) and makes its agents: ``task.agent(name, role)``. Each
call is a few lines over the engine module of its concern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import shard_index

from .agent import Agent
from .cas.codecs import HeaderCodec
from .cas.policy import CasPolicy
from .core.commit_events import Observer
from .core.layout import TaskLayout
from .core.model import (
    ArchiveReport,
    Claim,
    Declaration,
    Entry,
    JournalRecord,
    Shard,
    TaskHeader,
)
from .core.report import TaskStatus
from .core.settings import TaskSettings
from .core.states import State
from .core.waiting import WaitPlan
from .data.chunked import sweep
from .data.transfer import TransferConfig
from .engine import declaring, journaling, opening, operations, reads, status
from .engine.attention import attention
from .engine.manifest import Manifest
from .errors import ObjManifestError
from .journal.history import Dropped, Lineage, Transition
from .ops.deletion import Deleted, task_ids
from .ops.gc import GcReport
from .ops.reports import RepairReport
from .store import ObjectStore
from .store.errors import NoSuchObject


class Task:
    """The manifest of one job. Safe to share between threads."""

    def __init__(self, store: ObjectStore, header: TaskHeader, **options: Any) -> None:
        """The task of ``header`` as read already (``options``: ``policy``, ``transfer``,
        ``header_etag``); ``Task.open`` and ``Task.create`` read or write it first."""
        self._engine = Manifest(store, header, **options)

    @classmethod
    def _holding(cls, engine: Manifest) -> Task:
        task = cls.__new__(cls)
        task._engine = engine
        return task

    def __repr__(self) -> str:
        return f"Task({self.task_id!r} at {self.store.url})"

    # -- creating and opening ----------------------------------------------------------

    @classmethod
    def create(
        cls,
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
        partitions: Mapping[str, int | str] | None = None,
        layout: str | None = None,
        retry_backoff: float = 0,
        retry_backoff_max: float | None = None,
        deadlines: Mapping[str, float] | None = None,
        agents: int | None = None,
        spread: bool | None = None,
    ) -> Task:
        """Create a task (``AlreadyExists`` if it is there) after checking the store is safe.

        ``journal_keep_seconds``/``journal_keep_versions`` bound its journal (see
        ``trim_journal``); by default every record is kept. ``partitions`` splits hot stages
        into hash partitions, each a shard of its own (``{"collect": 16}``), so agents of
        one stage do not all commit to one object; ``layout="task"`` keeps every entry in
        one shard (only as a baseline to compare against). Both are fixed for the life of
        the task. A count of ``"auto"`` is chosen from ``agents``, the number of agents
        expected (about two partitions per agent). ``spread`` keeps each partition's shard
        and data under key prefixes of their own, so a stage is not capped by what one S3
        prefix serves (header schema 4, which 0.3.0 refuses); by default a task is spread
        once a stage has 64 partitions or more, and stages of more than 1,024 need it.

        ``retry_backoff`` (seconds, default 0: none) makes a failed entry claimable again
        only that long after its failure, doubling per retry up to ``retry_backoff_max``
        (default 64 times ``retry_backoff``), on the store's clock. ``deadlines`` gives
        stages the seconds an entry may stay writing (from its claim) or ready without
        being consumed (from ``ready_at``) before ``status`` lists it as ``late``.
        """
        settings = TaskSettings(
            stages,
            lease_seconds,
            max_retries,
            journal_keep_seconds,
            journal_keep_versions,
            partitions,
            layout,
            retry_backoff,
            retry_backoff_max,
            deadlines,
            agents,
            spread,
        )
        engine = opening.create(store, task_id, settings, policy=policy, transfer=transfer)
        return cls._holding(engine)

    @classmethod
    def open(
        cls,
        store: ObjectStore,
        task_id: str,
        *,
        policy: CasPolicy | None = None,
        transfer: TransferConfig | None = None,
    ) -> Task:
        """Open an existing task (``NotFound`` if there is none)."""
        return cls._holding(opening.open(store, task_id, policy=policy, transfer=transfer))

    def is_current(self) -> bool:
        """Whether the task this object was opened on is still the one under its id: not
        deleted, not being deleted, not created anew (with other settings, say), and its
        header unchanged. One conditional GET of the header (a 304 while it is). A reader
        that keeps a ``Task`` for long (the web page) opens it again once this is False."""
        return opening.is_current(self._engine)

    def agent(self, name: str, role: str | None = None) -> Agent:
        """An agent working on this task; ``role`` (for consumers) defaults to the name."""
        return Agent(self._engine, name, role)

    # -- settings ------------------------------------------------------------------------

    @property
    def store(self) -> ObjectStore:
        """The store the task lives in."""
        return self._engine.store

    @property
    def header(self) -> TaskHeader:
        """The task's header as this object read it: its stages and settings, and
        ``objects_schema``, the format of its manifest objects (1: no journal; 2: every
        version journaled)."""
        return self._engine.header

    @property
    def task_id(self) -> str:
        return self._engine.task_id

    @property
    def stages(self) -> tuple[str, ...]:
        return self._engine.stages

    @property
    def lease_seconds(self) -> float:
        return self._engine.header.lease_seconds

    @property
    def max_retries(self) -> int:
        return self._engine.header.max_retries

    @property
    def transfer(self) -> TransferConfig:
        """How data moves: ``transfer=`` given to ``create``/``open``, else the defaults."""
        return self._engine.transfer

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer`` with every commit this task object makes (a ``CommitEvent``:
        object, version, command, actor and the entries' transitions); returns the function
        that stops it."""
        return self._engine.observers.subscribe(observer)

    def request_counts(self) -> dict[str, int]:
        """What this task object's commit loop has done since it was opened, a snapshot:
        ``commits`` that landed, ``writes`` (the PUTs they took: a group commit's members
        share one; ``grouped`` counts the rest), ``conflicts`` (lost races), ``reads``,
        ``not_modified`` (304s), ``lost_responses`` and ``journal_blocks`` written. No I/O."""
        return self._engine.request_counts()

    # -- reading -------------------------------------------------------------------------

    def entry(self, file_id: str) -> Entry:
        """The entry as the store has it now."""
        return reads.entry(self._engine, file_id)

    def entries(self, stage: str | None = None) -> list[Entry]:
        """The live entries of ``stage`` (default: every stage), read fresh."""
        return reads.entries(self._engine, stage)

    def shard(self, stage: str) -> Shard:
        """A fresh read of one stage's entries: its shard, or a view of all its partitions
        (or of its entries in the task's one shard). A view is no stored object: its
        version is 0; commit to a shard by name (``claim.shard``) instead."""
        return reads.shard(self._engine, stage)

    def shard_names(self, stage: str | None = None, file_id: str | None = None) -> list[str]:
        """The names of the stored shards, no request: every shard of the task, those that
        hold ``stage``'s entries (its own, each partition of a split stage, or the task's
        one shard), or with ``file_id`` the one that holds it. ``NotFound`` for a stage the
        task lacks."""
        return self._engine.shard_names(stage, file_id)

    def shards(
        self, names: Iterable[str] | None = None, *, cached: bool = False
    ) -> dict[str, Shard]:
        """Stored shards by name (``shard_names``; default every one), each read fresh: a
        conditional GET (a 304 while it did not change), several in parallel. With
        ``cached``, each as this task object last read or wrote it, with no request (one it
        never read is read): what a reader that just called ``status`` uses to look again
        at what it saw."""
        given = self._engine.shard_names() if names is None else names
        return self._engine.read_shards(given, cached=cached)

    def index(self) -> shard_index.ShardIndex:
        """The dependency index (every file id, its stage and dependencies), read fresh."""
        return self._engine.index()

    def stage_of(self, file_id: str) -> str:
        """The stage ``file_id`` is declared in (``NotFound`` if it is not)."""
        return self._engine.stage_of(file_id)

    def held(self, claim: Claim) -> Entry:
        """The entry, read fresh, if ``claim`` still holds it; else ``LeaseLost``."""
        return self._engine.held(claim)

    # -- declaring -----------------------------------------------------------------------

    def declare(
        self,
        file_id: str,
        stage: str,
        depends_on: Iterable[str] = (),
        consumers: Iterable[str] = (),
    ) -> Entry:
        """Declare one file. The same declaration again is a no-op."""
        return declaring.declare(self._engine, file_id, stage, depends_on, consumers)

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
        return declaring.declare_many(self._engine, decls)

    def repair_index(self) -> list[str]:
        """Put back into the index every entry a shard holds and the index lacks (after the
        index was deleted or replaced by hand); returns their file ids.

        An id held by two shards, or by a shard other than the stage the index gives it,
        cannot be placed: the others are added, then ``CorruptShard`` names those.
        """
        return declaring.repair_index(self._engine)

    # -- status, waiting, reaping, cleaning up -------------------------------------------

    def unclaimable(self, stage: str) -> str:
        """Why no entry of ``stage`` is claimable now, in words (what a refusal says): no
        entries at all, failed entries waiting out a retry backoff (and until when), and
        that the others are taken, done or waiting for dependencies."""
        return status.unclaimable(self._engine, stage)

    def status(self) -> TaskStatus:
        """Counts per stage and state; blocked, overdue and dead entries named, file ids
        the index and the shards disagree about, and manifest objects that are damaged
        (``damaged``: what they hold is left out of the counts)."""
        return status.status(self._engine)

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
        return status.wait(self._engine, stages, until, timeout, on_wait=on_wait)

    def wait_plan(
        self,
        stages: Iterable[str] | None = None,
        until: str = "ready",
        timeout: float | None = None,
    ) -> WaitPlan:
        """What ``wait`` would wait for, its arguments checked (``InvalidInput``,
        ``NotFound`` for an unknown stage) with no request: the ``stages``, ``until`` and
        ``timeout``, the sleeps between its looks (``delays()``) and the ``WaitTimeout`` it
        ends with (``timed_out(ids)``). A caller that waits its own way (on an event loop)
        looks with ``outstanding`` and sleeps as the plan says."""
        engine = self._engine
        return WaitPlan.of(engine.stages, engine.check_stage, stages, until, timeout)

    def outstanding(
        self, stages: Iterable[str] | None = None, until: str = "ready"
    ) -> tuple[dict[str, State], list[str]]:
        """One look at what ``wait`` waits for, without waiting: the state of every entry of
        ``stages`` (default: all; file id -> state) and the ids not yet ``until``.
        Raises ``DeadWaitedFor`` when one of them is dead, as ``wait`` does."""
        return status.outstanding(self._engine, stages, until)

    def reap(self) -> list[Entry]:
        """Release every expired lease of the task; returns the entries released.

        Any agent may call it at any time: the CAS makes each release happen once. An entry
        that dies of it has its upload aborted (by the task's commit observer).
        """
        return status.reap(self._engine)

    def sweep_uploads(self) -> list[str]:
        """Abort the multipart uploads nobody can adopt any more; returns their keys."""
        return sweep(self._engine.uploads)

    def gc(self, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
        """Remove what no entry references any more (see ``ops.gc``): data of fenced
        holders, objects of fenced uploads, uploads nobody can adopt, finished probe
        objects; with ``consumed_older_than`` (seconds) also the data of consumed entries
        last changed before then, marking them first (``DataRemoved`` on a later read).
        Safe while agents work; ``dry_run`` removes nothing and reports the same."""
        return status.gc(self._engine, dry_run, consumed_older_than)

    # -- history and retention -----------------------------------------------------------

    def history(self, file_id: str, *, after: dict[str, int] | None = None) -> list[Transition]:
        """The transitions of one entry, oldest first, across takeovers: every committed
        version of its shard that changed it (from the journal). With ``after`` (object
        key -> the newest version a reader has seen, kept up to date by the call), only
        those committed since, as ``log`` reads them."""
        return journaling.history(self._engine, file_id, after)

    def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
        *,
        after: dict[str, int] | None = None,
    ) -> list[JournalRecord]:
        """The task's journal records (every object: shards, index, upload states), in the
        order they were decided; only those at or after ``since`` (store time), of
        ``stage``'s objects, or committed by ``agent`` if given.

        With ``after`` (object key -> the newest version a reader has seen; the call adds
        what it returns), only the records committed since: each object costs a
        conditional GET (a 304 when it did not change), and its journal blocks are read
        only if records moved there meanwhile, only those. How ``objmanifest log -f``
        follows a task."""
        return journaling.log(self._engine, since, stage, agent, after)

    def stage_logs(
        self,
        shards: Mapping[str, Shard],
        seen: dict[str, tuple[str | None, int]],
        since: datetime | None = None,
        *,
        skip_damaged: bool = False,
    ) -> dict[str, list[JournalRecord]]:
        """Per stage, the journal records of ``shards`` (as ``shards()`` returned them, so
        this reads no shard) committed since ``seen`` (shard name -> its journal's
        incarnation and the newest version returned; the call keeps it up to date), at or
        after ``since``. A shard's journal blocks are read only when it no longer carries
        every record newer than ``seen`` (the first look, a rebuilt shard, records moved
        out in between), and then only the newer blocks. A record of the task's one shard
        is given to each stage with that stage's transitions, by the index as this object
        last read it. With ``skip_damaged``, a shard whose journal block does not read back
        (or the index) is left out rather than raising ``CorruptShard``."""
        return journaling.stage_logs(self._engine, shards, seen, since, skip_damaged)

    def lineage(self, file_id: str) -> Lineage:
        """The upstream graph of ``file_id`` through ``depends_on``, across shards: each
        node with its producer, epoch, checksum, size and times."""
        return journaling.lineage(self._engine, file_id)

    def flush_journal(self) -> None:
        """Wait for the journal blocks this process started writing."""
        self._engine.docs.flush()

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
        return journaling.trim_journal(self._engine, keep_seconds, keep_versions, dry_run=dry_run)

    def dropped(self, file_id: str | None = None, *, stage: str | None = None) -> list[Dropped]:
        """What journal retention dropped: of every journaled object, of ``stage``'s
        objects, or of the shard that holds ``file_id`` (whose ``history`` then starts
        after it)."""
        return journaling.dropped(self._engine, file_id, stage)

    def migrate(self) -> list[str]:
        """Move the task to this release's schema: the header first, so agents that open
        the task from now on use it, then every shard, the index and every upload state,
        each by a commit (journaled from that version on). Run it once every agent runs
        this release: an older release then refuses the task (``UnsupportedSchema``) and
        changes nothing. Returns the keys it moved; running it again moves nothing."""
        return journaling.migrate(self._engine)

    # -- operators' verbs: revive, undeclare, delete, repair, archive ---------------------

    def revive(self, file_id: str) -> Entry:
        """A dead entry back to ``failed`` with ``retry_count`` 0, so it is claimable again
        (once its cause is fixed); ``WrongState`` if it is not dead. An archived dead entry
        comes back into its live shard."""
        return operations.revive(self._engine, file_id)

    def undeclare(self, file_id: str) -> Entry | None:
        """Remove a pending entry nobody depends on: from its shard, then from the index
        (an interrupted undeclare is finished by running it again). ``WrongState`` if it is
        not pending, ``HasDependents`` naming the entries that depend on it. Returns the
        removed entry (None if only the index still had it)."""
        return operations.undeclare(self._engine, file_id)

    def delete(self, force: bool = False) -> Deleted:
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
        return opening.delete(self._engine, force)

    @classmethod
    def delete_by_id(cls, store: ObjectStore, task_id: str, *, force: bool = False) -> Deleted:
        """``delete`` a task by its id, also one a crashed delete left half-deleted (whose
        ``open`` is refused); ``NotFound`` if nothing of it is left."""
        return opening.delete_by_id(store, task_id, force=force)

    def repair(self, dry_run: bool = False) -> RepairReport:
        """Rebuild every stage shard and the index that was deleted or is corrupt: a shard
        from its journal (and the index), the index from the shards; a corrupt object is
        copied to ``TASK/damaged/`` first. An index that is sound but lacks ids the shards
        hold gets them (``repair_index``). Returns what was restored and what could not
        be; with ``dry_run``, what would be, writing nothing. See ``ops.repair`` for the
        rules each rebuilt entry follows."""
        return operations.repair(self._engine, dry_run)

    def archive(self, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
        """Move every terminal entry (consumed, dead) last updated ``older_than`` seconds
        ago or more (the store's clock; 0 takes every one) out of the live shards into
        write-once archive objects, one commit per shard. Safe while agents work;
        ``entry``, ``history``, ``lineage``, ``status``, dependency checks and declarations
        still find them."""
        return operations.archive(self._engine, older_than, actor)

    # -- every task (last: the name ``list`` hides the builtin in the class body) -----

    @staticmethod
    def list(store: ObjectStore) -> list[str]:
        """The ids of the tasks under the store's prefix, sorted: one delimiter listing of
        the top level (no data objects listed), then each one's header. A prefix without a
        readable header, or a task being deleted, is left out."""
        found = []
        for task_id in task_ids(store):
            key = TaskLayout(task_id).header
            try:
                blob = store.get(key)
                assert blob is not None
                header = HeaderCodec(task_id).decode(key, blob.body)
            except (NoSuchObject, ObjManifestError):  # deleted since the listing, unreadable
                continue
            if header.deleting_at is None:
                found.append(task_id)
        return found


__all__ = ["Task", "attention"]
