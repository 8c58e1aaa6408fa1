"""Leases: when one expires, and renewing one in the background while its holder works.

Every time here is the store's time (see ``store.StoreClock``), never the agent's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from .errors import LeaseLost, ObjManifestError
from .model import Entry, State
from .runtime import DEFAULT, Repeating, Runtime

MARGIN = timedelta(seconds=2)
"""Slack for the ``Date`` header's whole seconds: a lease is expired only this long after
its recorded end."""

log = logging.getLogger(__name__)


def expires_at(now: datetime, lease_seconds: float) -> datetime:
    return now + timedelta(seconds=lease_seconds)


def expired(entry: Entry, now: datetime) -> bool:
    """May someone other than the holder take this entry over?"""
    return (
        entry.state is State.writing
        and entry.lease_expires_at is not None
        and now > entry.lease_expires_at + MARGIN
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
