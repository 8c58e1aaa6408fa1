"""A discrete-event scheduler that runs the real library on simulated time.

Every agent is a fiber, and so is every job of a pool, every background job and every
racing call of ``at_once``: they run in parallel on simulated time, as processes and their
threads do. Only one runs at a time: a fiber runs until it waits (a store request until its
finish time, a sleep, a future, a pool to drain), then the fiber of the earliest event
runs. Time jumps from event to event; CPU time is not simulated (a request's latency
includes its client's work). Events of one instant run in the order they were scheduled,
and every random number comes from a generator seeded per fiber, so a seed replays exactly.

A fiber is a greenlet (the default: a switch costs a microsecond, and a parked fiber only
the part of its stack it used), or, with ``threads=True``, an OS thread that runs while it
holds the baton and parks on a lock of its own (``STACK`` each; the threads of pool jobs
that end are kept for the next job). Threads are what the library meets in production:
each fiber has its own ``threading.get_ident()``, so the commit loop's lanes tell an
agent's concurrent commits of one object apart; greenlets share one thread, and would take
such a commit for one nested in the other (a different order of writes, never a wrong
one). ``tests/test_storemodel.py`` runs a seed both ways and finds the same numbers. A parked
fiber never spins.

    sched = Scheduler()
    sched.spawn(lambda: work(sched.runtime("a0")), "a0")
    sched.run(until=30.0)          # as often as wanted, each time further
    sched.shutdown()               # every fiber unwinds (``Stopped``) and ends
"""

from __future__ import annotations

import _thread
import concurrent.futures as cf
import faulthandler
import heapq
import itertools
import random
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import greenlet

from objmanifest.core.runtime import Repeating, Runtime

STACK = 512 * 1024
"""Each fiber's thread stack: enough for the library's deepest calls (pydantic included),
small enough for 10,000 agents."""
STALL_SECONDS = 600.0
"""Real seconds without a thousand events before ``run`` gives up: a fiber blocked on
something other than the scheduler (a real lock held by a parked fiber)."""


class Stopped(BaseException):
    """Raised in a fiber once the simulation shuts down: it unwinds and its thread ends."""


class Stalled(RuntimeError):
    """No fiber handed the baton back: one is blocked outside the scheduler."""


class GreenFiber:
    """A fiber as a greenlet, switched to by the scheduler (``run``) and back."""

    __slots__ = ("exited", "fn", "g", "killed", "name", "sched", "started")

    def __init__(self, sched: Scheduler, fn: Callable[[], None], name: str) -> None:
        self.sched, self.fn, self.name = sched, fn, name
        self.killed = self.exited = self.started = False
        self.g = greenlet.greenlet(self._main, parent=sched.hub)

    def __repr__(self) -> str:
        return f"GreenFiber({self.name!r})"

    def _main(self) -> None:
        sched = self.sched
        try:
            self.fn()
        except Stopped:
            pass
        except BaseException as e:  # reported; the fiber ends
            sched.errors.append(f"{self.name}: {type(e).__name__}: {e}")
            sched.tracebacks.append(traceback.format_exc())
        finally:
            self.exited = True
            sched.live.discard(self)


class Fiber:
    """A fiber as an OS thread, run only while it holds the baton; reused for the next
    job once its function returns (pool workers and background jobs)."""

    __slots__ = ("exited", "fn", "killed", "lock", "name", "sched", "thread")

    def __init__(self, sched: Scheduler, fn: Callable[[], None], name: str) -> None:
        self.sched, self.fn, self.name = sched, fn, name
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.killed = False
        self.exited = False
        self.thread = threading.Thread(target=self._main, name=f"des-{name}", daemon=True)
        self.thread.start()

    def __repr__(self) -> str:
        return f"Fiber({self.name!r})"

    def _main(self) -> None:
        sched = self.sched
        while True:
            self.lock.acquire()
            if self.killed:
                break
            fn, self.fn = self.fn, None
            try:
                if fn is not None:
                    fn()
            except Stopped:
                break
            except BaseException as e:  # reported, and the fiber carries on as idle
                sched.errors.append(f"{self.name}: {type(e).__name__}: {e}")
                sched.tracebacks.append(traceback.format_exc())
            if sched.stopping:
                break
            sched.idle.append(self)
            sched.dispatch()
        self.exited = True
        sched.live.discard(self)
        sched.dispatch()


class Scheduler:
    """The simulated clock, the event queue and the fibers (see the module's docstring)."""

    def __init__(self, threads: bool = False) -> None:
        self.threads = threads
        self.hub = greenlet.getcurrent()
        """The greenlet that runs the events (``run``), and every green fiber's parent."""
        self.now = 0.0
        self.end = 0.0
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self.current: Any = None
        self.idle: list[Fiber] = []
        self.live: set[Any] = set()
        self.stopping = False
        self.errors: list[str] = []
        self.tracebacks: list[str] = []
        self.events = 0
        self.threads_made = 0
        self._main = _thread.allocate_lock()
        self._main.acquire()

    # -- scheduling ------------------------------------------------------------------------

    def spawn(self, fn: Callable[[], None], name: str, at: float | None = None) -> Any:
        """Run ``fn`` in a fiber of its own from ``at`` (default: now)."""
        if not self.threads:
            green = GreenFiber(self, fn, name)
            self.live.add(green)
            self.wake(green, self.now if at is None else at)
            return green
        if self.idle:
            fiber = self.idle.pop()
            fiber.fn, fiber.name = fn, name
        else:
            old = threading.stack_size(STACK)
            try:
                fiber = Fiber(self, fn, name)
            finally:
                threading.stack_size(old)
            self.threads_made += 1
            self.live.add(fiber)
        self.wake(fiber, self.now if at is None else at)
        return fiber

    def wake(self, fiber: Any, at: float | None = None) -> None:
        """Resume ``fiber`` (parked) at ``at`` (default: now)."""
        when = self.now if at is None else max(at, self.now)
        heapq.heappush(self._heap, (when, next(self._seq), fiber))

    def call_at(self, at: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` at ``at`` in whichever thread dispatches then: it must not
        wait (it may spawn fibers)."""
        heapq.heappush(self._heap, (max(at, self.now), next(self._seq), callback))

    def dispatch(self) -> None:
        """Hand the baton to the fiber of the earliest event (running due callbacks on the
        way), or back to ``run`` once the next event is past its end. The caller parks
        (or ends) right after."""
        heap = self._heap
        while True:
            if self.stopping or not heap or heap[0][0] > self.end:
                self.current = None
                self._main.release()
                return
            at, _, item = heapq.heappop(heap)
            self.now = at
            self.events += 1
            if isinstance(item, Fiber):
                if item.exited:
                    continue
                self.current = item
                item.lock.release()
                return
            item()

    def park(self) -> None:
        """The current fiber waits until something wakes it (``wake``)."""
        me = self.current
        if me is None:
            raise RuntimeError("park() outside a fiber of the simulation")
        if self.stopping:
            raise Stopped()
        if self.threads:
            self.dispatch()
            me.lock.acquire()
        else:
            self.hub.switch()
        if me.killed:
            raise Stopped()

    def sleep(self, seconds: float) -> None:
        """The current fiber waits ``seconds`` of simulated time."""
        me = self.current
        if me is None:
            return
        self.wake(me, self.now + max(0.0, seconds))
        self.park()

    # -- running ---------------------------------------------------------------------------

    def run(self, until: float) -> None:
        """Run every event up to ``until`` (simulated seconds); the clock ends there."""
        self.end = until
        if self.threads:
            self.dispatch()
            if not self._main.acquire(timeout=STALL_SECONDS):
                raise Stalled(self._stall_report())
        else:
            self._run_green()
        self.now = max(self.now, until)

    def _run_green(self) -> None:
        """The events up to ``end``, each fiber switched to in turn until it parks. A fiber
        blocked outside the scheduler would stop the one thread: after ``STALL_SECONDS``
        of it, every stack is printed and the process ends."""
        if greenlet.getcurrent() is not self.hub:
            raise RuntimeError("run() from another greenlet than the one that made the scheduler")
        heap, pop = self._heap, heapq.heappop
        try:
            while heap and not self.stopping and heap[0][0] <= self.end:
                at, _, item = pop(heap)
                self.now = at
                self.events += 1
                if self.events % 1000 == 1:  # progress: the stall watchdog starts again
                    faulthandler.dump_traceback_later(STALL_SECONDS, exit=True)
                if type(item) is GreenFiber:
                    if item.exited:
                        continue
                    item.started = True
                    self.current = item
                    item.g.switch()
                    self.current = None
                else:
                    item()
        finally:
            faulthandler.cancel_dump_traceback_later()

    def _stall_report(self) -> str:
        fiber = self.current
        frames = sys._current_frames()
        if fiber is None or fiber.thread.ident not in frames:
            return "no fiber holds the baton, yet run() was not handed it back"
        stack = "".join(traceback.format_stack(frames[fiber.thread.ident]))
        return f"{fiber.name} holds the baton and is blocked outside the scheduler:\n{stack}"

    def shutdown(self) -> None:
        """End every fiber: each parked one raises ``Stopped`` where it waits and unwinds
        (a store call or wait on the way out raises it again), then its thread ends."""
        self.stopping = True
        self._heap.clear()
        if not self.threads:
            for green in list(self.live):
                if green.started and not green.exited:
                    green.killed = True
                    self.current = green
                    green.g.throw(Stopped())
                self.live.discard(green)
            self.current = None
            return
        for fiber in list(self.live):
            if fiber.exited:
                continue
            fiber.killed = True
            self.current = fiber
            fiber.lock.release()
            if not self._main.acquire(timeout=STALL_SECONDS):
                raise Stalled(self._stall_report())
        for fiber in list(self.live):
            fiber.thread.join(5)
        self.idle.clear()

    # -- what the library is given -----------------------------------------------------------

    def runtime(self, seed: str) -> Runtime:
        """The runtime of one agent: the simulated clock and sleep, randomness and ids from
        ``seed``, background jobs, pools and races as fibers."""
        rng = random.Random(seed)

        def new_id() -> str:
            return f"{rng.getrandbits(128):032x}"

        return Runtime(
            monotonic=lambda: self.now,
            sleep=self.sleep,
            random=rng.random,
            new_id=new_id,
            every=self.every,
            pool=lambda workers, name: Pool(self, workers, name),
            at_once=self.at_once,
        )

    def every(self, job: Callable[[], bool], interval: float, name: str) -> Repeating:
        return Every(self, job, interval, name)

    def at_once(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        """The calls in fibers of their own from this instant; their results in order, or
        the first error once all are done."""
        pool = Pool(self, len(calls), "at-once")
        futures = [pool.submit(call) for call in calls]
        results: list[Any] = []
        first: BaseException | None = None
        for future in futures:
            error = future.exception()
            if error is not None and first is None:
                first = error
            results.append(None if error is not None else future.result())
        if first is not None:
            raise first
        return results


class Every:
    """A background job every ``interval`` simulated seconds, each round in a fiber."""

    def __init__(self, sched: Scheduler, job: Callable[[], bool], interval: float, name: str):
        self.sched, self.job, self.interval, self.name = sched, job, interval, name
        self.stopped = False
        sched.call_at(sched.now + interval, self._due)

    def _due(self) -> None:
        if not self.stopped:
            self.sched.spawn(self._round, self.name)

    def _round(self) -> None:
        if self.stopped:
            return
        if self.job() and not self.stopped:
            self.sched.call_at(self.sched.now + self.interval, self._due)
        else:
            self.stopped = True

    def stop(self) -> None:
        self.stopped = True


class Future(cf.Future):  # type: ignore[type-arg]
    """A pool job's future: waiting for it parks the fiber instead of blocking a thread."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__()
        self._sched = sched
        self._waiting: list[Any] = []

    def _await(self) -> None:
        while not self.done():
            me = self._sched.current
            if me is None:
                raise RuntimeError("waiting for a simulated job outside the simulation")
            self._waiting.append(me)
            self._sched.park()

    def result(self, timeout: float | None = None) -> Any:
        self._await()
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._await()
        return super().exception(0)

    def settled(self) -> None:
        for fiber in self._waiting:
            self._sched.wake(fiber)
        self._waiting.clear()


class Pool(cf.Executor):
    """An executor of ``workers`` fibers: its jobs run in parallel on simulated time."""

    def __init__(self, sched: Scheduler, workers: int, name: str) -> None:
        self.sched, self.workers, self.name = sched, max(1, workers), name
        self.queue: deque[tuple[Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = (
            deque()
        )
        self.running = 0
        self.pending = 0
        self._drained: list[Any] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future = Future(self.sched)
        self.queue.append((future, fn, args, kwargs))
        self.pending += 1
        if self.running < self.workers:
            self.running += 1
            self.sched.spawn(self._work, self.name)
        return future

    def _work(self) -> None:
        try:
            while self.queue:
                future, fn, args, kwargs = self.queue.popleft()
                try:
                    result = fn(*args, **kwargs)
                except Stopped:
                    raise
                except BaseException as e:  # the caller's, through the future
                    future.set_exception(e)
                else:
                    future.set_result(result)
                future.settled()
                self.pending -= 1
        finally:
            self.running -= 1
        if not self.pending:
            for fiber in self._drained:
                self.sched.wake(fiber)
            self._drained.clear()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while self.queue:
                future, *_ = self.queue.popleft()
                future.cancel()
                self.pending -= 1
        while wait and self.pending:
            me = self.sched.current
            if me is None:
                return
            self._drained.append(me)
            self.sched.park()
