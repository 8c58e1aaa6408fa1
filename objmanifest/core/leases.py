"""Leases: when one expires, and renewing one in the background while its holder works.

Every time here is the store's time (see ``store.StoreClock``), never the agent's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from ..errors import LeaseLost, ObjManifestError
from .model import Entry
from .runtime import DEFAULT, Repeating, Runtime
from .states import State

MARGIN = timedelta(seconds=2)
"""Slack for the ``Date`` header's whole seconds: a lease is expired only this long after
its recorded end."""

log = logging.getLogger(__name__)


def expires_at(now: datetime, lease_seconds: float) -> datetime:
    return now + timedelta(seconds=lease_seconds)


def backoff_seconds(retry_count: int, base: float, cap: float) -> float:
    """How long a failed entry waits before it may be claimed again after its
    ``retry_count``-th failure: ``base``, doubled per retry after the first, at most ``cap``
    (0 when ``base`` is 0: no backoff)."""
    if retry_count < 1:
        return 0.0
    return min(cap, base * 2.0 ** (retry_count - 1))


def retry_at(now: datetime, retry_count: int, base: float, cap: float) -> datetime | None:
    """When an entry that failed for the ``retry_count``-th time at ``now`` (store time)
    may be claimed again; None when it may be claimed at once."""
    seconds = backoff_seconds(retry_count, base, cap)
    return now + timedelta(seconds=seconds) if seconds > 0 else None


def backing_off(entry: Entry, now: datetime) -> bool:
    """Is this failed entry still waiting out its retry backoff?"""
    return entry.state is State.failed and entry.retry_at is not None and now < entry.retry_at


def due_at(entry: Entry, deadline: float | None) -> datetime | None:
    """When a writing entry must be ready (``deadline`` seconds after its claim) or a ready
    one consumed (after ``ready_at``); None for other states or without a deadline."""
    if deadline is None:
        return None
    start = {State.writing: entry.claimed_at, State.ready: entry.ready_at}.get(entry.state)
    return start + timedelta(seconds=deadline) if start is not None else None


def late(entry: Entry, now: datetime, deadline: float | None) -> bool:
    """Has the entry outstayed its stage's deadline in its state?"""
    due = due_at(entry, deadline)
    return due is not None and now > due


def expired(entry: Entry, now: datetime) -> bool:
    """May someone other than the holder take this entry over?"""
    return (
        entry.state is State.writing
        and entry.lease_expires_at is not None
        and now > entry.lease_expires_at + MARGIN
    )


def held_by_another(entries: Iterable[Entry], agent: str, now: datetime) -> bool:
    """Whether an agent other than ``agent`` holds one of ``entries`` under a lease that has
    not expired: someone is working in the shard they come from right now."""
    return any(
        e.state is State.writing and e.owner != agent and not expired(e, now) for e in entries
    )


class Renewer:
    """Renews a lease every ``interval`` seconds until stopped (on the runtime's background
    scheduler: a thread by default).

    A holder that is alive keeps its entry however long its write takes. If a renewal
    finds the lease lost, renewing stops and ``lost`` says why; the holder's final commit
    will be refused anyway, so this only lets it stop early.
    """

    def __init__(
        self,
        renew: Callable[[], object],
        interval: float,
        name: str,
        runtime: Runtime = DEFAULT,
    ) -> None:
        self._renew = renew
        self._interval = max(0.05, interval)
        self._name = name
        self._runtime = runtime
        self._job: Repeating | None = None
        self.lost: LeaseLost | None = None

    def __enter__(self) -> Renewer:
        self._job = self._runtime.every(self._round, self._interval, f"renew-{self._name}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._job is not None:
            self._job.stop()

    def _round(self) -> bool:
        """One renewal; False once the lease is lost (nothing more to renew)."""
        try:
            self._renew()
        except LeaseLost as e:
            self.lost = e
            return False
        except ObjManifestError as e:  # a passing store fault: try again next round
            log.warning("lease renewal failed, will retry: %s", e)
        return True
