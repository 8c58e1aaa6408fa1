"""What a wait on entries waits for: its arguments checked, the sleeps between its looks
and the error it ends with, shared by ``Task.wait`` and ``AsyncTask.wait`` (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..errors import InvalidInput, WaitTimeout
from . import states

WAIT_FIRST_DELAY, WAIT_GROWTH, WAIT_MAX_DELAY = 0.2, 1.5, 2.0
"""``wait`` polls 0.2 s apart at first, each delay 1.5 times the last, up to 2 s (as the
command line's ``--wait``)."""


def some_ids(file_ids: list[str], shown: int = 10) -> str:
    """Up to ``shown`` file ids, and how many more."""
    more = len(file_ids) - shown
    return ", ".join(file_ids[:shown]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class WaitPlan:
    """What a wait waits for, its arguments checked (no I/O): ``Task.wait`` and
    ``AsyncTask.wait`` (which sleeps on its event loop) share it (``Task.wait_plan``)."""

    stages: tuple[str, ...]
    until: str
    timeout: float | None

    @classmethod
    def of(
        cls,
        every: tuple[str, ...],
        check_stage: Callable[[str], None],
        stages: Iterable[str] | None,
        until: str,
        timeout: float | None,
    ) -> WaitPlan:
        """The plan of a wait on a task of stages ``every`` (``check_stage`` refuses a stage
        it lacks), for ``stages`` (None: every one), ``until`` and ``timeout``."""
        if isinstance(stages, str):
            raise InvalidInput(f"stages must be a list of stage names, not the string {stages!r}")
        wanted = tuple(every if stages is None else dict.fromkeys(stages))
        for stage in wanted:
            check_stage(stage)
        if until not in states.UNTIL:
            raise InvalidInput(f"until must be 'ready' or 'consumed', not {until!r}")
        if timeout is not None and not (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout >= 0
        ):
            raise InvalidInput(
                f"timeout must be a finite number of seconds from 0, or None to wait for "
                f"ever, not {timeout!r}"
            )
        return cls(wanted, until, timeout)

    def delays(self) -> Iterator[float]:
        """The sleeps between looks: 0.2 s at first, each 1.5 times the last, up to 2 s."""
        delay = WAIT_FIRST_DELAY
        while True:
            yield delay
            delay = min(delay * WAIT_GROWTH, WAIT_MAX_DELAY)

    def timed_out(self, waiting: list[str]) -> WaitTimeout:
        return WaitTimeout(
            f"timed out after {self.timeout:g}s waiting for {len(waiting)} entries of "
            f"{', '.join(self.stages)} to be {self.until}: {some_ids(waiting)}",
            tuple(waiting),
        )
