"""Everything nondeterministic the library does, behind one object a simulation can replace.

Time (the monotonic clock that advances the store clock, sleeping between retries),
randomness (backoff jitter), identifiers (commit ids, creation ids, probe keys) and
concurrency (the thread that renews a lease, the pools that move parts) all come from a
``Runtime``. The default one uses the real clock, ``random``, ``uuid4`` and threads; a
deterministic simulation passes its own (``om.connect(..., runtime=...)``), so a failing
seed replays exactly, without monkeypatching ``time``.
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


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
    return uuid.uuid4().hex


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
    """

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = field(default=random.random)
    new_id: Callable[[], str] = _new_id
    every: Callable[[Callable[[], bool], float, str], Repeating] = _every
    pool: Callable[[int, str], cf.Executor] = _pool


DEFAULT = Runtime()
"""The real clock, ``random``, ``uuid4`` and threads."""
