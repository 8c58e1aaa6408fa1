"""Everything nondeterministic the library does, behind one object a simulation can replace.

Time (the monotonic clock that advances the store clock, sleeping between retries),
randomness (backoff jitter), identifiers (commit ids, creation ids, probe keys) and
concurrency (the thread that renews a lease, the pools that move parts, the store probe's
racing writers) all come from a ``Runtime``. The default one uses the real clock,
``random``, ``os.urandom`` ids and threads; a deterministic simulation passes its own
(``om.connect(..., runtime=...)``), so a failing seed replays exactly, without
monkeypatching ``time``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Repeating(Protocol):
    """A job run again and again in the background until ``stop`` returns."""

    def stop(self) -> None: ...


class _ThreadRepeating:
    """Calls ``job`` every ``interval`` seconds on a daemon thread until stopped."""

    def __init__(self, job: Callable[[], bool], interval: float, name: str) -> None:
        self._job = job
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            if not self._job():
                return

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


def _every(job: Callable[[], bool], interval: float, name: str) -> Repeating:
    return _ThreadRepeating(job, interval, name)


def _pool(workers: int, name: str) -> cf.Executor:
    return cf.ThreadPoolExecutor(workers, thread_name_prefix=name)


def _new_id() -> str:
    """128 random bits in hex (what ``uuid4().hex`` gives, less its six fixed bits, without
    making a ``UUID`` first: every commit takes one)."""
    return os.urandom(16).hex()


def _at_once(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run every call in a thread of its own, released together by a barrier, and return
    their results in order; once all are done, the first exception is raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=30)
        try:
            results[i] = calls[i]()
        except BaseException as e:  # handed to the caller below
            errors[i] = e

    threads = [
        threading.Thread(target=run, args=(i,), name=f"objmanifest-race-{i}", daemon=True)
        for i in range(len(calls))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


@dataclass(frozen=True)
class Runtime:
    """The clock, sleep, randomness, ids and threads the library uses.

    * ``monotonic``: seconds from an arbitrary start, never going back; the store clock
      advances by it between responses.
    * ``sleep``: waits between retries of a lost race.
    * ``random``: a float in [0, 1), for backoff jitter and spreading agents out.
    * ``new_id``: a fresh 32-hex-digit id (commit ids, creation ids, probe keys).
    * ``every(job, interval, name)``: run ``job`` every ``interval`` seconds in the
      background until it returns False or the handle is stopped (lease renewal).
    * ``pool(workers, name)``: an executor for parts moved in parallel.
    * ``at_once(calls)``: run the calls at the same moment and return their results (the
      store probe's racing writers); a simulation may run them in any order it chooses.
    """

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = field(default=random.random)
    new_id: Callable[[], str] = _new_id
    every: Callable[[Callable[[], bool], float, str], Repeating] = _every
    pool: Callable[[int, str], cf.Executor] = _pool
    at_once: Callable[[Sequence[Callable[[], Any]]], list[Any]] = _at_once


DEFAULT = Runtime()
"""The real clock, ``random``, ``os.urandom`` ids and threads."""
