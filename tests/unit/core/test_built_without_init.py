"""What a commit builds without its class's constructor (``change_of``,
``JournalRecord.of_commit``, ``replaced``) is the very object the constructor (or
pydantic's copy) builds: equal, hashed, shown, pickled and written alike, with the same
fields in the same order."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from objmanifest.core.commit_events import Change, change_of
from objmanifest.core.model import Entry, JournalRecord
from objmanifest.core.states import State

from ..make import T0, at

TEXT = st.text(max_size=5)
OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "before": TEXT,
    "epoch": st.integers(0, 9),
    "retry_count": st.integers(0, 9),
    "error": TEXT,
    "checksum": TEXT,
    "key": TEXT,
    "size": st.integers(0, 10**12),
    "part_size": st.integers(1, 10**9),
    "parts_key": TEXT,
    "whole_checksum": TEXT,
    "consumed_by": st.lists(TEXT, max_size=2).map(tuple),
    "depends_on": st.lists(TEXT, max_size=2).map(tuple),
    "consumers": st.lists(TEXT, max_size=2).map(tuple),
    "claimed_at": st.just(at(1)),
    "ready_at": st.just(at(2)),
    "retry_at": st.just(at(3)),
}


def test_every_optional_field_of_a_change_is_drawn() -> None:
    required = {"item", "after"}
    assert {f.name for f in dataclasses.fields(Change)} == required | OPTIONAL.keys()


@given(TEXT, TEXT, st.fixed_dictionaries({}, optional=OPTIONAL))
def test_change_of_is_the_change_its_init_makes(item: str, after: str, given: Any) -> None:
    made, built = change_of(item, after, **given), Change(item=item, after=after, **given)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert list(vars(made).items()) == list(vars(built).items())
    assert pickle.loads(pickle.dumps(made)) == built
    assert type(made) is Change
    with_more = dataclasses.replace(made, epoch=7)
    assert with_more == dataclasses.replace(built, epoch=7)


@given(
    st.integers(1, 10**6),
    TEXT,
    TEXT,
    TEXT,
    st.lists(st.builds(change_of, TEXT, TEXT, epoch=st.integers(0, 3)), max_size=3).map(tuple),
    st.one_of(st.none(), st.integers(1, 99)),
)
def test_a_record_of_a_commit_is_the_record_validation_makes(
    version: int,
    commit_id: str,
    command: str,
    actor: str,
    transitions: tuple[Change, ...],
    lost: int | None,
) -> None:
    made = JournalRecord.of_commit(version, commit_id, command, actor, T0, transitions, lost)
    built = JournalRecord(
        version=version,
        commit_id=commit_id,
        command=command,
        actor=actor,
        at=T0,
        transitions=transitions,
        lost_races=lost,
    )
    assert made == built and repr(made) == repr(built)
    assert list(made.__dict__.items()) == list(built.__dict__.items())
    assert made.model_fields_set == built.model_fields_set
    assert made.__pydantic_extra__ == built.__pydantic_extra__
    assert made.model_dump_json(exclude_none=True) == built.model_dump_json(exclude_none=True)
    assert made.model_dump(exclude_unset=True) == built.model_dump(exclude_unset=True)
    assert made.model_copy(update={"object_key": "k"}) == built.model_copy(
        update={"object_key": "k"}
    )
    assert pickle.loads(pickle.dumps(made)) == built


ENTRY_CHANGES: dict[str, st.SearchStrategy[Any]] = {
    "state": st.sampled_from(State),
    "owner": st.one_of(st.none(), TEXT),
    "epoch": st.integers(0, 9),
    "lease_expires_at": st.one_of(st.none(), st.just(at(5))),
    "updated_at": st.just(at(6)),
    "consumed_by": st.lists(TEXT, max_size=2).map(tuple),
}


@given(
    st.fixed_dictionaries({}, optional=ENTRY_CHANGES),
    st.fixed_dictionaries({}, optional=ENTRY_CHANGES),
    st.dictionaries(st.sampled_from(["future", "later"]), st.integers(), max_size=2),
)
def test_a_replaced_model_is_the_copy_pydantic_makes(
    first: dict[str, Any], then: dict[str, Any], unknown: dict[str, Any]
) -> None:
    """``replaced`` (twice, as commits do) makes what ``model_copy(update=...)`` makes: the
    same fields, the same fields given, the same unknown fields kept, and neither copy
    changes the model it came from."""
    original = Entry(file_id="f", stage="s", **unknown)
    snapshot = (dict(original.__dict__), set(original.model_fields_set), original.model_extra)
    made = original.replaced(**first).replaced(**then)
    copied = original.model_copy(update=first).model_copy(update=then)
    assert made == copied and repr(made) == repr(copied)
    assert list(made.__dict__.items()) == list(copied.__dict__.items())
    assert made.model_fields_set == copied.model_fields_set
    assert made.model_extra == copied.model_extra == unknown
    assert made.model_dump_json(exclude_unset=True) == copied.model_dump_json(exclude_unset=True)
    assert (dict(original.__dict__), original.model_fields_set, original.model_extra) == snapshot
