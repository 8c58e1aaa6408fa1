"""Leases: their end, expiry with its 2 s margin, and the background renewer (with a fake
renew callable, no store)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

from objmanifest.core import leases
from objmanifest.core.leases import Renewer
from objmanifest.core.states import State
from objmanifest.errors import LeaseLost, ObjManifestError, StoreError

from ..make import T0, at, entry, held

WAIT = 5.0
"""Bound on waiting for the renewer thread; a passing test waits far less."""


def test_a_lease_ends_lease_seconds_after_now() -> None:
    assert leases.expires_at(T0, 30) == at(30)
    assert leases.expires_at(T0, 0.25) == T0 + timedelta(milliseconds=250)
    assert leases.expires_at(at(7), 0) == at(7)


def test_a_shard_is_held_by_another_while_another_agent_holds_a_live_lease() -> None:
    mine, theirs = held("m", owner="ann"), held("t", owner="bob", lease=30)
    pending, done = entry("p"), entry("d", state=State.ready, owner="bob")
    assert leases.held_by_another([pending, mine, theirs], "ann", at(0))
    assert leases.held_by_another([theirs], "ann", at(32))  # within the margin: still his
    assert not leases.held_by_another([theirs], "ann", at(32) + timedelta(microseconds=1))
    assert not leases.held_by_another([mine, pending, done], "ann", at(0))  # ready: not held
    assert not leases.held_by_another([theirs], "bob", at(0))  # his own
    assert not leases.held_by_another([], "ann", at(0))


def test_the_margin_is_two_seconds() -> None:
    assert timedelta(seconds=2) == leases.MARGIN


def test_a_lease_expires_only_after_its_end_plus_the_margin() -> None:
    e = held(lease=30)
    assert not leases.expired(e, at(0))
    assert not leases.expired(e, at(30))
    assert not leases.expired(e, at(32))
    assert leases.expired(e, at(32) + timedelta(microseconds=1))
    assert leases.expired(e, at(10_000))


@pytest.mark.parametrize("state", [s for s in State if s is not State.writing])
def test_only_a_writing_entry_has_a_lease_that_can_expire(state: State) -> None:
    e = entry(state=state, owner="bob", epoch=1, lease_expires_at=at(30))
    assert not leases.expired(e, at(10_000))


def test_a_writing_entry_without_a_lease_end_never_expires() -> None:
    e = entry(state=State.writing, owner="bob", epoch=1)
    assert not leases.expired(e, at(10**9))


# -- Renewer --------------------------------------------------------------------------------


class FakeRenew:
    """Counts calls and times them; raises the queued errors first, then keeps succeeding.
    ``hook`` runs inside each call (from the renewer's thread)."""

    def __init__(self, *errors: Exception, hook: object = None) -> None:
        self.errors = list(errors)
        self.times: list[float] = []
        self.hook = hook
        self.called = threading.Event()
        self.lock = threading.Lock()

    def __call__(self) -> object:
        with self.lock:
            self.times.append(time.monotonic())
        self.called.set()
        if callable(self.hook):
            self.hook()
        if self.errors:
            raise self.errors.pop(0)
        return "renewed"

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.times)

    def wait_for(self, n: int) -> None:
        deadline = time.monotonic() + WAIT
        while self.count < n:
            assert time.monotonic() < deadline, f"renew called {self.count} times, wanted {n}"
            time.sleep(0.005)


def renewer_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"renew-{name}"]


def test_nothing_is_renewed_before_the_renewer_starts() -> None:
    renew = FakeRenew()
    r = Renewer(renew, 0.01, "idle")
    assert r.lost is None
    assert renewer_threads("idle") == []
    r.stop()  # stopping one never started is allowed
    assert renew.count == 0


def test_it_renews_every_interval_in_a_daemon_thread_until_stopped() -> None:
    renew = FakeRenew()
    start = time.monotonic()
    with Renewer(renew, 0.05, "steady") as r:
        (thread,) = renewer_threads("steady")
        assert thread.daemon
        renew.wait_for(3)
    assert not thread.is_alive()
    calls = renew.count
    time.sleep(0.1)
    assert renew.count == calls  # nothing after stop
    # every renewal comes a whole interval after the previous one (or the start)
    gaps = [b - a for a, b in zip([start, *renew.times], renew.times, strict=False)]
    assert all(g >= 0.045 for g in gaps), gaps
    assert r.lost is None


def test_the_interval_is_never_below_fifty_milliseconds() -> None:
    renew = FakeRenew()
    start = time.monotonic()
    with Renewer(renew, 0, "fast"):
        renew.wait_for(4)
    elapsed = renew.times[3] - start
    assert 0.2 <= elapsed < 2.0, elapsed


def test_a_lost_lease_stops_renewing_and_says_why() -> None:
    lost = LeaseLost("lease on 'a' is lost")
    renew = FakeRenew(lost)
    with Renewer(renew, 0.05, "lost") as r:
        renew.wait_for(1)
        (thread,) = renewer_threads("lost") or [None]
        if thread is not None:
            thread.join(WAIT)
        assert renewer_threads("lost") == []  # it stopped by itself
        assert r.lost is lost
    assert renew.count == 1


def test_a_passing_store_fault_is_logged_and_renewal_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="objmanifest.core.leases")
    renew = FakeRenew(StoreError("503 Slow Down"), ObjManifestError("timeout"))
    with Renewer(renew, 0.05, "flaky") as r:
        renew.wait_for(3)
    assert r.lost is None
    assert [(rec.name, rec.levelno, rec.getMessage()) for rec in caplog.records] == [
        (
            "objmanifest.core.leases",
            logging.WARNING,
            "lease renewal failed, will retry: 503 Slow Down",
        ),
        ("objmanifest.core.leases", logging.WARNING, "lease renewal failed, will retry: timeout"),
    ]


def test_stop_waits_for_a_renewal_in_flight() -> None:
    release = threading.Event()
    renew = FakeRenew(hook=lambda: release.wait(WAIT))
    r = Renewer(renew, 0.05, "inflight").__enter__()
    assert renew.called.wait(WAIT)
    (thread,) = renewer_threads("inflight")
    timer = threading.Timer(0.2, release.set)
    timer.start()
    r.stop()
    assert release.is_set()  # stop returned only once the renewal finished
    assert not thread.is_alive()
    timer.join()


def test_the_renew_callable_may_stop_its_own_renewer() -> None:
    errors: list[BaseException] = []
    box: list[Renewer] = []

    def stop_from_inside() -> None:
        try:
            box[0].stop()
        except BaseException as e:
            errors.append(e)

    renew = FakeRenew(hook=stop_from_inside)
    r = Renewer(renew, 0.05, "self")
    box.append(r)
    with r:
        renew.wait_for(1)
        (thread,) = renewer_threads("self") or [None]
        if thread is not None:
            thread.join(WAIT)
    assert errors == []
    assert renew.count == 1
    assert r.lost is None
