"""The pure changes of ``objmanifest.core.changes`` on in-memory shards: no store, no I/O.

Each test states the exact entry a change must produce (every field), what it must leave
alone, and the exact words of every refusal.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from objmanifest.core import changes, commands
from objmanifest.core.changes import DataChanged, Rules
from objmanifest.core.model import Archived, Claim, Declaration, Entry, Shard, declaration_digest
from objmanifest.core.states import State
from objmanifest.errors import (
    AlreadyConsumed,
    DataRemoved,
    DeclarationConflict,
    LeaseLost,
    NotClaimable,
    NotFound,
    NotReady,
)

from ..make import (
    RULES,
    STAGE,
    T0,
    at,
    claim_on,
    entry,
    exactly,
    held,
    lookup,
    nothing,
    ready,
    shard,
)

NOW = at(100)

Change = Callable[[Shard], object]
HolderChange = Callable[[Shard, Claim], object]
Data = tuple[str, str, int, "int | None", "str | None", "str | None"]


def updated(e: Entry, **fields: object) -> Entry:
    """``e`` as a change at ``NOW`` must leave it: ``fields`` changed, stamped ``NOW``."""
    return e.model_copy(update={**fields, "updated_at": NOW})


# -- not declared ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda sh: changes.claim(sh, "zz", "ann", NOW, RULES, nothing),
        lambda sh: changes.renew(sh, claim_on(held("zz")), NOW, RULES),
        lambda sh: changes.finish(sh, claim_on(held("zz")), "k", "c", 5, NOW),
        lambda sh: changes.fail(sh, claim_on(held("zz")), "boom", NOW, RULES),
        lambda sh: changes.consume(sh, "zz", "ann", "k", "c", NOW),
        lambda sh: changes.mismatch(sh, "zz", "k", "c", "bad", NOW, RULES),
    ],
    ids=["claim", "renew", "finish", "fail", "consume", "mismatch"],
)
def test_an_entry_that_is_not_declared_is_not_found(change: Change) -> None:
    with pytest.raises(NotFound, match=exactly("'zz' is not declared in shard 's'")):
        change(shard(entry("a")))


# -- declare --------------------------------------------------------------------------------


def decl(file_id: str = "a", **fields: object) -> Declaration:
    return Declaration.of({"file_id": file_id, "stage": STAGE, **fields})


def test_declare_adds_pending_entries_stamped_with_the_store_time() -> None:
    old = entry("old")
    before = shard(old)
    new, result = changes.declare(
        before, NOW, [decl("a", depends_on=["old"], consumers=["r2", "r1"]), decl("b")]
    )
    a = Entry(
        file_id="a",
        stage=STAGE,
        state=State.pending,
        depends_on=("old",),
        consumers=("r1", "r2"),
        declared_at=NOW,
        updated_at=NOW,
    )
    b = Entry(file_id="b", stage=STAGE, declared_at=NOW, updated_at=NOW)
    assert result == [a, b]
    assert new is not None
    assert new.entries == {"old": old, "a": a, "b": b}
    assert list(new.entries) == ["old", "a", "b"]  # declaration order is kept
    assert new.entries["old"] is old
    assert before.entries == {"old": old}
    assert (a.owner, a.epoch, a.retry_count, a.lease_expires_at) == (None, 0, 0, None)


def test_declaring_the_same_again_is_a_no_op_returning_the_existing_entry() -> None:
    existing = entry("a", state=State.ready, epoch=2, depends_on=("x", "y"), consumers=("r",))
    new, result = changes.declare(
        shard(existing), NOW, [decl("a", depends_on=["y", "x", "x"], consumers=["r"])]
    )
    assert new is None
    assert result == [existing]
    assert result[0] is existing


def test_declare_mixes_existing_and_new_entries_in_the_order_asked() -> None:
    existing = entry("a")
    new, result = changes.declare(shard(existing), NOW, [decl("b"), decl("a")])
    assert new is not None
    assert [e.file_id for e in result] == ["b", "a"]
    assert result[1] is existing
    assert new.entries["a"] is existing
    assert new.entries["b"].declared_at == NOW


def test_declarations_after_an_existing_one_are_still_added() -> None:
    existing = entry("a")
    new, result = changes.declare(shard(existing), NOW, [decl("a"), decl("b"), decl("c")])
    assert new is not None
    assert list(new.entries) == ["a", "b", "c"]
    assert [e.file_id for e in result] == ["a", "b", "c"]


def test_the_same_declaration_twice_in_one_batch_adds_one_entry() -> None:
    new, result = changes.declare(shard(), NOW, [decl("a"), decl("a")])
    assert new is not None
    assert list(new.entries) == ["a"]
    assert result[0] is result[1]


def test_a_different_declaration_in_the_same_batch_is_a_conflict() -> None:
    with pytest.raises(
        DeclarationConflict,
        match=exactly(
            "'a' is already declared differently: depends_on: +{'x'}. "
            "Declare it as before, or use a new file id."
        ),
    ):
        changes.declare(shard(), NOW, [decl("a"), decl("a", depends_on=["x"])])


def test_a_different_declaration_says_everything_that_differs() -> None:
    existing = entry("a", stage="t", depends_on=("x",), consumers=("r1",))
    with pytest.raises(
        DeclarationConflict,
        match=exactly(
            "'a' is already declared differently: stage: 't' != 's'; "
            "depends_on: +{'y'} -{'x'}; "
            "consumers: declared ['r1'], now ['r1', 'r2']. "
            "Declare it as before, or use a new file id."
        ),
    ):
        changes.declare(shard(existing), NOW, [decl("a", depends_on=["y"], consumers=["r2", "r1"])])


def test_declare_with_nothing_to_declare_writes_nothing() -> None:
    assert changes.declare(shard(entry("a")), NOW, []) == (None, [])


def test_differences_compare_dependencies_and_consumers_as_sets() -> None:
    existing = entry("a", depends_on=("y", "x", "x"), consumers=("r", "r"))
    assert changes.differences(existing, decl("a", depends_on=["x", "y"], consumers=["r"])) == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"stage": "t"}, ["stage: 's' != 't'"]),
        ({"depends_on": ["b", "a"]}, ["depends_on: +{'a', 'b'}"]),
        ({"consumers": ["r"]}, ["consumers: declared [], now ['r']"]),
    ],
)
def test_differences_name_each_field_that_differs(
    fields: dict[str, object], expected: list[str]
) -> None:
    assert changes.differences(entry("a"), decl("a", **fields)) == expected


# -- blockers and why_not_claimable ---------------------------------------------------------


def test_blockers_of_an_entry_without_dependencies() -> None:
    assert changes.blockers(entry("a"), nothing) == ([], [])


def test_blockers_list_unmet_and_dead_dependencies_in_order() -> None:
    deps = [
        entry("p"),
        held("w"),
        entry("f", state=State.failed),
        ready("r"),
        entry("c", state=State.consumed),
        entry("d1", state=State.dead),
        entry("d2", state=State.dead),
    ]
    e = entry("a", depends_on=("p", "w", "gone", "f", "r", "c", "d1", "d2"))
    assert changes.blockers(e, lookup(*deps)) == (
        ["p (pending)", "w (writing)", "gone (not declared)", "f (failed)"],
        ["d1", "d2"],
    )


@pytest.mark.parametrize("state", [State.pending, State.failed])
def test_a_pending_or_failed_entry_with_its_dependencies_produced_is_claimable(
    state: State,
) -> None:
    e = entry("a", state=state, depends_on=("r", "c"))
    deps = lookup(ready("r"), entry("c", state=State.consumed))
    assert changes.why_not_claimable(e, NOW, deps) is None


def test_a_held_lease_is_not_claimable_until_two_seconds_past_its_end() -> None:
    e = held("a", owner="bob", epoch=3, lease=30)
    reason = (
        "state writing: held by bob (epoch 3) until 2030-01-01T12:00:30+00:00 and 2 s after it "
        "(a margin for the store's clock)"
    )
    assert changes.why_not_claimable(e, at(0), nothing) == reason
    assert changes.why_not_claimable(e, at(32), nothing) == reason
    assert changes.why_not_claimable(e, at(32.000001), nothing) is None


def test_a_writing_entry_without_a_lease_end_is_held_forever() -> None:
    e = entry("a", state=State.writing, owner="bob", epoch=1)
    assert (
        changes.why_not_claimable(e, at(10**6), nothing)
        == "state writing: held by bob (epoch 1) until ?"
    )


def test_an_expired_lease_still_waits_for_unmet_dependencies() -> None:
    e = held("a", lease=30, depends_on=("x",))
    assert (
        changes.why_not_claimable(e, at(40), nothing)
        == "waiting for dependencies: x (not declared)"
    )


def test_dead_entries_are_not_claimable_and_say_why() -> None:
    e = entry("a", state=State.dead, retry_count=3, error="disk full")
    assert (
        changes.why_not_claimable(e, NOW, nothing)
        == "state dead after 3 failures; last error: disk full"
    )


@pytest.mark.parametrize("state", [State.ready, State.consumed])
def test_produced_entries_are_not_claimable(state: State) -> None:
    e = entry("a", state=state)
    assert changes.why_not_claimable(e, NOW, nothing) == f"state {state.value}: already produced"


def test_dead_dependencies_are_named_before_unmet_ones() -> None:
    e = entry("a", depends_on=("p", "d1", "d2"))
    deps = lookup(entry("p"), entry("d1", state=State.dead), entry("d2", state=State.dead))
    assert changes.why_not_claimable(e, NOW, deps) == "depends on dead entries: d1, d2"


def test_unmet_dependencies_are_named_with_their_state() -> None:
    e = entry("a", depends_on=("p", "q"))
    assert (
        changes.why_not_claimable(e, NOW, lookup(held("q")))
        == "waiting for dependencies: p (not declared), q (writing)"
    )


# -- claim ----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [State.pending, State.failed])
def test_claim_takes_the_entry_and_raises_its_epoch(state: State) -> None:
    other = entry("b")
    e = entry("a", state=state, epoch=4, retry_count=1, error="earlier")
    new, result = changes.claim(shard(e, other), "a", "ann", NOW, RULES, nothing)
    taken = updated(
        e, state=State.writing, owner="ann", epoch=5, lease_expires_at=at(130), claimed_at=NOW
    )
    assert new is not None
    assert new.entries == {"a": taken, "b": other}
    assert new.entries["b"] is other
    assert result == Claim(
        task_id="job", file_id="a", stage=STAGE, agent="ann", epoch=5, lease_expires_at=at(130)
    )


def test_claim_takes_over_an_expired_lease_counting_one_failure() -> None:
    e = held("a", owner="bob", epoch=3, lease=30, retry_count=1)
    new, result = changes.claim(shard(e), "a", "ann", at(33), RULES, nothing)
    assert new is not None
    assert new.entries["a"] == e.model_copy(
        update={
            "state": State.writing,
            "owner": "ann",
            "epoch": 4,
            "lease_expires_at": at(63),
            "retry_count": 2,
            "error": "lease of bob (epoch 3) expired",
            "updated_at": at(33),
            "claimed_at": at(33),
        }
    )
    assert result == Claim("job", "a", STAGE, "ann", 4, at(63))


def test_a_takeover_past_max_retries_writes_the_entry_dead_and_refuses() -> None:
    e = held("a", owner="bob", epoch=3, lease=30, retry_count=2)
    new, result = changes.claim(shard(e), "a", "ann", at(33), RULES, nothing)
    assert new is not None
    assert new.entries["a"] == e.model_copy(
        update={
            "state": State.dead,
            "retry_count": 3,
            "error": "lease of bob (epoch 3) expired",
            "owner": None,
            "lease_expires_at": None,
            "updated_at": at(33),
        }
    )
    assert isinstance(result, NotClaimable)
    assert (result.file_id, result.reason) == ("a", "state dead after 3 failures")
    assert str(result) == "'a' is not claimable: state dead after 3 failures"


def test_max_retries_counts_retries_not_attempts() -> None:
    rules = Rules(task_id="job", lease_seconds=30, max_retries=3)
    e = held("a", retry_count=2, lease=30)
    new, result = changes.claim(shard(e), "a", "ann", at(33), rules, nothing)
    assert isinstance(result, Claim)
    assert new is not None
    assert (new.entries["a"].state, new.entries["a"].retry_count) == (State.writing, 3)


def test_claim_refuses_what_is_not_claimable_with_the_reason() -> None:
    e = held("a", owner="bob", epoch=3, lease=30)
    with pytest.raises(
        NotClaimable,
        match=exactly(
            "'a' is not claimable: state writing: held by bob (epoch 3) "
            "until 2030-01-01T12:00:30+00:00 and 2 s after it (a margin for the store's clock)"
        ),
    ) as info:
        changes.claim(shard(e), "a", "ann", at(32), RULES, nothing)
    assert info.value.file_id == "a"


def test_claim_refuses_an_entry_waiting_for_a_dependency() -> None:
    e = entry("a", depends_on=("x",))
    with pytest.raises(
        NotClaimable, match=exactly("'a' is not claimable: waiting for dependencies: x (pending)")
    ):
        changes.claim(shard(e), "a", "ann", NOW, RULES, lookup(entry("x")))


def test_claim_uses_the_lease_length_of_the_rules() -> None:
    rules = Rules(task_id="other", lease_seconds=0.5, max_retries=0)
    _, result = changes.claim(shard(entry("a")), "a", "ann", T0, rules, nothing)
    assert result == Claim("other", "a", STAGE, "ann", 1, at(0.5))


# -- claim_any ------------------------------------------------------------------------------


def test_claim_any_takes_claimable_entries_in_declaration_order_up_to_the_limit() -> None:
    declared, _ = changes.declare(shard(), T0, [decl("z"), decl("b"), decl("m")])
    assert declared is not None
    new, claims = changes.claim_any(declared, "ann", 2, NOW, RULES, nothing)
    assert [(c.file_id, c.epoch, c.agent, c.lease_expires_at) for c in claims] == [
        ("z", 1, "ann", at(130)),
        ("b", 1, "ann", at(130)),
    ]
    assert new is not None
    assert new.entries["m"] is declared.entries["m"]
    assert [e.state for e in new.entries.values()] == [State.writing, State.writing, State.pending]


def test_claim_any_skips_what_is_not_claimable() -> None:
    skipped = [held("h", lease=200), ready("r"), entry("w", depends_on=("nope",))]
    e = entry("f", state=State.failed, epoch=2)
    new, claims = changes.claim_any(shard(*skipped, e), "ann", 5, NOW, RULES, nothing)
    assert claims == [Claim("job", "f", STAGE, "ann", 3, at(130))]
    assert new is not None
    assert all(new.entries[s.file_id] is s for s in skipped)


def test_claim_any_with_nothing_claimable_writes_nothing() -> None:
    assert changes.claim_any(
        shard(held("h", lease=200), ready("r")), "ann", 5, NOW, RULES, nothing
    ) == (
        None,
        [],
    )
    assert changes.claim_any(shard(), "ann", 5, NOW, RULES, nothing) == (None, [])


def test_claim_any_of_a_stage_takes_only_its_entries_from_a_shard_of_several() -> None:
    mixed = shard(entry("w1", stage="write"), entry("c1"), entry("w2", stage="write"))
    new, claims = changes.claim_any(mixed, "ann", 5, NOW, RULES, nothing, "write")
    assert [(c.file_id, c.stage) for c in claims] == [("w1", "write"), ("w2", "write")]
    assert new is not None and new.entries["c1"] is mixed.entries["c1"]
    _, every = changes.claim_any(mixed, "ann", 5, NOW, RULES, nothing)
    assert [c.file_id for c in every] == ["w1", "c1", "w2"]
    assert changes.claim_any(mixed, "ann", 5, NOW, RULES, nothing, "check") == (None, [])


def test_claim_any_with_a_limit_of_zero_takes_nothing() -> None:
    assert changes.claim_any(shard(entry("a")), "ann", 0, NOW, RULES, nothing) == (None, [])


def test_a_takeover_that_kills_is_written_but_is_no_claim_and_uses_no_slot() -> None:
    doomed = held("d", owner="bob", epoch=3, lease=30, retry_count=2)
    new, claims = changes.claim_any(shard(doomed, entry("a")), "ann", 1, at(40), RULES, nothing)
    assert claims == [Claim("job", "a", STAGE, "ann", 1, at(70))]
    assert new is not None
    assert new.entries["d"].state is State.dead
    assert (new.entries["d"].epoch, new.entries["d"].owner) == (3, None)


def test_claim_any_takes_over_expired_leases() -> None:
    e = held("a", owner="bob", epoch=3, lease=30)
    new, claims = changes.claim_any(shard(e), "ann", 1, at(40), RULES, nothing)
    assert claims == [Claim("job", "a", STAGE, "ann", 4, at(70))]
    assert new is not None
    assert (new.entries["a"].retry_count, new.entries["a"].error) == (
        1,
        "lease of bob (epoch 3) expired",
    )


# -- the holder's changes: fencing ----------------------------------------------------------


def lost(file_id: str, epoch: int, agent: str, now: str) -> str:
    return exactly(
        f"lease on {file_id!r} (epoch {epoch}, agent {agent}) is lost: the entry is now {now}. "
        "Stop working on it; claim it again if it is still wanted."
    )


HOLDER_CHANGES: dict[str, HolderChange] = {
    "renew": lambda sh, c: changes.renew(sh, c, NOW, RULES),
    "finish": lambda sh, c: changes.finish(sh, c, "k2", "c2", 7, NOW),
    "fail": lambda sh, c: changes.fail(sh, c, "boom", NOW, RULES),
}


@pytest.mark.parametrize("change", HOLDER_CHANGES.values(), ids=list(HOLDER_CHANGES))
def test_a_stale_epoch_is_fenced(change: HolderChange) -> None:
    e = held("a", owner="bob", epoch=4)
    with pytest.raises(LeaseLost, match=lost("a", 3, "bob", "writing at epoch 4, held by bob")):
        change(shard(e), claim_on(e, epoch=3))


@pytest.mark.parametrize("change", HOLDER_CHANGES.values(), ids=list(HOLDER_CHANGES))
def test_another_agent_at_the_same_epoch_is_fenced(change: HolderChange) -> None:
    e = held("a", owner="bob", epoch=4)
    with pytest.raises(LeaseLost, match=lost("a", 4, "eve", "writing at epoch 4, held by bob")):
        change(shard(e), claim_on(e, agent="eve"))


@pytest.mark.parametrize("change", HOLDER_CHANGES.values(), ids=list(HOLDER_CHANGES))
@pytest.mark.parametrize("state", [State.failed, State.dead, State.pending])
def test_a_claim_on_an_entry_no_longer_writing_is_fenced(
    change: HolderChange, state: State
) -> None:
    e = entry("a", state=state, owner="bob", epoch=4)
    with pytest.raises(LeaseLost, match=lost("a", 4, "bob", f"{state.value} at epoch 4")):
        change(shard(e), claim_on(e))


def test_an_expired_lease_is_still_its_holders_until_taken_over() -> None:
    e = held("a", owner="bob", epoch=3, lease=30)
    new, claim = changes.renew(shard(e), claim_on(e), at(1000), RULES)
    assert claim.lease_expires_at == at(1030)
    assert new.entries["a"].state is State.writing


# -- renew ----------------------------------------------------------------------------------


def test_renew_moves_the_lease_to_now_plus_the_lease_length() -> None:
    e = held("a", owner="bob", epoch=3, lease=30)
    other = entry("b")
    new, claim = changes.renew(shard(e, other), claim_on(e), at(20), RULES)
    assert new.entries == {
        "a": e.model_copy(update={"lease_expires_at": at(50), "updated_at": at(20)}),
        "b": other,
    }
    assert claim == Claim("job", "a", STAGE, "bob", 3, at(50))


def test_renew_never_moves_a_lease_backwards() -> None:
    e = held("a", owner="bob", epoch=3, lease=500)
    new, claim = changes.renew(shard(e), claim_on(e), at(20), RULES)
    assert claim.lease_expires_at == at(500)
    assert new.entries["a"] == e.model_copy(update={"updated_at": at(20)})


def test_renew_gives_a_lease_to_a_holder_that_has_none() -> None:
    e = entry("a", state=State.writing, owner="bob", epoch=3)
    new, claim = changes.renew(shard(e), claim_on(e), at(20), RULES)
    assert claim.lease_expires_at == at(50)
    assert new.entries["a"].lease_expires_at == at(50)


# -- finish ---------------------------------------------------------------------------------


def test_finish_makes_the_entry_ready_with_its_data() -> None:
    e = held("a", owner="bob", epoch=3, retry_count=1, error="lease of x (epoch 2) expired")
    other = entry("b")
    new, result = changes.finish(shard(e, other), claim_on(e), "k", "c", 5, NOW)
    expected = updated(
        e,
        state=State.ready,
        key="k",
        checksum="c",
        size=5,
        lease_expires_at=None,
        error=None,
        ready_at=NOW,
    )
    assert result == expected
    assert new is not None
    assert new.entries == {"a": expected, "b": other}
    assert (result.owner, result.epoch, result.retry_count) == ("bob", 3, 1)
    assert not result.is_chunked


def test_finish_records_a_chunked_entry_parts() -> None:
    e = held("a")
    _, result = changes.finish(
        shard(e),
        claim_on(e),
        "k",
        "c",
        50,
        NOW,
        part_size=16,
        parts_key="up/a.json",
        whole_checksum="w",
    )
    assert (result.part_size, result.parts_key, result.is_chunked) == (16, "up/a.json", True)
    assert result.whole_checksum == "w"


def test_finish_as_one_object_clears_the_parts_of_an_earlier_chunked_attempt() -> None:
    e = held("a", part_size=16, parts_key="up/a.json", whole_checksum="w")
    _, result = changes.finish(shard(e), claim_on(e), "k", "c", 5, NOW)
    assert (result.part_size, result.parts_key, result.whole_checksum) == (None, None, None)


@pytest.mark.parametrize("state", [State.ready, State.consumed])
def test_finishing_again_with_the_same_data_is_a_no_op(state: State) -> None:
    e = held("a", epoch=3)
    done = e.model_copy(
        update={
            "state": state,
            "key": "k",
            "checksum": "c",
            "size": 50,
            "part_size": 16,
            "parts_key": "p",
            "whole_checksum": "w",
            "lease_expires_at": None,
        }
    )
    new, result = changes.finish(
        shard(done), claim_on(e), "k", "c", 50, NOW, part_size=16, parts_key="p", whole_checksum="w"
    )
    assert new is None
    assert result is done


@pytest.mark.parametrize(
    "data",
    [
        ("k2", "c", 50, 16, "p", "w"),
        ("k", "c2", 50, 16, "p", "w"),
        ("k", "c", 51, 16, "p", "w"),
        ("k", "c", 50, 17, "p", "w"),
        ("k", "c", 50, 16, "p2", "w"),
        ("k", "c", 50, 16, "p", "w2"),
        ("k", "c", 50, 16, "p", None),
        ("k", "c", 50, None, None, None),
    ],
)
def test_finishing_a_ready_entry_with_other_data_is_fenced(data: Data) -> None:
    e = ready("a", key="k", checksum="c", epoch=3, owner="bob")
    e = e.model_copy(update={"size": 50, "part_size": 16, "parts_key": "p", "whole_checksum": "w"})
    key, checksum, size, part_size, parts_key, whole = data
    with pytest.raises(LeaseLost, match=lost("a", 3, "bob", "ready at epoch 3")):
        changes.finish(
            shard(e),
            claim_on(e),
            key,
            checksum,
            size,
            NOW,
            part_size=part_size,
            parts_key=parts_key,
            whole_checksum=whole,
        )


def test_a_fenced_holder_cannot_finish_an_entry_another_holder_made_ready() -> None:
    e = ready("a", key="k", checksum="c", epoch=4, owner="ann")
    with pytest.raises(LeaseLost, match=lost("a", 3, "bob", "ready at epoch 4")):
        changes.finish(shard(e), claim_on(e, agent="bob", epoch=3), "k", "c", 5, NOW)


# -- fail -----------------------------------------------------------------------------------


def test_fail_releases_the_entry_counting_one_retry() -> None:
    e = held("a", owner="bob", epoch=3, retry_count=1, key="old", checksum="oc")
    other = entry("b")
    new, result = changes.fail(shard(e, other), claim_on(e), "disk full", NOW, RULES)
    expected = updated(
        e,
        state=State.failed,
        retry_count=2,
        error="disk full",
        owner=None,
        lease_expires_at=None,
    )
    assert result == expected
    assert new.entries == {"a": expected, "b": other}
    assert (result.epoch, result.key, result.checksum) == (3, "old", "oc")


def test_fail_past_max_retries_is_dead() -> None:
    e = held("a", retry_count=2)
    _, result = changes.fail(shard(e), claim_on(e), "again", NOW, RULES)
    assert (result.state, result.retry_count, result.error, result.owner) == (
        State.dead,
        3,
        "again",
        None,
    )


# -- check_consumable and consume -----------------------------------------------------------


def test_check_consumable_of_a_ready_entry_not_read_before() -> None:
    assert changes.check_consumable(ready("a", consumed_by=("r1",)), "r2") is False


@pytest.mark.parametrize("state", [State.ready, State.consumed])
def test_check_consumable_lets_a_consumer_read_again(state: State) -> None:
    e = entry("a", state=state, consumed_by=("r1", "r2"))
    assert changes.check_consumable(e, "r2") is True


def test_check_consumable_refuses_a_consumed_entry_to_the_others() -> None:
    e = entry("a", state=State.consumed, consumed_by=("w1", "w2"))
    with pytest.raises(AlreadyConsumed, match=exactly("'a' was already consumed by w1, w2")):
        changes.check_consumable(e, "w3")


@pytest.mark.parametrize("state", [State.pending, State.writing, State.failed, State.dead])
def test_check_consumable_refuses_an_entry_that_is_not_ready(state: State) -> None:
    e = entry("a", state=state)
    with pytest.raises(NotReady, match=exactly(f"'a' is {state.value}, not ready")):
        changes.check_consumable(e, "r")


def test_not_ready_names_the_last_error() -> None:
    e = entry("a", state=State.failed, error="checksum mismatch", consumed_by=("r",))
    with pytest.raises(
        NotReady, match=exactly("'a' is failed, not ready (last error: checksum mismatch)")
    ):
        changes.check_consumable(e, "r")


def test_check_consumable_refuses_data_gc_removed_even_to_a_consumer_that_read_it() -> None:
    e = entry("a", state=State.consumed, consumed_by=("r",), checksum="c0", data_removed_at=at(5))
    with pytest.raises(
        DataRemoved,
        match=exactly(
            f"'a' was consumed and its data was removed by gc at {at(5).isoformat()} (after "
            "its retention); its checksum c0 and history stay, produce it again under a new "
            "id if needed"
        ),
    ):
        changes.check_consumable(e, "r")


def test_consume_of_a_queue_entry_takes_it() -> None:
    e = ready("a", key="k", checksum="c")
    other = entry("b")
    new, result = changes.consume(shard(e, other), "a", "w1", "k", "c", NOW)
    expected = updated(e, state=State.consumed, consumed_by=("w1",))
    assert result == expected
    assert new is not None
    assert new.entries == {"a": expected, "b": other}


def test_consume_of_a_broadcast_entry_waits_for_every_role() -> None:
    e = ready("a", key="k", checksum="c", consumers=("r1", "r2"))
    first, marked = changes.consume(shard(e), "a", "r2", "k", "c", at(1))
    assert marked == e.model_copy(update={"consumed_by": ("r2",), "updated_at": at(1)})
    assert first is not None
    second, done = changes.consume(first, "a", "r1", "k", "c", at(2))
    assert done == e.model_copy(
        update={"state": State.consumed, "consumed_by": ("r2", "r1"), "updated_at": at(2)}
    )
    assert second is not None and second.entries["a"] == done


def test_a_mark_by_a_role_that_is_not_a_consumer_completes_nothing() -> None:
    e = ready("a", key="k", checksum="c", consumers=("r1",))
    _, marked = changes.consume(shard(e), "a", "x", "k", "c", NOW)
    assert (marked.state, marked.consumed_by) == (State.ready, ("x",))


def test_consuming_again_writes_nothing() -> None:
    e = ready("a", key="k", checksum="c", consumers=("r1", "r2"), consumed_by=("r1",))
    new, result = changes.consume(shard(e), "a", "r1", "k", "c", NOW)
    assert new is None
    assert result is e


@pytest.mark.parametrize(("key", "checksum"), [("k2", "c"), ("k", "c2")])
def test_consume_refuses_data_that_was_produced_again(key: str, checksum: str) -> None:
    e = ready("a", key="k", checksum="c")
    with pytest.raises(DataChanged, match=exactly("a")):
        changes.consume(shard(e), "a", "w1", key, checksum, NOW)


def test_consume_refuses_a_queue_entry_another_agent_took() -> None:
    e = entry("a", state=State.consumed, key="k", checksum="c", consumed_by=("w1",))
    with pytest.raises(AlreadyConsumed, match=exactly("'a' was already consumed by w1")):
        changes.consume(shard(e), "a", "w2", "k", "c", NOW)


# -- mismatch -------------------------------------------------------------------------------


def test_mismatch_sends_the_entry_back_to_be_produced_with_no_data_left() -> None:
    e = ready(
        "a",
        key="k",
        checksum="c",
        epoch=3,
        owner="bob",
        retry_count=1,
        consumers=("r1", "r2"),
        consumed_by=("r1",),
        part_size=16,
        parts_key="p",
    )
    other = entry("b")
    new, result = changes.mismatch(shard(e, other), "a", "k", "c", "part 2 differs", NOW, RULES)
    expected = updated(
        e,
        state=State.failed,
        retry_count=2,
        error="part 2 differs",
        key=None,
        checksum=None,
        size=None,
        part_size=None,
        parts_key=None,
        consumed_by=(),
        lease_expires_at=None,
    )
    assert result == expected
    assert new is not None
    assert new.entries == {"a": expected, "b": other}
    assert (result.epoch, result.owner, result.consumers) == (3, "bob", ("r1", "r2"))


def test_mismatch_past_max_retries_is_dead() -> None:
    e = ready("a", key="k", checksum="c", retry_count=2)
    _, result = changes.mismatch(shard(e), "a", "k", "c", "bad", NOW, RULES)
    assert (result.state, result.retry_count, result.key) == (State.dead, 3, None)


@pytest.mark.parametrize(
    "e",
    [
        ready("a", key="k2", checksum="c"),
        ready("a", key="k", checksum="c2"),
        entry("a", state=State.failed, key="k", checksum="c"),
        entry("a", state=State.consumed, key="k", checksum="c"),
        held("a", key="k", checksum="c"),
    ],
    ids=["other-key", "other-checksum", "failed", "consumed", "writing"],
)
def test_a_mismatch_already_handled_or_on_newer_data_writes_nothing(e: Entry) -> None:
    new, result = changes.mismatch(shard(e), "a", "k", "c", "bad", NOW, RULES)
    assert new is None
    assert result is e


# -- reap -----------------------------------------------------------------------------------


def test_reap_releases_only_leases_more_than_two_seconds_past_their_end() -> None:
    gone = held("g", owner="bob", epoch=3, lease=30, retry_count=0)
    edge = held("e", owner="cat", epoch=1, lease=31)
    others = [entry("p"), ready("r"), entry("f", state=State.failed)]
    before = shard(gone, edge, *others)
    new, released = changes.reap(before, at(33), RULES)
    expected = gone.model_copy(
        update={
            "state": State.failed,
            "retry_count": 1,
            "error": "lease of bob (epoch 3) expired",
            "owner": None,
            "lease_expires_at": None,
            "updated_at": at(33),
        }
    )
    assert released == [expected]
    assert new is not None
    assert new.entries["g"] == expected
    assert new.entries["e"] is edge
    assert all(new.entries[o.file_id] is o for o in others)


def test_reap_looks_past_leases_that_are_still_good() -> None:
    good = held("g", lease=500)
    gone = held("x", lease=10)
    new, released = changes.reap(shard(good, entry("p"), gone), at(100), RULES)
    assert [e.file_id for e in released] == ["x"]
    assert new is not None
    assert (new.entries["g"], new.entries["x"].state) == (good, State.failed)


def test_reap_past_max_retries_is_dead_and_keeps_the_order_of_the_shard() -> None:
    a = held("a", owner="bob", epoch=3, lease=10, retry_count=2)
    b = held("b", owner="cat", epoch=5, lease=20)
    _, released = changes.reap(shard(a, b), at(100), RULES)
    assert [(e.file_id, e.state, e.retry_count, e.epoch) for e in released] == [
        ("a", State.dead, 3, 3),
        ("b", State.failed, 1, 5),
    ]
    assert released[1].error == "lease of cat (epoch 5) expired"


def test_reap_with_nothing_expired_writes_nothing() -> None:
    assert changes.reap(shard(held("a", lease=30), ready("r")), at(32), RULES) == (None, [])


# -- drop_data (gc) -------------------------------------------------------------------------


def consumed(file_id: str, **fields: object) -> Entry:
    """A consumed entry whose data is at ``k-FILE_ID``, last changed at ``T0``."""
    e = ready(file_id, key=f"k-{file_id}", consumed_by=("r",))
    return e.model_copy(update={"state": State.consumed, **fields})


def test_drop_data_marks_consumed_entries_at_the_key_gc_saw_changed_at_or_before_the_cut() -> None:
    skipped = [
        ready("ready", key="k-ready"),  # not consumed
        consumed("moved", key="k-elsewhere"),  # gc saw another key
        consumed("removed", data_removed_at=at(5)),  # already marked
        consumed("unstamped", updated_at=None),
        consumed("recent", updated_at=at(11)),  # changed after the cut
    ]
    old, exact = consumed("old", updated_at=at(3)), consumed("exact", updated_at=at(10))
    untouched = consumed("untouched")  # not wanted
    before = shard(*skipped, old, exact, untouched)
    wanted = {"missing": "k-missing", **{e.file_id: f"k-{e.file_id}" for e in skipped}}
    wanted |= {"old": "k-old", "exact": "k-exact"}

    new, marked = changes.drop_data(before, wanted, at(10), NOW)

    want = [e.model_copy(update={"data_removed_at": NOW}) for e in (old, exact)]
    assert marked == want  # only the mark changes: updated_at stays the last real change
    assert new == before.with_entries({e.file_id: e for e in want})
    assert list(new.entries) == list(before.entries)


def test_drop_data_with_nothing_to_mark_writes_nothing() -> None:
    before = shard(consumed("recent", updated_at=at(11)))
    assert changes.drop_data(before, {"recent": "k-recent"}, at(10), NOW) == (None, [])
    assert changes.drop_data(before, {}, at(10), NOW) == (None, [])


def test_drop_archived_data_marks_archived_consumed_entries_once() -> None:
    refs = {
        "done": Archived(state=State.consumed, archive="A1", declared="d"),
        "dead": Archived(state=State.dead, archive="A1", declared="d"),
        "gone": Archived(state=State.consumed, archive="A1", declared="d", data_removed_at=at(5)),
        "other": Archived(state=State.consumed, archive="A2", declared="d"),
    }
    before = shard(consumed("live")).model_copy(update={"archived": refs})
    new, marked = changes.drop_archived_data(before, ["done", "dead", "gone", "live", "x"], NOW)
    assert marked == ["done"]
    assert new is not None and new.entries == before.entries
    assert new.archived == {
        **refs,
        "done": refs["done"].model_copy(update={"data_removed_at": NOW}),
    }
    # Each reason to pass an id over, ahead of the one marked: the rest are still looked at.
    for skipped in ("x", "dead", "gone"):
        assert changes.drop_archived_data(before, [skipped, "done"], NOW) == (new, ["done"])
    assert changes.drop_archived_data(before, ["dead", "gone"], NOW) == (None, [])
    assert changes.drop_archived_data(shard(consumed("live")), ["live"], NOW) == (None, [])
    command = commands.DropArchivedData(("done",))
    assert (command.name, command.actor) == ("drop-data", "gc")
    assert command.apply(before, NOW) == (new, ["done"])


# -- archive and archived ids -----------------------------------------------------------------


def dead(file_id: str, **fields: object) -> Entry:
    return entry(file_id, state=State.dead, error="boom", **fields)


def ref(e: Entry, archive: str = "A1") -> Archived:
    declared = declaration_digest(e.stage, e.depends_on, e.consumers)
    return Archived(state=e.state, archive=archive, declared=declared)


def test_archive_moves_out_terminal_entries_the_shard_holds_exactly_as_archived() -> None:
    gone = consumed("gone", depends_on=("x",), consumers=("r",))
    died = dead("died")
    changed = consumed("changed")  # changed since the archive object was written
    live = ready("live")  # not terminal (written to the archive object by mistake)
    pending = entry("pending")
    earlier = Archived(state=State.dead, archive="A0", declared="d0")
    before = shard(died, changed, live, pending, gone).model_copy(
        update={"archived": {"old": earlier}}
    )
    copies = {
        "gone": gone,
        "died": died,
        "changed": changed.model_copy(update={"updated_at": at(-5)}),
        "live": live,
        "absent": consumed("absent"),
    }

    new, moved = changes.archive(before, "A1", copies)

    assert moved == ["died", "gone"]
    assert new is not None
    assert new.entries == {"changed": changed, "live": live, "pending": pending}
    assert list(new.entries) == ["changed", "live", "pending"]
    assert new.archived == {"old": earlier, "died": ref(died), "gone": ref(gone)}
    assert new.archived["gone"].declared == declaration_digest("s", ["x"], ["r"])
    assert (new.task_id, new.stage, new.version) == (before.task_id, before.stage, before.version)


def test_archive_starts_the_archived_map_of_a_shard_that_has_none() -> None:
    gone = consumed("gone")
    new, moved = changes.archive(shard(gone), "A1", {"gone": gone})
    assert new is not None and moved == ["gone"]
    assert (new.entries, new.archived) == ({}, {"gone": ref(gone)})


def test_archive_with_nothing_still_as_archived_writes_nothing() -> None:
    e = consumed("e")
    before = shard(e)
    stale = {"e": e.model_copy(update={"updated_at": at(-5)})}
    assert changes.archive(before, "A1", stale) == (None, [])
    assert changes.archive(before, "A1", {}) == (None, [])


def test_an_archived_id_declared_again_the_same_is_a_no_op_returning_its_stub() -> None:
    gone = consumed("gone", depends_on=("x",), consumers=("r", "q"))
    before = shard(entry("b")).model_copy(update={"archived": {"gone": ref(gone)}})
    decl = Declaration(file_id="gone", stage=STAGE, depends_on=("x",), consumers=("q", "r"))
    new, result = changes.declare(before, NOW, [decl, Declaration(file_id="c", stage=STAGE)])
    stub = Entry(file_id="gone", stage=STAGE, state=State.consumed)
    assert result == [stub, entry("c", declared_at=NOW, updated_at=NOW)]
    assert new is not None and list(new.entries) == ["b", "c"]  # the stub is not added back
    assert changes.declare(before, NOW, [decl]) == (None, [stub])
    assert changes.archived_stub("gone", "t", ref(gone)) == Entry(
        file_id="gone", stage="t", state=State.consumed
    )


def test_an_archived_id_declared_differently_is_a_conflict_naming_its_archive() -> None:
    died = dead("died")
    before = shard().model_copy(update={"archived": {"died": ref(died, "A7")}})
    with pytest.raises(
        DeclarationConflict,
        match=exactly(
            "'died' is already declared differently: it was archived as dead (archive A7) "
            "with other stage, dependencies or consumers. Declare it as before, or use a new "
            "file id."
        ),
    ):
        changes.declare(before, NOW, [Declaration(file_id="died", stage=STAGE, consumers=("r",))])


def test_a_model_replaced_is_the_copy_model_copy_makes_extra_fields_kept() -> None:
    """``replaced`` (the one-step copy commits use) makes what ``model_copy(update=...)``
    does: the same fields, the same set of fields given, the extra fields a newer release
    wrote (copied, not shared), and a name the model does not declare among them."""
    old = Entry.model_validate(
        {"file_id": "a", "stage": STAGE, "epoch": 2, "from_a_newer_release": {"x": 1}}
    )
    for changed in ({"epoch": 3, "owner": "w"}, {"epoch": 3, "not_declared": "v"}, {}):
        new, expected = old.replaced(**changed), old.model_copy(update=changed)
        assert type(new) is Entry and new is not old
        assert new == expected
        assert new.model_dump_json() == expected.model_dump_json()
        assert new.model_fields_set == expected.model_fields_set
        assert new.model_extra == expected.model_extra
        assert new.model_extra is not old.model_extra
    assert old.epoch == 2 and old.model_extra == {"from_a_newer_release": {"x": 1}}
    shard_before = shard(entry("a"))
    renamed = shard_before.replaced(entries={}, version=7)
    assert (renamed.entries, renamed.version, shard_before.entries.keys()) == ({}, 7, {"a"})


def test_an_entry_not_ready_is_refused_with_the_state_it_is_in() -> None:
    with pytest.raises(NotReady) as writing:
        changes.check_consumable(held(), "c")
    assert writing.value.state == "writing"
    with pytest.raises(NotReady) as pending:
        changes.check_consumable(entry(), "c")
    assert pending.value.state == "pending"
