"""The lifecycle verbs as pure changes: release, revive, undeclare (and their table rows)."""

from __future__ import annotations

import pytest

import shard_index
from objmanifest.core import operator_changes
from objmanifest.core.states import TABLE, VERBS, Event, InvalidTransition, State, Verb, verb_state
from objmanifest.errors import HasDependents, LeaseLost, NotFound, WrongState

from ..make import at, claim_on, entry, exactly, held, ready, shard


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
    new, released = operator_changes.release(shard(e), claim_on(e), at(5))
    assert new.entries["a"] == released
    assert (released.state, released.retry_count, released.epoch) == (State.pending, 0, 3)
    assert (released.owner, released.lease_expires_at, released.updated_at) == (None, None, at(5))


def test_release_of_an_entry_that_failed_before_keeps_its_count_and_error() -> None:
    e = held(retry_count=2, error="boom")
    _, released = operator_changes.release(shard(e), claim_on(e), at(5))
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
        operator_changes.release(sh, c, at(5))


def test_revive_resets_the_retries_of_a_dead_entry_only() -> None:
    e = entry(state=State.dead, retry_count=3, error="gave up", epoch=4)
    _, revived = operator_changes.revive(shard(e), "a", at(9))
    assert (revived.state, revived.retry_count, revived.error, revived.epoch) == (
        State.failed,
        0,
        "gave up",
        4,
    )
    for other in (entry(), held(), ready(), entry(state=State.failed, retry_count=1)):
        with pytest.raises(WrongState, match=rf"'a' is {other.state.value}, not dead"):
            operator_changes.revive(shard(other), "a", at(9))
    with pytest.raises(NotFound):
        operator_changes.revive(shard(), "a", at(9))


def test_undeclare_removes_a_pending_entry_nobody_depends_on() -> None:
    other = entry("b")
    new, removed = operator_changes.undeclare(shard(entry(), other), "a")
    assert new is not None and removed is not None
    assert list(new.entries) == ["b"] and removed.file_id == "a"
    assert operator_changes.undeclare(shard(other), "a") == (None, None)  # gone already: a no-op


def test_undeclare_refuses_other_states_and_dependents() -> None:
    for e in (held(), ready(), entry(state=State.failed), entry(state=State.dead)):
        with pytest.raises(WrongState, match=rf"'a' is {e.state.value}, not pending"):
            operator_changes.undeclare(shard(e), "a")
    with pytest.raises(HasDependents, match="'a' cannot be undeclared: b, c depend") as info:
        operator_changes.undeclare(
            shard(entry(), entry("c", depends_on=("a",)), entry("b", depends_on=("a",))), "a"
        )
    assert info.value.dependents == ("b", "c")


def test_the_commands_are_named_and_carry_the_actor() -> None:
    e = held()
    assert (
        operator_changes.Release(claim_on(e)).name,
        operator_changes.Release(claim_on(e)).actor,
    ) == ("release", "bob")
    assert operator_changes.Revive("a", actor="ops").name == "revive"
    assert (
        operator_changes.Undeclare("a").name
        == operator_changes.UndeclareInIndex("a").name
        == "undeclare"
    )


# -- every field, every word ----------------------------------------------------------------


def test_release_changes_only_state_holder_lease_and_time_and_keeps_the_order() -> None:
    e, other = held(retry_count=1, error="boom"), entry("b")
    before = shard(other, e)
    new, released = operator_changes.release(before, claim_on(e), at(5))
    assert released == e.model_copy(
        update={"state": State.failed, "owner": None, "lease_expires_at": None, "updated_at": at(5)}
    )
    assert new == before.with_entries({"a": released}) and list(new.entries) == ["b", "a"]


def test_revive_changes_only_state_retries_holder_lease_and_time() -> None:
    e = entry(state=State.dead, retry_count=3, error="gave up", epoch=4, owner="bob")
    e = e.model_copy(update={"lease_expires_at": at(1)})
    before = shard(entry("b"), e)
    new, revived = operator_changes.revive(before, "a", at(9))
    assert revived == e.model_copy(
        update={
            "state": State.failed,
            "retry_count": 0,
            "owner": None,
            "lease_expires_at": None,
            "updated_at": at(9),
        }
    )
    assert new == before.with_entries({"a": revived})


def test_revive_and_undeclare_refuse_in_full_words() -> None:
    with pytest.raises(
        WrongState, match=exactly("'a' is ready, not dead: only a dead entry can be revived")
    ):
        operator_changes.revive(shard(ready()), "a", at(9))
    with pytest.raises(
        WrongState,
        match=exactly(
            "'a' is writing, not pending: only an entry nobody has claimed yet can be undeclared"
        ),
    ):
        operator_changes.undeclare(shard(held()), "a")


def test_undeclare_leaves_every_other_entry_as_it_was_in_its_order() -> None:
    e, b, c = entry(), entry("b", depends_on=("x",)), ready("c")
    before = shard(c, e, b)
    new, removed = operator_changes.undeclare(before, "a")
    assert removed == e
    assert new == before.model_copy(update={"entries": {"c": c, "b": b}})
    assert list(new.entries) == ["c", "b"]


@pytest.mark.parametrize("count", [1, 20, 21])
def test_dependents_are_named_up_to_twenty(count: int) -> None:
    names = [f"d{i:02}" for i in range(count)]
    error = operator_changes.dependents_error("a", names)
    shown = ", ".join(names[:20]) + (" ..." if count > 20 else "")
    verb, which = ("depends", "that entry") if count == 1 else ("depend", "them")
    assert str(error) == (
        f"'a' cannot be undeclared: {shown} {verb} on it; undeclare {which} first"
    )
    assert error.dependents == tuple(names)


def test_each_command_applies_its_change_with_its_own_arguments() -> None:
    e, dead = held(), entry("d", state=State.dead)
    before = shard(e, dead, entry("p"))
    release = operator_changes.Release(claim_on(e))
    assert release.apply(before, at(5)) == operator_changes.release(before, claim_on(e), at(5))
    revive = operator_changes.Revive("d")
    assert (revive.name, revive.actor) == ("revive", "")
    assert revive.apply(before, at(5)) == operator_changes.revive(before, "d", at(5))
    undeclare = operator_changes.Undeclare("p")
    assert (undeclare.name, undeclare.actor) == ("undeclare", "")
    assert undeclare.apply(before, at(5)) == operator_changes.undeclare(before, "p")
    assert (
        operator_changes.Undeclare("p", actor="ops").actor
        == operator_changes.Revive("d", actor="ops").actor
        == "ops"
    )


def test_undeclare_in_index_removes_the_id_or_writes_nothing_when_it_is_gone() -> None:
    index = shard_index.ShardIndex().declare_many([("a", "s", ()), ("b", "s", ())])
    command = operator_changes.UndeclareInIndex("a")
    assert (command.name, command.actor) == ("undeclare", "")
    new, removed = command.apply(index, at(5))
    assert removed is True and new == index.remove("a")
    assert new is not None and "a" not in new and "b" in new
    assert operator_changes.UndeclareInIndex("zz").apply(index, at(5)) == (None, False)
    assert operator_changes.UndeclareInIndex("a", actor="ops").actor == "ops"


def test_undeclare_in_index_refuses_while_ids_depend_on_it() -> None:
    index = shard_index.ShardIndex().declare_many(
        [("a", "s", ()), ("c", "t", ("a",)), ("b", "t", ("a",))]
    )
    with pytest.raises(
        HasDependents,
        match=exactly("'a' cannot be undeclared: b, c depend on it; undeclare them first"),
    ) as info:
        operator_changes.UndeclareInIndex("a").apply(index, at(5))
    assert info.value.dependents == ("b", "c")
    assert info.value.__cause__ is None and info.value.__suppress_context__
