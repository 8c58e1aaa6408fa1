"""The named commands: each carries its change, its name and its actor, and applies exactly
the pure change it names, with its own arguments."""

from __future__ import annotations

from typing import Any

import pytest

from objmanifest.core import changes, commands
from objmanifest.core.model import Claim, Declaration, Shard, Stored
from objmanifest.core.states import State
from objmanifest.errors import LeaseLost

from ..make import RULES, at, claim_on, entry, exactly, held, lookup, ready, shard

NOW = at(100)


def same(got: tuple[Any, Any], want: tuple[Any, Any]) -> None:
    """A command's outcome equals the pure change's (new shard, result)."""
    assert got == want
    assert got[0] is not None or want[0] is None


def test_declare() -> None:
    decls = [Declaration(file_id="a", stage="s"), Declaration(file_id="b", stage="s")]
    command = commands.Declare(decls)
    assert (command.name, command.actor) == ("declare", "")
    same(command.apply(shard(), NOW), changes.declare(shard(), NOW, decls))
    assert commands.Declare(decls, actor="cli").actor == "cli"


def test_claim_entry() -> None:
    before = shard(entry("a"), held("b", lease=10))
    deps = lookup()
    command = commands.ClaimEntry("a", "ann", RULES, lambda doc: deps)
    assert (command.name, command.actor) == ("claim", "ann")
    new, result = command.apply(before, NOW)
    same((new, result), changes.claim(before, "a", "ann", NOW, RULES, deps))
    assert isinstance(result, Claim) and (result.agent, result.epoch) == ("ann", 1)


def test_claim_entry_hands_its_lookups_the_version_it_changes() -> None:
    seen: list[Shard] = []
    before = shard(entry("a"))

    def lookups(doc: Shard) -> changes.Lookup:
        seen.append(doc)
        return doc.entries.get

    commands.ClaimEntry("a", "ann", RULES, lookups).apply(before, NOW)
    commands.ClaimAny("ann", 1, RULES, lookups).apply(before, NOW)
    assert seen == [before, before]


def test_claim_any() -> None:
    before = shard(entry("a"), entry("b"), entry("c"))
    command = commands.ClaimAny("ann", 2, RULES, lambda doc: doc.entries.get)
    assert (command.name, command.actor) == ("claim_many", "ann")
    new, claims = command.apply(before, NOW)
    same((new, claims), changes.claim_any(before, "ann", 2, NOW, RULES, before.entries.get))
    assert [c.file_id for c in claims] == ["a", "b"]
    mixed = shard(
        entry("a", state=State.ready), entry("c"), entry("w", stage="write", depends_on=("a",))
    )
    only = commands.ClaimAny("ann", 2, RULES, lambda doc: doc.entries.get, "write")
    assert [c.file_id for c in only.apply(mixed, NOW)[1]] == ["w"]  # its dependency, looked up
    waiting = shard(ready("r"), entry("d", depends_on=("r",)), entry("e", depends_on=("x",)))
    checked = commands.ClaimAny("ann", 5, RULES, lambda doc: doc.entries.get)
    assert [c.file_id for c in checked.apply(waiting, NOW)[1]] == ["d"]  # its lookup decides
    both = shard(entry("p"), entry("w", stage="write"))
    assert [c.file_id for c in only.apply(both, NOW)[1]] == ["w"]  # the other stage's left


def test_renew() -> None:
    e = held("a", owner="bob", epoch=3, lease=10)
    claim = claim_on(e)
    command = commands.Renew(claim, RULES)
    assert (command.name, command.actor) == ("renew", "bob")
    new, renewed = command.apply(shard(e), NOW)
    same((new, renewed), changes.renew(shard(e), claim, NOW, RULES))
    assert renewed.lease_expires_at == at(130)


@pytest.mark.parametrize("chunked", [False, True])
def test_finish(chunked: bool) -> None:
    e = held("a", owner="bob", epoch=3)
    claim = claim_on(e)
    stored = Stored(
        "k@3",
        "xxh3-128:00",
        5,
        16 if chunked else None,
        "p" if chunked else None,
        "xxh3-128:11" if chunked else None,
    )
    command = commands.Finish(claim, stored)
    assert (command.name, command.actor) == ("finish", "bob")
    new, done = command.apply(shard(e), NOW)
    want = changes.finish(
        shard(e),
        claim,
        "k@3",
        "xxh3-128:00",
        5,
        NOW,
        part_size=stored.part_size,
        parts_key=stored.parts_key,
        whole_checksum=stored.whole_checksum,
    )
    same((new, done), want)
    assert (done.state, done.key, done.part_size, done.parts_key, done.updated_at) == (
        State.ready,
        "k@3",
        stored.part_size,
        stored.parts_key,
        NOW,
    )
    assert done.whole_checksum == stored.whole_checksum


def test_fail() -> None:
    e = held("a", owner="bob", epoch=3)
    claim = claim_on(e)
    command = commands.Fail(claim, "no disk", RULES)
    assert (command.name, command.actor) == ("fail", "bob")
    new, failed = command.apply(shard(e), NOW)
    same((new, failed), changes.fail(shard(e), claim, "no disk", NOW, RULES))
    assert (failed.state, failed.error) == (State.failed, "no disk")


def test_fail_of_a_stale_claim_is_refused() -> None:
    e = held("a", owner="bob", epoch=3)
    with pytest.raises(
        LeaseLost,
        match=exactly(
            "lease on 'a' (epoch 2, agent bob) is lost: the entry is now writing at epoch 3, "
            "held by bob. Stop working on it; claim it again if it is still wanted."
        ),
    ):
        commands.Fail(claim_on(e, epoch=2), "late", RULES).apply(shard(e), NOW)


def test_consume() -> None:
    e = ready("a", key="k", checksum="c")
    command = commands.Consume("a", "reader", "k", "c", actor="reader-1")
    assert (command.name, command.actor) == ("consume", "reader-1")
    new, marked = command.apply(shard(e), NOW)
    same((new, marked), changes.consume(shard(e), "a", "reader", "k", "c", NOW))
    assert (marked.state, marked.consumed_by) == (State.consumed, ("reader",))


def test_mismatch() -> None:
    e = ready("a", key="k", checksum="c", retry_count=0)
    command = commands.Mismatch("a", "k", "c", "part 1 differs", RULES, actor="reader")
    assert (command.name, command.actor) == ("mismatch", "reader")
    new, failed = command.apply(shard(e), NOW)
    same((new, failed), changes.mismatch(shard(e), "a", "k", "c", "part 1 differs", NOW, RULES))
    assert (failed.state, failed.error, failed.key, failed.updated_at) == (
        State.failed,
        "part 1 differs",
        None,
        NOW,
    )


def test_reap() -> None:
    before = shard(held("a", lease=10), held("b", lease=500))
    command = commands.Reap(RULES)
    assert (command.name, command.actor) == ("reap", "")
    new, released = command.apply(before, NOW)
    same((new, released), changes.reap(before, NOW, RULES))
    assert [(r.file_id, r.state, r.updated_at) for r in released] == [("a", State.failed, NOW)]
    assert commands.Reap(RULES, actor="janitor").actor == "janitor"


def test_a_claim_names_the_shard_its_entry_lives_in() -> None:
    """Not the entry's stage: a stage split into partitions has shards of other names."""
    part = Shard(task_id="job", stage="s.part-3", entries={"a": entry("a")})
    _, claim = changes.claim(part, "a", "ann", NOW, RULES, lookup())
    assert isinstance(claim, Claim) and (claim.stage, claim.shard) == ("s", "s.part-3")
    _, many = changes.claim_any(part, "ann", 1, NOW, RULES, lookup())
    assert [(c.stage, c.shard) for c in many] == [("s", "s.part-3")]
    renewed = changes.renew(
        part.with_entries({"a": held("a", owner="ann", epoch=1)}), claim, NOW, RULES
    )[1]
    assert renewed.shard == "s.part-3"


def test_drop_data() -> None:
    gone = ready("a", key="k").model_copy(update={"state": State.consumed})
    before = shard(gone, entry("b"))
    command = commands.DropData({"a": "k"}, at(10))
    assert (command.name, command.actor) == ("drop-data", "gc")
    new, marked = command.apply(before, NOW)
    same((new, marked), changes.drop_data(before, {"a": "k"}, at(10), NOW))
    assert [e.data_removed_at for e in marked] == [NOW]
    assert commands.DropData({}, at(10), actor="cli").actor == "cli"


def test_archive() -> None:
    gone = ready("a", key="k").model_copy(update={"state": State.consumed})
    before = shard(gone, entry("b"))
    command = commands.Archive("A1", {"a": gone})
    assert (command.name, command.actor) == ("archive", "")
    new, moved = command.apply(before, NOW)
    same((new, moved), changes.archive(before, "A1", {"a": gone}))
    assert moved == ["a"] and new is not None and new.archived is not None
    assert new.archived["a"].archive == "A1"
    assert commands.Archive("A1", {}, actor="cli").actor == "cli"
