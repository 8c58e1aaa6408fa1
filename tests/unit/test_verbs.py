"""The lifecycle verbs as pure changes: release, revive, undeclare (and their table rows)."""

from __future__ import annotations

import pytest

from objmanifest import verbs
from objmanifest.errors import HasDependents, LeaseLost, NotFound, WrongState
from objmanifest.model import State
from objmanifest.states import TABLE, VERBS, Event, InvalidTransition, Verb, verb_state

from .make import at, claim_on, entry, held, ready, shard


def test_the_verbs_table_has_release_and_revive_and_agents_events_do_not() -> None:
    assert {
        (State.writing, Verb.release): {State.pending, State.failed},
        (State.dead, Verb.revive): {State.failed},
    } == VERBS
    assert not set(TABLE) & {(s, Event(v.value)) for s, v in VERBS if v.value in Event.__members__}
    assert verb_state(State.writing, Verb.release) is State.pending
    assert verb_state(State.writing, Verb.release, retry_count=2) is State.failed
    assert verb_state(State.dead, Verb.revive) is State.failed
    for state in (State.pending, State.failed, State.ready, State.consumed, State.dead):
        with pytest.raises(InvalidTransition, match=f"from '{state.value}' on 'release'"):
            verb_state(state, Verb.release)
    with pytest.raises(InvalidTransition):
        verb_state(State.failed, Verb.revive)


def test_release_gives_the_entry_back_without_a_retry() -> None:
    e = held(retry_count=0)
    new, released = verbs.release(shard(e), claim_on(e), at(5))
    assert new.entries["a"] == released
    assert (released.state, released.retry_count, released.epoch) == (State.pending, 0, 3)
    assert (released.owner, released.lease_expires_at, released.updated_at) == (None, None, at(5))


def test_release_of_an_entry_that_failed_before_keeps_its_count_and_error() -> None:
    e = held(retry_count=2, error="boom")
    _, released = verbs.release(shard(e), claim_on(e), at(5))
    assert (released.state, released.retry_count, released.error) == (State.failed, 2, "boom")


@pytest.mark.parametrize(
    "which", ["stale epoch", "newer epoch", "other agent", "not writing", "undeclared"]
)
def test_release_is_fenced_and_writes_nothing(which: str) -> None:
    e = held()
    c = {
        "stale epoch": claim_on(e, epoch=2),
        "newer epoch": claim_on(e, epoch=4),
        "other agent": claim_on(e, agent="eve"),
        "not writing": claim_on(e),
        "undeclared": claim_on(entry("zz")),
    }[which]
    sh = shard(ready() if which == "not writing" else e)
    error = NotFound if which == "undeclared" else LeaseLost
    with pytest.raises(error):
        verbs.release(sh, c, at(5))


def test_revive_resets_the_retries_of_a_dead_entry_only() -> None:
    e = entry(state=State.dead, retry_count=3, error="gave up", epoch=4)
    _, revived = verbs.revive(shard(e), "a", at(9))
    assert (revived.state, revived.retry_count, revived.error, revived.epoch) == (
        State.failed,
        0,
        "gave up",
        4,
    )
    for other in (entry(), held(), ready(), entry(state=State.failed, retry_count=1)):
        with pytest.raises(WrongState, match=rf"'a' is {other.state.value}, not dead"):
            verbs.revive(shard(other), "a", at(9))
    with pytest.raises(NotFound):
        verbs.revive(shard(), "a", at(9))


def test_undeclare_removes_a_pending_entry_nobody_depends_on() -> None:
    other = entry("b")
    new, removed = verbs.undeclare(shard(entry(), other), "a")
    assert new is not None and removed is not None
    assert list(new.entries) == ["b"] and removed.file_id == "a"
    assert verbs.undeclare(shard(other), "a") == (None, None)  # gone already: a no-op


def test_undeclare_refuses_other_states_and_dependents() -> None:
    for e in (held(), ready(), entry(state=State.failed), entry(state=State.dead)):
        with pytest.raises(WrongState, match=rf"'a' is {e.state.value}, not pending"):
            verbs.undeclare(shard(e), "a")
    with pytest.raises(HasDependents, match="'a' cannot be undeclared: b, c depend") as info:
        verbs.undeclare(
            shard(entry(), entry("c", depends_on=("a",)), entry("b", depends_on=("a",))), "a"
        )
    assert info.value.dependents == ("b", "c")


def test_the_commands_are_named_and_carry_the_actor() -> None:
    e = held()
    assert (verbs.Release(claim_on(e)).name, verbs.Release(claim_on(e)).actor) == ("release", "bob")
    assert verbs.Revive("a", actor="ops").name == "revive"
    assert verbs.Undeclare("a").name == verbs.UndeclareInIndex("a").name == "undeclare"
