"""Waiting for work that is not there yet.

(A claim held across processes is rebuilt by ``Agent.resume`` from the agent name and epoch
an earlier process printed; fencing stays in the core.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_DELAY = 0.2
MAX_DELAY = 2.0
GROWTH = 1.5


def poll(
    attempt: Callable[[], T | None],
    wait: float,
    retry_on: tuple[type[Exception], ...] = (),
    on_wait: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Call ``attempt`` until it returns something, for at most ``wait`` seconds.

    A ``retry_on`` error counts as "nothing yet"; after the deadline the last such error is
    raised again, or None returned. Delays grow from 0.2 s to 2 s, so a long wait costs a
    request every two seconds and a short one still answers quickly. ``on_wait`` is called
    once, before the first sleep, to tell a human that the command is waiting.
    """
    deadline = time.monotonic() + max(0.0, wait)
    delay = FIRST_DELAY
    while True:
        last: Exception | None = None
        try:
            result = attempt()
        except retry_on as e:
            last, result = e, None
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if last is not None:
                raise last
            return None
        if on_wait is not None:
            on_wait()
            on_wait = None
        sleep(min(delay, remaining))
        delay = min(delay * GROWTH, MAX_DELAY)
