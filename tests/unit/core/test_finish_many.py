"""``changes.finish_many`` and ``FinishMany``: several holders' data made ready in one new
shard, each claim on its own (``put_many``'s one commit per shard)."""

from __future__ import annotations

import pytest

from objmanifest.core import changes, commands
from objmanifest.core.model import Claim, Entry, Stored
from objmanifest.errors import InvalidInput, LeaseLost, NotFound

from ..make import at, claim_on, entry, exactly, held, ready, shard

NOW = at(100)


def data(file_id: str, epoch: int = 3, chunked: bool = False) -> Stored:
    return Stored(
        f"k/{file_id}@{epoch}",
        f"xxh3-128:{file_id}",
        len(file_id) + 10,
        16 if chunked else None,
        f"up/{file_id}.json" if chunked else None,
    )


def made_ready(e: Entry, stored: Stored) -> Entry:
    """``e`` as ``finish`` makes it of ``stored`` at ``NOW``."""
    return e.model_copy(
        update={
            "state": "ready",
            "key": stored.key,
            "checksum": stored.checksum,
            "size": stored.size,
            "part_size": stored.part_size,
            "parts_key": stored.parts_key,
            "lease_expires_at": None,
            "error": None,
            "updated_at": NOW,
            "ready_at": NOW,
        }
    )


def lost(file_id: str, epoch: int, agent: str, now: str) -> str:
    return exactly(
        f"lease on {file_id!r} (epoch {epoch}, agent {agent}) is lost: the entry is now {now}. "
        "Stop working on it; claim it again if it is still wanted."
    )


def test_every_entry_becomes_ready_in_one_shard_and_nothing_else_changes() -> None:
    a = held("a", owner="bob", epoch=3, retry_count=1, error="lease of x (epoch 2) expired")
    b = held("b", owner="bob", epoch=1)
    c = held("c", owner="bob", epoch=2, part_size=16, parts_key="up/c.json")
    other = held("o", owner="ann", epoch=5)
    before = shard(a, other, b, c)
    finished = [
        (claim_on(b), data("b", 1)),
        (claim_on(a), data("a", 3, chunked=True)),
        (claim_on(c), data("c", 2)),
    ]
    new, results = changes.finish_many(before, finished, NOW)
    want = [
        made_ready(b, data("b", 1)),
        made_ready(a, data("a", 3, chunked=True)),
        made_ready(c, data("c", 2)),
    ]
    assert results == want
    assert new is not None
    assert new.entries == {"a": want[1], "o": other, "b": want[0], "c": want[2]}
    assert list(new.entries) == ["a", "o", "b", "c"]
    assert (want[1].part_size, want[1].parts_key) == (16, "up/a.json")
    assert (want[2].part_size, want[2].parts_key) == (None, None)
    assert (want[1].retry_count, want[1].owner, want[1].epoch) == (1, "bob", 3)
    assert before.entries["a"] == a, "the shard it was given is left as it was"
    # Each result is what finish makes of that claim alone.
    for (claim, stored), got in zip(finished, results, strict=True):
        _, alone = changes.finish(
            before,
            claim,
            stored.key,
            stored.checksum,
            stored.size,
            NOW,
            part_size=stored.part_size,
            parts_key=stored.parts_key,
        )
        assert got == alone


def test_a_fenced_claim_gets_lease_lost_in_its_place_and_the_others_still_become_ready() -> None:
    fenced = held("f", owner="bob", epoch=4)  # taken over: bob's claim was at epoch 3
    gone = entry("g", state="failed", owner=None, epoch=2)  # reaped
    x, y = held("x", owner="bob", epoch=1), held("y", owner="bob", epoch=1)
    before = shard(fenced, x, gone, y)
    new, results = changes.finish_many(
        before,
        [
            (claim_on(fenced, epoch=3), data("f")),
            (claim_on(x), data("x", 1)),
            (claim_on(gone, agent="bob"), data("g", 2)),
            (claim_on(y), data("y", 1)),
        ],
        NOW,
    )
    assert isinstance(results[0], LeaseLost)
    with pytest.raises(LeaseLost, match=lost("f", 3, "bob", "writing at epoch 4, held by bob")):
        raise results[0]
    assert isinstance(results[2], LeaseLost)
    with pytest.raises(LeaseLost, match=lost("g", 2, "bob", "failed at epoch 2")):
        raise results[2]
    assert results[1] == made_ready(x, data("x", 1))
    assert results[3] == made_ready(y, data("y", 1))
    assert new is not None
    assert new.entries == {"f": fenced, "x": results[1], "g": gone, "y": results[3]}


def test_a_claim_on_an_entry_the_shard_lacks_gets_not_found() -> None:
    x = held("x", owner="bob", epoch=1)
    stray = Claim("job", "zz", "s", "bob", 1, at(30))
    new, results = changes.finish_many(
        shard(x), [(stray, data("zz", 1)), (claim_on(x), data("x", 1))], NOW
    )
    assert isinstance(results[0], NotFound)
    assert str(results[0]) == "'zz' is not declared in shard 's'"
    assert results[1] == made_ready(x, data("x", 1))
    assert new is not None and new.entries == {"x": results[1]}


def test_nothing_to_write_when_every_claim_is_refused() -> None:
    a, b = held("a", owner="ann", epoch=2), held("b", owner="bob", epoch=5)
    new, results = changes.finish_many(
        shard(a, b),
        [(claim_on(a, agent="bob"), data("a", 2)), (claim_on(b, epoch=4), data("b"))],
        NOW,
    )
    assert new is None
    assert [type(r) for r in results] == [LeaseLost, LeaseLost]


def test_repeating_a_finish_that_landed_changes_nothing_and_returns_the_entry() -> None:
    done = ready("a", key="k/a@3", checksum="xxh3-128:a", epoch=3, owner="bob")
    done = done.model_copy(update={"size": 11})
    claim = Claim("job", "a", "s", "bob", 3, at(30))
    new, results = changes.finish_many(shard(done), [(claim, data("a", 3))], NOW)
    assert new is None
    assert results == [done] and results[0] is done


def test_a_repeat_beside_a_fresh_finish_writes_only_the_fresh_one() -> None:
    done = ready("a", key="k/a@3", checksum="xxh3-128:a", epoch=3, owner="bob")
    done = done.model_copy(update={"size": 11})
    b = held("b", owner="bob", epoch=1)
    claim = Claim("job", "a", "s", "bob", 3, at(30))
    new, results = changes.finish_many(
        shard(done, b), [(claim, data("a", 3)), (claim_on(b), data("b", 1))], NOW
    )
    assert results == [done, made_ready(b, data("b", 1))]
    assert results[0] is done
    assert new is not None and new.entries == {"a": done, "b": results[1]}
    assert new.entries["a"] is done


def test_an_empty_batch_writes_nothing() -> None:
    assert changes.finish_many(shard(held("a")), [], NOW) == (None, [])


@pytest.mark.parametrize("first_refused", [False, True])
def test_an_entry_named_twice_is_refused_for_the_whole_batch(first_refused: bool) -> None:
    a = held("a", owner="bob", epoch=3)
    b = held("b", owner="bob", epoch=1)
    first = claim_on(a, epoch=2) if first_refused else claim_on(a)
    with pytest.raises(
        InvalidInput, match=exactly("'a' is finished twice in one batch: give each entry once")
    ):
        changes.finish_many(
            shard(a, b),
            [(first, data("a")), (claim_on(b), data("b", 1)), (claim_on(a), data("a"))],
            NOW,
        )


def test_the_command_carries_its_name_actor_and_change() -> None:
    a, b = held("a", owner="bob", epoch=3), held("b", owner="bob", epoch=4)
    finished = ((claim_on(a), data("a")), (claim_on(b, epoch=3), data("b")))
    command = commands.FinishMany(finished, "bob")
    assert (command.name, command.actor) == ("finish_many", "bob")
    got = command.apply(shard(a, b), NOW)
    want = changes.finish_many(shard(a, b), finished, NOW)
    assert got[0] == want[0] and got[0] is not None
    assert got[1][0] == want[1][0] == made_ready(a, data("a"))
    assert isinstance(got[1][1], LeaseLost) and str(got[1][1]) == str(want[1][1])
    assert commands.FinishMany((), "ann").actor == "ann"
