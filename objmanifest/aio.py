"""The Task/Agent API as coroutines, for asyncio programs (agent frameworks).

``AsyncTask`` and ``AsyncAgent`` wrap a ``Task`` and its ``Agent``: every coroutine hands
the sync call to a thread pool and awaits it, so the event loop never blocks on the store,
and everything below (changes, states, leases, layout, the CAS loop, transfers) is the
one core the sync API uses, with its tests and its guarantees.

Why a thread pool and not an async S3 client (aiobotocore): the sync store runs in a pool
as large as the store's connection pool (``store.connections``, so no thread waits for a
connection), and coroutines here run level with threads of the sync API (ratios 0.88 to
1.09 for 8 and 32 workers 25 ms from the store: ``python -m bench --only aio``). On raw
conditional writes aiobotocore is not always level: where latency is the limit (8 workers
25 ms away) it ran 0.88 to 1.20 times the ops/s of boto3 threads, but where the client's
CPU is the limit (32 workers, or bare) it ran up to 1.5 times when the machine had CPU to
spare and 0.65 to 1.01 times when it was busy (``bench/aio_client.py``, BENCHMARKS.md).
That gain is at request rates an agent process rarely needs; the pool needs no new
dependency (aiobotocore pins botocore) and keeps one store, one CAS loop and one retry and
fault-handling path; threads of one process that commit to one shard share its writes
(group commits), so coroutines of one ``AsyncTask`` share them too. An async client would
need a second store and a second CAS loop kept equal to the first.

Cancellation. Cancelling a coroutine does not stop the thread doing its work, so:

* every coroutine, when cancelled, waits for its thread to end before the
  ``CancelledError`` goes on: nothing of a cancelled call keeps running behind it, and a
  call that never started is dropped;
* ``put``, ``put_many`` and ``consume`` tell their thread to stop (``stop=`` of the sync
  call): it stops at the next checkpoint, between the data and the commit or between
  parts, with ``Interrupted``, so a put's entry stays writing under its claim (claimable
  by the holder's next put, or by a takeover once the lease expires), never half-ready,
  and a consume marks nothing and leaves ``dest`` as it was. If the commit was already
  sent, the cancellation waits for its outcome and logs it (the coroutine still raises
  ``CancelledError``);
* a claim that landed although its coroutine was cancelled is released (no retry spent),
  since nobody would hold it.

``tests/test_architecture.py`` checks that the coroutines here reach the sync API only
through the pool, and that a run makes no store call on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, overload

import shard_index

from .agent import Agent
from .core.model import (
    ArchiveReport,
    Claim,
    Declaration,
    Entry,
    JournalRecord,
    Shard,
    State,
    TaskHeader,
    TaskStatus,
)
from .data import sources, transfer
from .engine.status import WAIT_FIRST_DELAY, WAIT_GROWTH, WAIT_MAX_DELAY
from .errors import Interrupted, InvalidInput, ObjManifestError
from .journal.history import Dropped, Lineage, Transition
from .ops import deletion
from .ops.gc import GcReport
from .ops.reports import RepairReport
from .store import ObjectStore
from .task import Task

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Pool:
    """The threads the sync calls run in, and the one way a coroutine reaches them."""

    def __init__(self, executor: cf.Executor, owned: bool) -> None:
        self.executor = executor
        self.owned = owned

    @classmethod
    def of(cls, store: ObjectStore, workers: int | None, executor: cf.Executor | None) -> _Pool:
        """The caller's executor, or one of ``workers`` threads (default: the store's
        connection pool size, so no thread waits for a connection)."""
        if executor is not None:
            return cls(executor, owned=False)
        count = store.connections if workers is None else workers
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidInput(
                f"workers must be a whole number of at least 1, not {workers!r} (None: as many "
                "as the store has connections)"
            )
        return cls(store.runtime.pool(count, "om-aio"), owned=True)

    async def run(
        self,
        call: Callable[[], T],
        stop: threading.Event | None = None,
        cancelled: Callable[[T | BaseException], Awaitable[None]] | None = None,
    ) -> T:
        """``call()`` in a thread. Cancelled: dropped if it never started; else ``stop`` is
        set and the thread's outcome awaited (and handed to ``cancelled``, awaited too)
        before the cancellation goes on."""
        future = self.executor.submit(call)
        waiting = asyncio.wrap_future(future)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if future.cancel():
                raise  # still queued: nothing was done
            if stop is not None:
                stop.set()
            outcome = await _outcome(waiting)
            if cancelled is not None:
                await _outcome(asyncio.ensure_future(cancelled(outcome)))
            raise

    async def settle(self, call: Callable[[], T]) -> T | BaseException:
        """``call()`` in a thread, run to its end whatever cancels the caller meanwhile
        (cleaning up after a cancellation)."""
        return await _outcome(asyncio.wrap_future(self.executor.submit(call)))

    def close(self) -> None:
        if self.owned:
            self.executor.shutdown(wait=False)


async def _outcome(waiting: asyncio.Future[T]) -> T | BaseException:
    """The result or exception of ``waiting``, once it is done; cancelling the caller
    meanwhile does not stop the wait (the thread behind it would run on regardless)."""
    while not waiting.done():
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(waiting)
    if waiting.cancelled():
        return asyncio.CancelledError()
    error = waiting.exception()
    return error if error is not None else waiting.result()


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
        self._pool = _Pool.of(task.store, workers, executor)

    @classmethod
    def _wrap(cls, task: Task, pool: _Pool) -> AsyncTask:
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
        pool = _Pool.of(store, workers, executor)
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
        pool = _Pool.of(store, workers, executor)
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
    def transfer(self) -> transfer.TransferConfig:
        return self.task.transfer

    def agent(self, name: str, role: str | None = None) -> AsyncAgent:
        """An agent of this task; ``role`` (for consumers) defaults to the name."""
        return AsyncAgent(self.task.agent(name, role), self._pool)

    def subscribe(self, observer: Callable[[Any], None]) -> Callable[[], None]:
        """``Task.subscribe``: the observer is called in the thread that committed (one of
        the pool's); hand events to the loop with ``loop.call_soon_threadsafe``."""
        return self.task.subscribe(observer)

    # -- reading -----------------------------------------------------------------------

    async def entry(self, file_id: str) -> Entry:
        return await self._pool.run(lambda: self.task.entry(file_id))

    async def entries(self, stage: str | None = None) -> list[Entry]:
        return await self._pool.run(lambda: self.task.entries(stage))

    async def stage_of(self, file_id: str) -> str:
        return await self._pool.run(lambda: self.task.stage_of(file_id))

    async def shard(self, stage: str) -> Shard:
        return await self._pool.run(lambda: self.task.shard(stage))

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
        task = self.task
        wanted = task._wait_plan(stages, until, timeout)
        loop = asyncio.get_running_loop()
        start = loop.time()
        delay = WAIT_FIRST_DELAY
        while True:
            found, waiting = await self._pool.run(lambda: task._wait_round(wanted, until))
            if not waiting:
                return found
            remaining = float("inf") if timeout is None else start + timeout - loop.time()
            if remaining <= 0:
                raise task._wait_timeout(wanted, until, timeout, waiting)
            if on_wait is not None:
                on_wait(waiting)
                on_wait = None
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * WAIT_GROWTH, WAIT_MAX_DELAY)

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

    async def delete(self, force: bool = False) -> deletion.Deleted:
        return await self._pool.run(lambda: self.task.delete(force))

    @staticmethod
    async def delete_by_id(
        store: ObjectStore, task_id: str, *, force: bool = False
    ) -> deletion.Deleted:
        pool = _Pool.of(store, 1, None)
        try:
            return await pool.run(lambda: Task.delete_by_id(store, task_id, force=force))
        finally:
            pool.close()

    # -- history -----------------------------------------------------------------------

    async def history(self, file_id: str) -> list[Transition]:
        return await self._pool.run(lambda: self.task.history(file_id))

    async def log(
        self,
        since: datetime | None = None,
        stage: str | None = None,
        agent: str | None = None,
    ) -> list[JournalRecord]:
        return await self._pool.run(lambda: self.task.log(since, stage, agent))

    async def lineage(self, file_id: str) -> Lineage:
        return await self._pool.run(lambda: self.task.lineage(file_id))

    async def dropped(self, file_id: str | None = None) -> list[Dropped]:
        return await self._pool.run(lambda: self.task.dropped(file_id))

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
        pool = _Pool.of(store, 1, None)
        try:
            return await pool.run(lambda: Task.list(store))
        finally:
            pool.close()


class AsyncAgent:
    """An ``Agent`` whose calls are coroutines, run in its task's pool (``task.agent``).

    ``progress`` callbacks are called in the pool's threads.
    """

    def __init__(self, agent: Agent, pool: _Pool) -> None:
        self.agent = agent
        self._pool = pool

    def __repr__(self) -> str:
        return f"Async{self.agent!r}"

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def role(self) -> str:
        return self.agent.role

    # -- claiming ----------------------------------------------------------------------

    async def claim(self, file_id: str | None = None, *, stage: str | None = None) -> Claim | None:
        """``Agent.claim``; cancelled after the claim landed, it is released."""
        return await self._pool.run(
            lambda: self.agent.claim(file_id, stage=stage), cancelled=self._release_landed
        )

    async def claim_many(self, stage: str, limit: int = 50) -> list[Claim]:
        """``Agent.claim_many``; cancelled after the claims landed, they are released."""
        return await self._pool.run(
            lambda: self.agent.claim_many(stage, limit), cancelled=self._release_landed
        )

    async def _release_landed(self, outcome: object) -> None:
        """Claims nobody will hold, released before the cancellation goes on."""
        landed = [outcome] if isinstance(outcome, Claim) else outcome
        if isinstance(landed, list):
            claims = [c for c in landed if isinstance(c, Claim)]
            for claim in claims:
                await self._pool.settle(functools.partial(self._release_quietly, claim))

    def _release_quietly(self, claim: Claim) -> None:
        try:
            self.agent.release(claim)
            log.info("released %r: its claim landed after the claim was cancelled", claim.file_id)
        except ObjManifestError as e:
            log.warning(
                "could not release %r, claimed after the claim was cancelled (it is free "
                "once its lease expires): %s",
                claim.file_id,
                e,
            )

    # -- holding -----------------------------------------------------------------------

    async def resume(self, file_id: str, epoch: int) -> Claim:
        return await self._pool.run(lambda: self.agent.resume(file_id, epoch))

    async def resume_many(self, held: Iterable[tuple[str, int]]) -> list[Claim]:
        pairs = list(held)
        return await self._pool.run(lambda: self.agent.resume_many(pairs))

    async def renew(self, claim: Claim) -> Claim:
        return await self._pool.run(lambda: self.agent.renew(claim))

    async def put(
        self,
        claim: Claim,
        data: sources.Source,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
        progress: transfer.Progress | None = None,
    ) -> Entry:
        """``Agent.put``. Cancelled, it stops before the ready commit (the entry stays
        writing under the claim), or, if the commit was sent, waits for its outcome."""
        stop = threading.Event()
        return await self._pool.run(
            lambda: self.agent.put(
                claim,
                data,
                part_size=part_size,
                concurrency=concurrency,
                threshold=threshold,
                progress=progress,
                stop=stop,
            ),
            stop,
            lambda outcome: _report(f"put of {claim.file_id!r}", outcome),
        )

    async def put_many(
        self,
        claims: Iterable[Claim],
        datas: Iterable[sources.Source],
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
    ) -> list[Entry | Exception]:
        """``Agent.put_many``. Cancelled, it stops before the ready commits (every entry
        stays writing under its claim), or, if they were sent, waits for their outcome."""
        stop = threading.Event()
        batch = list(claims) if not isinstance(claims, Claim) else claims
        return await self._pool.run(
            lambda: self.agent.put_many(
                batch,
                datas,
                part_size=part_size,
                concurrency=concurrency,
                threshold=threshold,
                stop=stop,
            ),
            stop,
            lambda outcome: _report("put_many", outcome),
        )

    async def fail(self, claim: Claim, reason: str) -> Entry:
        return await self._pool.run(lambda: self.agent.fail(claim, reason))

    async def release(self, claim: Claim) -> Entry:
        return await self._pool.run(lambda: self.agent.release(claim))

    # -- consuming ---------------------------------------------------------------------

    @overload
    async def consume(
        self,
        file_id: str,
        dest: None = None,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> bytes: ...
    @overload
    async def consume(
        self,
        file_id: str,
        dest: str | os.PathLike[str],
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> Entry: ...

    async def consume(
        self,
        file_id: str,
        dest: str | os.PathLike[str] | None = None,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> bytes | Entry:
        """``Agent.consume``. Cancelled, it stops before the data is put in place and
        marked (nothing at ``dest`` changes), or, if the mark was sent, waits for it."""
        stop = threading.Event()

        def call() -> bytes | Entry:
            if dest is None:
                return self.agent.consume(
                    file_id,
                    part_size=part_size,
                    concurrency=concurrency,
                    progress=progress,
                    stop=stop,
                )
            return self.agent.consume(
                file_id,
                dest,
                part_size=part_size,
                concurrency=concurrency,
                progress=progress,
                parents=parents,
                stop=stop,
            )

        return await self._pool.run(
            call, stop, lambda outcome: _report(f"consume of {file_id!r}", outcome)
        )


async def _report(what: str, outcome: object) -> None:
    """What a cancelled transfer's thread ended with."""
    if isinstance(outcome, Interrupted):
        log.info("%s was cancelled and stopped before its commit: %s", what, outcome)
    elif isinstance(outcome, BaseException):
        log.info("%s was cancelled; its thread ended with %r", what, outcome)
    else:
        log.info("%s was cancelled after its commit was sent; the commit landed", what)


__all__ = ["AsyncAgent", "AsyncTask"]
