"""``AsyncTask``: the ``Task`` API as coroutines."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

import shard_index

from ..core.model import (
    ArchiveReport,
    Claim,
    Declaration,
    Entry,
    JournalRecord,
    Shard,
    TaskHeader,
    TaskStatus,
)
from ..core.pacing import Pace
from ..core.states import State
from ..core.waiting import WaitPlan
from ..data.transfer import TransferConfig
from ..journal.history import Dropped, Lineage, Transition
from ..ops.deletion import Deleted
from ..ops.gc import GcReport
from ..ops.reports import RepairReport
from ..store import ObjectStore
from ..task import Task
from .agent import AsyncAgent
from .pool import Pool


class AsyncTask:
    """A ``Task`` whose calls are coroutines. Make one with ``await AsyncTask.create`` or
    ``await AsyncTask.open``, or wrap a ``Task`` (``AsyncTask(task)``).

    Its calls run in a pool of ``workers`` threads (default ``store.connections``), or in
    ``executor``; its agents share that pool. ``close()`` (or ``async with``) shuts down a
    pool it made. Observers given to ``subscribe`` are called in the pool's threads.
    """

    def __init__(
        self,
        task: Task,
        *,
        workers: int | None = None,
        executor: cf.Executor | None = None,
    ) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"AsyncTask wraps a Task, not a {type(task).__name__}")
        self.task = task
        self._pool = Pool.of(task.store, workers, executor)

    @classmethod
    def _wrap(cls, task: Task, pool: Pool) -> AsyncTask:
        made = cls.__new__(cls)
        made.task, made._pool = task, pool
        return made

    def __repr__(self) -> str:
        return f"AsyncTask({self.task_id!r} at {self.store.url})"

    async def __aenter__(self) -> AsyncTask:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shut down the pool this task made (not an executor it was given); calls in
        flight finish first."""
        self._pool.close()

    # -- creating and opening ----------------------------------------------------------

    @classmethod
    async def create(
        cls,
        store: ObjectStore,
        task_id: str,
        stages: Iterable[str],
        lease_seconds: float = 300,
        max_retries: int = 3,
        *,
        workers: int | None = None,
        executor: cf.Executor | None = None,
        **options: Any,
    ) -> AsyncTask:
        """``Task.create`` (``options``: its keyword arguments) as a coroutine."""
        pool = Pool.of(store, workers, executor)
        try:
            task = await pool.run(
                lambda: Task.create(store, task_id, stages, lease_seconds, max_retries, **options)
            )
        except BaseException:
            pool.close()
            raise
        return cls._wrap(task, pool)

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        task_id: str,
        *,
        workers: int | None = None,
        executor: cf.Executor | None = None,
        **options: Any,
    ) -> AsyncTask:
        """``Task.open`` (``options``: ``policy``, ``transfer``) as a coroutine."""
        pool = Pool.of(store, workers, executor)
        try:
            task = await pool.run(lambda: Task.open(store, task_id, **options))
        except BaseException:
            pool.close()
            raise
        return cls._wrap(task, pool)

    # -- settings (no I/O) -------------------------------------------------------------

    @property
    def store(self) -> ObjectStore:
        return self.task.store

    @property
    def header(self) -> TaskHeader:
        return self.task.header

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def stages(self) -> tuple[str, ...]:
        return self.task.stages

    @property
    def lease_seconds(self) -> float:
        return self.task.lease_seconds

    @property
    def max_retries(self) -> int:
        return self.task.max_retries

    @property
    def transfer(self) -> TransferConfig:
        return self.task.transfer

    def agent(self, name: str, role: str | None = None) -> AsyncAgent:
        """An agent of this task; ``role`` (for consumers) defaults to the name."""
        return AsyncAgent(self.task.agent(name, role), self._pool)

    def subscribe(self, observer: Callable[[Any], None]) -> Callable[[], None]:
        """``Task.subscribe``: the observer is called in the thread that committed (one of
        the pool's); hand events to the loop with ``loop.call_soon_threadsafe``."""
        return self.task.subscribe(observer)

    def request_counts(self) -> dict[str, int]:
        """``Task.request_counts``: a snapshot of counts, no I/O."""
        return self.task.request_counts()

    # -- reading -----------------------------------------------------------------------

    async def entry(self, file_id: str) -> Entry:
        return await self._pool.run(lambda: self.task.entry(file_id))

    async def entries(self, stage: str | None = None) -> list[Entry]:
        return await self._pool.run(lambda: self.task.entries(stage))

    async def stage_of(self, file_id: str) -> str:
        return await self._pool.run(lambda: self.task.stage_of(file_id))

    async def shard(self, stage: str) -> Shard:
        return await self._pool.run(lambda: self.task.shard(stage))

    async def shard_names(self, stage: str | None = None, file_id: str | None = None) -> list[str]:
        """``Task.shard_names`` (names only: no I/O, so it runs on the loop)."""
        return self.task.shard_names(stage, file_id)

    async def shards(
        self, names: Iterable[str] | None = None, *, cached: bool = False
    ) -> dict[str, Shard]:
        chosen = None if names is None else list(names)
        return await self._pool.run(lambda: self.task.shards(chosen, cached=cached))

    async def index(self) -> shard_index.ShardIndex:
        return await self._pool.run(self.task.index)

    async def held(self, claim: Claim) -> Entry:
        """``Task.held``: the entry, read fresh, if ``claim`` still holds it."""
        return await self._pool.run(lambda: self.task.held(claim))

    async def status(self) -> TaskStatus:
        return await self._pool.run(self.task.status)

    async def unclaimable(self, stage: str) -> str:
        return await self._pool.run(lambda: self.task.unclaimable(stage))

    async def is_current(self) -> bool:
        return await self._pool.run(self.task.is_current)

    async def wait(
        self,
        stages: Iterable[str] | None = None,
        until: str = "ready",
        timeout: float | None = None,
        *,
        on_wait: Callable[[list[str]], None] | None = None,
    ) -> dict[str, State]:
        """``Task.wait``, sleeping on the loop between looks (each look one read of each
        stage's shard in the pool); ``timeout`` is measured on the loop's clock."""
        plan = self.task.wait_plan(stages, until, timeout)
        loop = asyncio.get_running_loop()
        start = loop.time()
        pace, seen = Pace(), None
        while True:
            found, waiting = await self.outstanding(plan.stages, until)
            if not waiting:
                return found
            remaining = float("inf") if timeout is None else start + timeout - loop.time()
            if remaining <= 0:
                raise plan.timed_out(waiting)
            if on_wait is not None:
                on_wait(waiting)
                on_wait = None
            await asyncio.sleep(min(plan.pause(pace, found, seen, waiting), remaining))
            seen = found

    async def wait_plan(
        self,
        stages: Iterable[str] | None = None,
        until: str = "ready",
        timeout: float | None = None,
    ) -> WaitPlan:
        """``Task.wait_plan`` (arguments checked: no I/O, so it runs on the loop)."""
        return self.task.wait_plan(stages, until, timeout)

    async def outstanding(
        self, stages: Iterable[str] | None = None, until: str = "ready"
    ) -> tuple[dict[str, State], list[str]]:
        return await self._pool.run(lambda: self.task.outstanding(stages, until))

    # -- declaring ---------------------------------------------------------------------

    async def declare(
        self,
        file_id: str,
        stage: str,
        depends_on: Iterable[str] = (),
        consumers: Iterable[str] = (),
    ) -> Entry:
        return await self._pool.run(
            lambda: self.task.declare(file_id, stage, depends_on, consumers)
        )

    async def declare_many(
        self, decls: Iterable[Declaration | dict[str, Any] | tuple[Any, ...]]
    ) -> list[Entry]:
        return await self._pool.run(lambda: self.task.declare_many(decls))

    # -- keeping the task --------------------------------------------------------------

    async def reap(self) -> list[Entry]:
        return await self._pool.run(self.task.reap)

    async def sweep_uploads(self) -> list[str]:
        return await self._pool.run(self.task.sweep_uploads)

    async def gc(self, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
        return await self._pool.run(lambda: self.task.gc(dry_run, consumed_older_than))

    async def repair_index(self) -> list[str]:
        return await self._pool.run(self.task.repair_index)

    async def repair(self, dry_run: bool = False) -> RepairReport:
        return await self._pool.run(lambda: self.task.repair(dry_run))

    async def archive(self, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
        return await self._pool.run(lambda: self.task.archive(older_than, actor))

    async def migrate(self) -> list[str]:
        return await self._pool.run(self.task.migrate)

    async def revive(self, file_id: str) -> Entry:
        return await self._pool.run(lambda: self.task.revive(file_id))

    async def undeclare(self, file_id: str) -> Entry | None:
        return await self._pool.run(lambda: self.task.undeclare(file_id))

    async def delete(self, force: bool = False) -> Deleted:
        return await self._pool.run(lambda: self.task.delete(force))

    @staticmethod
    async def delete_by_id(store: ObjectStore, task_id: str, *, force: bool = False) -> Deleted:
        pool = Pool.of(store, 1, None)
        try:
            return await pool.run(lambda: Task.delete_by_id(store, task_id, force=force))
        finally:
            pool.close()

    # -- history -----------------------------------------------------------------------

    async def history(
        self, file_id: str, *, after: dict[str, int] | None = None
    ) -> list[Transition]:
        return await self._pool.run(lambda: self.task.history(file_id, after=after))

    async def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
        *,
        after: dict[str, int] | None = None,
    ) -> list[JournalRecord]:
        return await self._pool.run(lambda: self.task.log(since, stage, agent, after=after))

    async def stage_logs(
        self,
        shards: Mapping[str, Shard],
        seen: dict[str, tuple[str | None, int]],
        since: datetime | None = None,
        *,
        skip_damaged: bool = False,
    ) -> dict[str, list[JournalRecord]]:
        return await self._pool.run(
            lambda: self.task.stage_logs(shards, seen, since, skip_damaged=skip_damaged)
        )

    async def lineage(self, file_id: str) -> Lineage:
        return await self._pool.run(lambda: self.task.lineage(file_id))

    async def dropped(
        self, file_id: str | None = None, *, stage: str | None = None
    ) -> list[Dropped]:
        return await self._pool.run(lambda: self.task.dropped(file_id, stage=stage))

    async def flush_journal(self) -> None:
        await self._pool.run(self.task.flush_journal)

    async def trim_journal(
        self,
        keep_seconds: float | None = None,
        keep_versions: int | None = None,
        *,
        dry_run: bool = False,
    ) -> list[Dropped]:
        return await self._pool.run(
            lambda: self.task.trim_journal(keep_seconds, keep_versions, dry_run=dry_run)
        )

    # -- every task (last: the name ``list`` hides the builtin in the class body) -----

    @staticmethod
    async def list(store: ObjectStore) -> list[str]:
        """``Task.list``: the ids of the tasks under the store's prefix."""
        pool = Pool.of(store, 1, None)
        try:
            return await pool.run(lambda: Task.list(store))
        finally:
            pool.close()
