"""``AsyncTask``: the ``Task`` API as coroutines."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from ..core.model import (
    Claim,
    Entry,
    Shard,
)
from ..core.pacing import Pace
from ..core.states import State
from ..core.waiting import WaitPlan
from ..ops.deletion import Deleted
from ..store import ObjectStore
from ..task import Task
from .agent import AsyncAgent
from .pool import Pool, Twin, forwarded, in_pool, run_once


class AsyncTask(Twin[Task]):
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
    async def _opened(
        cls,
        store: ObjectStore,
        workers: int | None,
        executor: cf.Executor | None,
        opening: Callable[[], Task],
    ) -> AsyncTask:
        """The task ``opening`` makes (in a new pool), wrapped with its pool."""
        pool = Pool.of(store, workers, executor)
        try:
            task = await pool.run(opening)
        except BaseException:
            pool.close()
            raise
        made = cls.__new__(cls)
        made.task, made._pool = task, pool
        return made

    @property
    def _sync(self) -> Task:
        return self.task

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
        return await cls._opened(
            store,
            workers,
            executor,
            lambda: Task.create(store, task_id, stages, lease_seconds, max_retries, **options),
        )

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
        return await cls._opened(
            store, workers, executor, lambda: Task.open(store, task_id, **options)
        )

    # -- settings (no I/O) -------------------------------------------------------------

    store = forwarded(Task, lambda task: task.store)
    header = forwarded(Task, lambda task: task.header)
    task_id = forwarded(Task, lambda task: task.task_id)
    stages = forwarded(Task, lambda task: task.stages)
    lease_seconds = forwarded(Task, lambda task: task.lease_seconds)
    max_retries = forwarded(Task, lambda task: task.max_retries)
    transfer = forwarded(Task, lambda task: task.transfer)

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

    entry = in_pool(Task.entry)
    entries = in_pool(Task.entries)
    stage_of = in_pool(Task.stage_of)
    shard = in_pool(Task.shard)

    async def shard_names(self, stage: str | None = None, file_id: str | None = None) -> list[str]:
        """``Task.shard_names`` (names only: no I/O, so it runs on the loop)."""
        return self.task.shard_names(stage, file_id)

    async def shards(
        self, names: Iterable[str] | None = None, *, cached: bool = False
    ) -> dict[str, Shard]:
        chosen = None if names is None else list(names)
        return await self._pool.run(lambda: self.task.shards(chosen, cached=cached))

    index = in_pool(Task.index)

    async def held(self, claim: Claim) -> Entry:
        """``Task.held``: the entry, read fresh, if ``claim`` still holds it."""
        return await self._pool.run(lambda: self.task.held(claim))

    status = in_pool(Task.status)
    unclaimable = in_pool(Task.unclaimable)
    is_current = in_pool(Task.is_current)

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

    outstanding = in_pool(Task.outstanding)

    # -- declaring ---------------------------------------------------------------------

    declare = in_pool(Task.declare)
    declare_many = in_pool(Task.declare_many)

    # -- keeping the task --------------------------------------------------------------

    reap = in_pool(Task.reap)
    sweep_uploads = in_pool(Task.sweep_uploads)
    gc = in_pool(Task.gc)
    repair_index = in_pool(Task.repair_index)
    repair = in_pool(Task.repair)
    archive = in_pool(Task.archive)
    migrate = in_pool(Task.migrate)
    revive = in_pool(Task.revive)
    undeclare = in_pool(Task.undeclare)
    delete = in_pool(Task.delete)

    @staticmethod
    async def delete_by_id(store: ObjectStore, task_id: str, *, force: bool = False) -> Deleted:
        return await run_once(store, lambda: Task.delete_by_id(store, task_id, force=force))

    # -- history -----------------------------------------------------------------------

    history = in_pool(Task.history)
    log = in_pool(Task.log)
    stage_logs = in_pool(Task.stage_logs)
    lineage = in_pool(Task.lineage)
    dropped = in_pool(Task.dropped)
    flush_journal = in_pool(Task.flush_journal)
    trim_journal = in_pool(Task.trim_journal)

    # -- every task (last: the name ``list`` hides the builtin in the class body) -----

    @staticmethod
    async def list(store: ObjectStore) -> list[str]:
        """``Task.list``: the ids of the tasks under the store's prefix."""
        return await run_once(store, lambda: Task.list(store))
