"""The lifecycle table, exhaustively: every state against every event."""

from __future__ import annotations

import itertools

import pytest

from objmanifest.core.states import FAILURES, TABLE, Event, InvalidTransition, State, next_state

EXPECTED = {
    (State.pending, Event.claim): {State.writing},
    (State.failed, Event.claim): {State.writing},
    (State.writing, Event.takeover): {State.writing, State.dead},
    (State.writing, Event.renew): {State.writing},
    (State.writing, Event.finish): {State.ready},
    (State.writing, Event.fail): {State.failed, State.dead},
    (State.writing, Event.expire): {State.failed, State.dead},
    (State.ready, Event.consume): {State.ready, State.consumed},
    (State.ready, Event.mismatch): {State.failed, State.dead},
}


def test_states_are_exactly_the_six() -> None:
    assert [s.value for s in State] == ["pending", "writing", "ready", "consumed", "failed", "dead"]


@pytest.mark.parametrize(("state", "event"), list(itertools.product(State, Event)))
def test_every_pair(state: State, event: Event) -> None:
    expected = EXPECTED.get((state, event))
    assert ((state, event) in TABLE) == (expected is not None)
    if expected is None:
        with pytest.raises(
            InvalidTransition, match=f"no transition from '{state.value}' on '{event.value}'"
        ):
            next_state(state, event, retry_count=0, max_retries=3)
        return
    reached = {
        next_state(state, event, retry_count=r, max_retries=3, all_consumed=c)
        for r in range(6)
        for c in (False, True)
    }
    assert reached == expected


def test_table_is_the_expected_one() -> None:
    assert {k: set(v) for k, v in TABLE.items()} == EXPECTED


@pytest.mark.parametrize("event", sorted(FAILURES, key=lambda e: e.value))
def test_failures_become_dead_only_past_max_retries(event: Event) -> None:
    state = State.ready if event is Event.mismatch else State.writing
    alive = State.writing if event is Event.takeover else State.failed
    # max_retries=3 allows four attempts: the 1st..3rd failure leave it alive, the 4th kills it
    for retries in (1, 2, 3):
        assert next_state(state, event, retry_count=retries, max_retries=3) is alive
    assert next_state(state, event, retry_count=4, max_retries=3) is State.dead
    assert next_state(state, event, retry_count=1, max_retries=0) is State.dead


def test_terminal_states_have_no_way_out() -> None:
    for state in (State.consumed, State.dead):
        assert not any((state, e) in TABLE for e in Event)
