"""The threads the sync calls run in, and the one way a coroutine reaches them: a
cancelled coroutine waits for its thread, never leaving work running behind it.
``in_pool`` makes a sync method that needs nothing more its twin's coroutine."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import threading
import types
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, Generic, NoReturn, ParamSpec, TypeVar, overload

from ..errors import InvalidInput
from ..store import ObjectStore

T = TypeVar("T")
S = TypeVar("S")
V = TypeVar("V")
P = ParamSpec("P")


class Pool:
    """The threads the sync calls run in, and the one way a coroutine reaches them."""

    def __init__(self, executor: cf.Executor, owned: bool) -> None:
        self.executor = executor
        self.owned = owned

    @classmethod
    def of(cls, store: ObjectStore, workers: int | None, executor: cf.Executor | None) -> Pool:
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
            outcome = await outcome_of(waiting)
            if cancelled is not None:
                await outcome_of(asyncio.ensure_future(cancelled(outcome)))
            raise

    async def settle(self, call: Callable[[], T]) -> T | BaseException:
        """``call()`` in a thread, run to its end whatever cancels the caller meanwhile
        (cleaning up after a cancellation)."""
        return await outcome_of(asyncio.wrap_future(self.executor.submit(call)))

    def close(self) -> None:
        if self.owned:
            self.executor.shutdown(wait=False)


async def run_once(store: ObjectStore, call: Callable[[], T]) -> T:
    """``call()`` in a thread of a pool of its own, shut down after (a call of no task)."""
    pool = Pool.of(store, 1, None)
    try:
        return await pool.run(call)
    finally:
        pool.close()


class Twin(Generic[S]):
    """The coroutine face of a sync object ``S`` (a ``Task``, an ``Agent``): the methods
    made by ``in_pool`` run its calls in ``_pool``."""

    _pool: Pool

    @property
    def _sync(self) -> S:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Names each coroutine ``in_pool`` made after the class it stands in (as a
        ``def`` there would be), not after the sync method it runs."""
        super().__init_subclass__(**kwargs)
        made = f"{in_pool.__qualname__}.<locals>."
        for name, member in vars(cls).items():
            if isinstance(member, types.FunctionType) and member.__qualname__.startswith(made):
                member.__module__ = cls.__module__
                member.__qualname__ = f"{cls.__qualname__}.{name}"


def in_pool(
    method: Callable[Concatenate[S, P], T],
) -> Callable[Concatenate[Twin[S], P], Coroutine[Any, Any, T]]:
    """``method`` of the sync object as a coroutine of its twin: the same arguments (its
    signature and docstring), run in the twin's pool on the sync object. Looked up there
    by name when it runs, as ``self.task.NAME(...)`` written out would be."""
    name = method.__name__

    async def twin(self: Twin[S], /, *args: P.args, **kwargs: P.kwargs) -> T:
        def call() -> T:
            bound: Callable[P, T] = getattr(self._sync, name)
            return bound(*args, **kwargs)

        return await self._pool.run(call)

    return functools.update_wrapper(twin, method, assigned=("__name__", "__doc__"))


async def outcome_of(waiting: asyncio.Future[T]) -> T | BaseException:
    """The result or exception of ``waiting``, once it is done; cancelling the caller
    meanwhile does not stop the wait (the thread behind it would run on regardless)."""
    while not waiting.done():
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(waiting)
    if waiting.cancelled():
        return asyncio.CancelledError()
    error = waiting.exception()
    return error if error is not None else waiting.result()


class Forwarded(property, Generic[S, V]):
    """A read-only property of a twin that reads its sync object's (``forwarded``)."""

    @overload
    def __get__(self, twin: None, owner: type | None = None, /) -> Forwarded[S, V]: ...
    @overload
    def __get__(self, twin: Twin[S], owner: type | None = None, /) -> V: ...
    def __get__(self, twin: Twin[S] | None, owner: type | None = None, /) -> Forwarded[S, V] | V:
        return super().__get__(twin, owner)

    def __set__(self, twin: Twin[S], value: NoReturn, /) -> None:
        super().__set__(twin, value)


def forwarded(sync: type[S], read: Callable[[S], V]) -> Forwarded[S, V]:
    """The property of a twin that is ``read`` of its sync object (of class ``sync``)."""

    def get(twin: Twin[S]) -> V:
        return read(twin._sync)

    return Forwarded(get)
