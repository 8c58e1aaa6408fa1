"""The lifecycle verbs on archived entries: revive brings an archived dead entry back into
its live shard; undeclare refuses an archived id."""

from __future__ import annotations

import pytest

from objmanifest.core import operator_changes
from objmanifest.core.model import Archived, Shard
from objmanifest.core.states import State
from objmanifest.errors import NotFound, WrongState

from ..make import at, entry, exactly, shard

DEAD = entry("d", state=State.dead, epoch=2, retry_count=3, error="boom")
GONE = entry("c", state=State.consumed, epoch=1, consumed_by=("x",))


def archived_shard(*live_ids: str) -> Shard:
    refs = {
        "d": Archived(state=State.dead, archive="A1", declared="x"),
        "c": Archived(state=State.consumed, archive="A1", declared="y"),
    }
    base = shard(*(entry(i) for i in live_ids))
    return base.model_copy(update={"archived": refs})


def test_revive_brings_an_archived_dead_entry_back_into_the_live_shard() -> None:
    doc = archived_shard("p")
    new, revived = operator_changes.revive(doc, "d", at(7), archived=DEAD)
    assert (revived.state, revived.retry_count, revived.error) == (State.failed, 0, "boom")
    assert (revived.epoch, revived.updated_at) == (2, at(7))
    assert new.entries == {"p": doc.entries["p"], "d": revived}
    assert new.archived == {"c": doc.archived["c"]}  # type: ignore[index]
    # the command carries the archived entry to the same change
    again, same = operator_changes.Revive("d", archived=DEAD).apply(doc, at(7))
    assert (again, same) == (new, revived)


def test_an_archived_entry_that_is_not_dead_is_not_revived() -> None:
    doc = archived_shard()
    with pytest.raises(
        WrongState, match=exactly("'c' is consumed, not dead: only a dead entry can be revived")
    ):
        operator_changes.revive(doc, "c", at(7), archived=GONE)


def test_unarchived_leaves_a_live_or_unknown_id_or_a_missing_entry_alone() -> None:
    doc = archived_shard("d")  # "d" is live here (revived before) and still in the map
    assert operator_changes.unarchived(doc, "d", DEAD) is doc
    assert operator_changes.unarchived(doc, "zz", DEAD) is doc
    plain = archived_shard()
    assert operator_changes.unarchived(plain, "d", None) is plain
    assert operator_changes.unarchived(shard(), "d", DEAD) == shard()
    with pytest.raises(NotFound):
        operator_changes.revive(plain, "d", at(7))  # archived, but the entry was not given


def test_undeclare_refuses_an_archived_id_and_changes_nothing() -> None:
    doc = archived_shard("p")
    with pytest.raises(
        WrongState,
        match=exactly(
            "'c' is archived (consumed), not pending: only an entry nobody has claimed yet "
            "can be undeclared"
        ),
    ):
        operator_changes.undeclare(doc, "c")
    assert operator_changes.undeclare(doc, "gone") == (None, None)
