"""Leases: when one expires, and renewing one in the background while its holder works.

Every time here is the store's time (see ``store.StoreClock``), never the agent's clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from .errors import LeaseLost, ObjManifestError
from .model import Entry, State

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
    """Renews a lease every ``interval`` seconds until stopped.

    A holder that is alive keeps its entry however long its write takes. If a renewal
    finds the lease lost, renewing stops and ``lost`` says why; the holder's final commit
    will be refused anyway, so this only lets it stop early.
    """

    def __init__(self, renew: Callable[[], object], interval: float, name: str) -> None:
        self._renew = renew
        self._interval = max(0.05, interval)
        self._stop = threading.Event()
        self.lost: LeaseLost | None = None
        self._thread = threading.Thread(target=self._run, name=f"renew-{name}", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._renew()
            except LeaseLost as e:
                self.lost = e
                return
            except ObjManifestError as e:  # a passing store fault: try again next round
                log.warning("lease renewal failed, will retry: %s", e)
