"""What a wait on entries waits for: its arguments checked, the pauses between its looks
(a ``Pace``'s) and the error it ends with, shared by ``Task.wait`` and ``AsyncTask.wait``
(no I/O)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import InvalidInput, WaitTimeout
from . import states
from .pacing import Pace
from .states import State


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

    @staticmethod
    def pause(
        pace: Pace,
        found: dict[str, State],
        seen: dict[str, State] | None,
        waiting: list[str],
    ) -> float:
        """The pause before the next look: quick while an entry waited for is being
        written or the stages changed since the look before, slow while nothing happens
        (``core.pacing``)."""
        writing = any(found.get(fid) is State.writing for fid in waiting)
        return pace.after(changed=found != seen, writing=writing)

    def timed_out(self, waiting: list[str]) -> WaitTimeout:
        return WaitTimeout(
            f"timed out after {self.timeout:g}s waiting for {len(waiting)} entries of "
            f"{', '.join(self.stages)} to be {self.until}: {some_ids(waiting)}",
            tuple(waiting),
        )
