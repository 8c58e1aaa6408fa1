"""Waiting for work that is not there yet.

(A claim held across processes is rebuilt by ``Agent.resume`` from the agent name and epoch
an earlier process printed; fencing stays in the core.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..core.pacing import Pace

T = TypeVar("T")


def poll(
    attempt: Callable[[], T | None],
    wait: float,
    retry_on: tuple[type[Exception], ...] = (),
    on_wait: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> T | None:
    """Call ``attempt`` until it returns something, for at most ``wait`` seconds.

    A ``retry_on`` error counts as "nothing yet"; after the deadline the last such error is
    raised again, or None returned. The pauses between attempts are a ``Pace``'s: quick
    while the error says the entry is being written (``NotReady.state``), or after it
    changed, growing to one attempt every 2 s while nothing happens, so a long wait costs
    30 attempts a minute and a handoff is still seen quickly. ``on_wait`` is called once,
    before the first sleep, to tell a human that the command is waiting.
    """
    deadline = monotonic() + max(0.0, wait)
    pace, seen = Pace(), None
    while True:
        last: Exception | None = None
        try:
            result = attempt()
        except retry_on as e:
            last, result = e, None
        if result is not None:
            return result
        remaining = deadline - monotonic()
        if remaining <= 0:
            if last is not None:
                raise last
            return None
        if on_wait is not None:
            on_wait()
            on_wait = None
        state = getattr(last, "state", None)
        pause = pace.after(changed=state != seen, writing=state == "writing")
        seen = state
        sleep(min(pause, remaining))
