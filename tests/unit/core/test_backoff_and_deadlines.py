"""Retry backoff and stage deadlines in the pure core: when a failed entry may be claimed
again (``leases.backoff_seconds``, ``retry_at``, ``backing_off``; every failure of
``changes``), and when an entry is late (``leases.due_at``, ``late``). No store, no I/O."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from objmanifest.core import changes, leases, states
from objmanifest.core.states import State
from objmanifest.errors import NotClaimable

from ..make import RULES, T0, at, claim_on, entry, exactly, held, nothing, ready, shard

BACKOFF = replace(RULES, retry_backoff=10.0, retry_backoff_max=35.0)
"""Rules with a backoff of 10 s doubling up to 35 s (max_retries 2)."""

LONG = replace(RULES, max_retries=10, retry_backoff=10.0, retry_backoff_max=35.0)

US = timedelta(microseconds=1)


# -- how long -----------------------------------------------------------------------------


def test_the_backoff_doubles_per_retry_up_to_the_cap() -> None:
    assert [leases.backoff_seconds(n, 10.0, 35.0) for n in (1, 2, 3, 4, 9)] == [
        10.0,
        20.0,
        35.0,
        35.0,
        35.0,
    ]
    assert leases.backoff_seconds(3, 1.5, 1000.0) == 6.0


def test_no_base_or_no_failure_means_no_backoff() -> None:
    assert leases.backoff_seconds(3, 0.0, 35.0) == 0.0
    assert leases.backoff_seconds(0, 10.0, 35.0) == 0.0
    assert leases.backoff_seconds(1, 10.0, 35.0) == 10.0
    assert leases.backoff_seconds(1, 1.0, 35.0) == 1.0
    assert leases.backoff_seconds(2, 0.5, 35.0) == 1.0


def test_the_retry_time_is_the_backoff_after_now() -> None:
    assert leases.retry_at(at(5), 2, 10.0, 35.0) == at(25)
    assert leases.retry_at(at(5), 1, 0.0, 35.0) is None
    assert leases.retry_at(at(5), 0, 10.0, 35.0) is None
    assert leases.retry_at(at(5), 1, 0.5, 35.0) == at(5.5)


def test_a_failed_entry_backs_off_until_its_retry_time_only() -> None:
    e = entry(state=State.failed, retry_count=1, retry_at=at(10))
    assert leases.backing_off(e, at(10) - US)
    assert not leases.backing_off(e, at(10))
    assert not leases.backing_off(e, at(11))
    assert not leases.backing_off(entry(state=State.failed, retry_count=1), at(0))
    for state in (State.pending, State.writing, State.dead):
        assert not leases.backing_off(entry(state=state, retry_at=at(10)), at(0))


# -- the changes that fail an entry ---------------------------------------------------------


def test_fail_sets_the_retry_time_on_the_store_clock() -> None:
    e = held(retry_count=1)
    _, failed = changes.fail(shard(e), claim_on(e), "boom", at(100), BACKOFF)
    assert failed.state is State.failed
    assert failed.retry_count == 2
    assert failed.retry_at == at(120)


def test_fail_without_backoff_leaves_no_retry_time() -> None:
    e = held()
    _, failed = changes.fail(shard(e), claim_on(e), "boom", at(100), RULES)
    assert failed.state is State.failed
    assert failed.retry_at is None


def test_a_dead_entry_has_no_retry_time() -> None:
    e = held(retry_count=2)
    _, dead = changes.fail(shard(e), claim_on(e), "boom", at(100), BACKOFF)
    assert dead.state is State.dead
    assert dead.retry_at is None


def test_a_reaped_lease_backs_off() -> None:
    e = held(lease=30)
    _, (reaped,) = changes.reap(shard(e), at(50), BACKOFF)
    assert reaped.state is State.failed
    assert reaped.retry_at == at(60)


def test_bad_data_backs_off() -> None:
    e = ready(retry_count=2)
    _, failed = changes.mismatch(shard(e), "a", "k", "c", "bad", at(100), LONG)
    assert failed.state is State.failed
    assert failed.retry_at == at(135)


def test_a_backing_off_entry_is_not_claimable_and_says_until_when() -> None:
    e = entry(state=State.failed, retry_count=1, error="boom", retry_at=at(10))
    reason = changes.why_not_claimable(e, at(9), nothing)
    assert reason == (f"backing off until {at(10).isoformat()} after 1 failure; last error: boom")
    with pytest.raises(NotClaimable, match=exactly(f"'a' is not claimable: {reason}")):
        changes.claim(shard(e), "a", "ann", at(9), BACKOFF, nothing)
    assert changes.why_not_claimable(e, at(10), nothing) is None


def test_dead_dependencies_are_named_after_the_backoff() -> None:
    dep = entry("d", state=State.dead)
    e = entry(state=State.failed, retry_count=1, depends_on=("d",), retry_at=at(10))
    look = {"d": dep}.get
    assert (changes.why_not_claimable(e, at(0), look) or "").startswith("backing off")
    assert changes.why_not_claimable(e, at(10), look) == "depends on dead entries: d"


def test_claim_any_skips_entries_backing_off() -> None:
    waiting = entry("w", state=State.failed, retry_count=1, retry_at=at(10))
    free = entry("f", state=State.failed, retry_count=1, retry_at=at(5))
    new, claims = changes.claim_any(shard(waiting, free), "ann", 5, at(7), BACKOFF, nothing)
    assert [c.file_id for c in claims] == ["f"]
    assert new is not None
    assert new.entries["w"] == waiting


def test_a_claim_clears_the_retry_time_and_stamps_the_claim() -> None:
    e = entry(state=State.failed, retry_count=1, retry_at=at(10))
    new, _claim = changes.claim(shard(e), "a", "ann", at(12), BACKOFF, nothing)
    assert new is not None
    taken = new.entries["a"]
    assert taken.state is State.writing
    assert taken.retry_at is None
    assert taken.claimed_at == at(12)


def test_a_takeover_is_immediate_and_clears_the_retry_time() -> None:
    e = held(lease=30, retry_count=0)
    new, _claim = changes.claim(shard(e), "a", "ann", at(40), BACKOFF, nothing)
    assert new is not None
    taken = new.entries["a"]
    assert (taken.state, taken.owner, taken.retry_count) == (State.writing, "ann", 1)
    assert taken.retry_at is None
    assert taken.claimed_at == at(40)


def test_a_renewal_keeps_the_claim_time() -> None:
    e = held(claimed_at=at(1))
    new, _ = changes.renew(shard(e), claim_on(e), at(20), RULES)
    assert new.entries["a"].claimed_at == at(1)


def test_finish_stamps_ready_at() -> None:
    e = held()
    _new, done = changes.finish(shard(e), claim_on(e), "k", "c", 5, at(20))
    assert done.ready_at == at(20)


# -- deadlines ------------------------------------------------------------------------------


def test_a_writing_entry_is_due_its_deadline_after_its_claim() -> None:
    e = held(claimed_at=at(5))
    assert leases.due_at(e, 60.0) == at(65)
    assert not leases.late(e, at(65), 60.0)
    assert leases.late(e, at(65) + US, 60.0)


def test_a_ready_entry_is_due_its_deadline_after_it_became_ready() -> None:
    e = ready(ready_at=at(7), claimed_at=at(1))
    assert leases.due_at(e, 10.0) == at(17)
    assert not leases.late(e, at(17), 10.0)
    assert leases.late(e, at(18), 10.0)


def test_no_deadline_or_no_start_is_never_late() -> None:
    assert leases.due_at(held(claimed_at=at(5)), None) is None
    assert not leases.late(held(claimed_at=at(5)), at(10_000), None)
    assert leases.due_at(held(), 10.0) is None
    assert not leases.late(held(), at(10_000), 10.0)
    assert leases.due_at(ready(), 10.0) is None


@pytest.mark.parametrize("state", [State.pending, State.failed, State.consumed, State.dead])
def test_other_states_are_never_late(state: State) -> None:
    e = entry(state=state, claimed_at=at(0), ready_at=at(0))
    assert leases.due_at(e, 1.0) is None
    assert not leases.late(e, at(10_000), 1.0)


def test_time_zero_is_the_test_clock() -> None:
    assert at(0) == T0


# -- what wait() still waits for ------------------------------------------------------------


def test_outstanding_entries_until_ready_count_consumed_ones_as_done() -> None:
    found = {
        "p": State.pending,
        "w": State.writing,
        "r": State.ready,
        "c": State.consumed,
        "f": State.failed,
        "d": State.dead,
        "e": State.dead,
        "a": State.pending,
    }
    assert states.outstanding(found, "ready") == (["a", "f", "p", "w"], ["d", "e"])
    assert states.outstanding(found, "consumed") == (["a", "f", "p", "r", "w"], ["d", "e"])
    assert states.outstanding({}, "ready") == ([], [])
    assert states.outstanding({"c": State.consumed, "r": State.ready}, "ready") == ([], [])
