"""Waiting for an entry: a consumer that waits looks quickly while the entry is written and
seldom while nothing happens, one conditional read a look. Time is a clock the waiter's
own sleeps move (nothing here is timed): what each look cost is counted at the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest

import objmanifest as om
from objmanifest.core.runtime import DEFAULT
from objmanifest.wire.polling import poll


class Time:
    """A clock moved only by the sleeps of whoever waits; ``at`` runs a call once the
    clock reaches a time (another agent's doing, meanwhile)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []
        self.due: list[tuple[float, Callable[[], None]]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        for when, call in list(self.due):
            if when <= self.now:
                self.due.remove((when, call))
                call()

    def at(self, when: float, call: Callable[[], None]) -> None:
        self.due.append((when, call))


def setup(time: Time) -> tuple[om.MemoryStore, om.Task, om.Task]:
    """A waiter's task on a store whose clock is ``time``, and a producer's task."""
    name = f"waiting-{uuid.uuid4().hex[:8]}"
    runtime = replace(DEFAULT, monotonic=time.monotonic, sleep=time.sleep)
    waiter_store = om.MemoryStore(name, "p", runtime=runtime)
    om.Task.create(waiter_store, "job", stages=["make", "other"])
    producer = om.Task.open(om.MemoryStore(name, "p"), "job")
    producer.declare_many([("x", "make"), ("quiet", "other")])
    return waiter_store, om.Task.open(waiter_store, "job"), producer


def test_an_idle_wait_settles_at_30_looks_a_minute_of_one_request_each() -> None:
    time = Time()
    store, task, _ = setup(time)
    me = task.agent("c")
    with pytest.raises(om.NotReady):
        me.consume("quiet", wait=600)
    assert time.now >= 600
    calls_before = sum(store.faults.calls.values())
    looks = len(time.pauses)
    settled = [p for p in time.pauses if p == 2.0]
    assert len(settled) >= looks - 10  # it slows down within a few looks
    with pytest.raises(om.NotReady):
        me.consume("quiet", wait=120)
    requests = sum(store.faults.calls.values()) - calls_before
    assert requests <= 30 * 2 + 10  # two minutes at most 30 a minute, and the first quick ones
    assert requests == len(time.pauses) - looks + 1  # each look one request (a 304 of the shard)


def test_a_waiter_sees_the_claim_and_then_the_put_within_half_a_second() -> None:
    time = Time()
    _, task, producer = setup(time)
    held: list[om.Claim] = []
    made: list[float] = []

    def claim() -> None:
        got = producer.agent("p").claim("x")
        assert got is not None
        held.append(got)

    def put() -> None:
        producer.agent("p").put(held[0], b"the data")
        made.append(time.now)

    time.at(30.0, claim)  # the waiter has long settled at one look every 2 s
    time.at(40.0, put)
    assert task.agent("c").consume("x", wait=600) == b"the data"
    assert time.now - made[0] <= 0.5  # the put seen within half a second
    writing = [
        p for p, at in zip(time.pauses, _times(time.pauses), strict=True) if 32.0 <= at <= 40.0
    ]
    assert writing and max(writing) <= 0.5  # quick looks while it was written


def _times(pauses: list[float]) -> list[float]:
    """When each pause ended."""
    out, t = [], 0.0
    for p in pauses:
        t += p
        out.append(t)
    return out


def test_task_wait_and_poll_pace_their_looks_the_same_way() -> None:
    time = Time()
    _, task, producer = setup(time)
    time.at(20.0, lambda: _produce(producer, "x"))
    assert task.wait(["make"], timeout=600) == {"x": om.State.ready}
    assert max(time.pauses) == 2.0 and time.now < 20.0 + 2.0 + 0.01
    time2 = Time()
    calls = []

    def attempt() -> bytes | None:
        calls.append(time2.now)
        raise om.NotReady("not yet", "pending")

    with pytest.raises(om.NotReady):
        poll(attempt, 300, (om.NotReady,), sleep=time2.sleep, monotonic=time2.monotonic)
    late = [t for t in calls if t >= 60]
    assert len(late) <= 4 * 30 + 1  # from the first minute on: 30 a minute


def _produce(task: om.Task, file_id: str) -> None:
    agent = task.agent("p")
    claim = agent.claim(file_id)
    assert claim is not None
    agent.put(claim, b"made")


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), True, "10"])
def test_a_wait_that_is_not_a_finite_number_of_seconds_is_refused(wait: object) -> None:
    _, task, _ = setup(Time())
    with pytest.raises(om.InvalidInput, match="wait must be a finite number"):
        task.agent("c").consume("x", wait=wait)  # type: ignore[arg-type]
