"""A shard's incremental work in a commit: its encoding (``ShardCodec.encode`` reusing the
pieces of the items it encoded before) is byte for byte pydantic's
``model_dump_json(exclude_none=True)``, and its transitions (found by comparing objects at
C speed) are those of the plain loop over every entry, over random sequences of versions as
commits make them (items changed, added, removed, reordered, journal records appended and
dropped, archived ids, extra fields), every version encoded by one codec in turn."""

from __future__ import annotations

import threading
from typing import Any

import pydantic_core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objmanifest.cas.codecs import REMOVED, ShardCodec, _rebuild_fields
from objmanifest.cas.fragments import SMALL_FIELDS, Fragments, quoted
from objmanifest.core.commit_events import Change
from objmanifest.core.model import (
    COMMITS_KEPT,
    Archived,
    Entry,
    JournalRecord,
    Shard,
    entries_changed,
)
from objmanifest.core.states import State

from ..make import T0, at, entry

IDS = st.text(alphabet=st.sampled_from('ab\u00e9"\\/\n\t\u2603~'), min_size=1, max_size=4)


def plain(doc: Shard) -> bytes:
    return doc.model_dump_json(exclude_none=True).encode()


def plain_transitions(before: Shard, after: Shard) -> list[Change]:
    """Every entry looked at: the removed ones in ``before``'s order, then the others."""
    out = [
        Change(item=f, before=was.state.value, after=REMOVED, epoch=was.epoch)
        for f, was in before.entries.items()
        if f not in after.entries
    ]
    for f, e in after.entries.items():
        was = before.entries.get(f)
        if was != e:
            out.append(
                Change(
                    item=f,
                    before=was.state.value if was is not None else None,
                    after=e.state.value,
                    epoch=e.epoch,
                    retry_count=e.retry_count,
                    error=e.error,
                    checksum=e.checksum,
                    **_rebuild_fields(was, e),
                )
            )
    return out


@st.composite
def entries(draw: st.DrawFn, file_id: str) -> Entry:
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["future_field"] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3)))
    return entry(
        file_id,
        state=draw(st.sampled_from(State)),
        epoch=draw(st.integers(0, 5)),
        owner=draw(st.one_of(st.none(), IDS)),
        lease_expires_at=draw(st.one_of(st.none(), st.just(at(30)))),
        depends_on=tuple(draw(st.lists(IDS, max_size=2))),
        **extra,
    )


def record(version: int) -> JournalRecord:
    return JournalRecord(
        version=version, commit_id=f"c{version}", command="renew", actor="a", at=T0
    )


STEPS = st.sampled_from(
    ["change", "same value, new object", "add", "remove", "reorder", "journal", "flush",
     "journal rewritten", "archive", "no journal", "nothing", "stamp", "journal id",
     "schema", "extra field", "renamed", "set"]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.data(), st.lists(STEPS, min_size=1, max_size=12))
def test_every_version_encodes_exactly_as_pydantic_does(
    data: st.DataObject, steps: list[str]
) -> None:
    codec = ShardCodec("job", "s")
    first = {fid: data.draw(entries(fid)) for fid in data.draw(st.lists(IDS, max_size=6))}
    doc = Shard(task_id="job", stage="s", entries=first, journal=())
    assert codec.encode(doc) == plain(doc)
    version = 0
    for step in steps:
        items = dict(doc.entries)
        ids = list(items)
        update: dict[str, Any] = {}
        if step == "set" or (step in ("change", "add") and data.draw(st.booleans())):
            # As commands do: Shard.with_entries, which says what it set.
            known = st.sampled_from(ids) if ids else IDS
            fids = data.draw(st.lists(known | IDS, min_size=1, max_size=3, unique=True))
            if step == "change" and ids:
                fids = [data.draw(st.sampled_from(ids))]
            elif step == "add":
                fids = [fid for fid in fids if fid not in items][:1] or [data.draw(IDS)]
            same = data.draw(st.booleans())  # a value that stays the same object too
            changed = {f: items[f] if same and f in items else data.draw(entries(f)) for f in fids}
            before, doc = doc, doc.with_entries(changed)
            check(codec, before, doc, data.draw(st.booleans()))
            continue
        if step == "change" and ids:
            fid = data.draw(st.sampled_from(ids))
            items[fid] = data.draw(entries(fid))
        elif step == "same value, new object" and ids:
            fid = data.draw(st.sampled_from(ids))
            items[fid] = items[fid].model_copy()
        elif step == "add":
            fid = data.draw(IDS)
            items[fid] = data.draw(entries(fid))
        elif step == "remove" and ids:
            del items[data.draw(st.sampled_from(ids))]
        elif step == "reorder":
            items = dict(reversed(items.items()))
        elif step == "journal":
            version += 1
            update["journal"] = (*(doc.journal or ()), record(version))
        elif step == "flush":
            update["journal"] = (doc.journal or ())[1:]
        elif step == "journal rewritten":  # the same first record, another last one
            version += 1
            update["journal"] = (*(doc.journal or ())[:-1], record(version))
        elif step == "archive" and ids:
            fid = data.draw(st.sampled_from(ids))
            del items[fid]
            archived = Archived(state=State.consumed, archive=f"archive/{fid}", declared="d")
            update["archived"] = {**(doc.archived or {}), fid: archived}
        elif step == "no journal":
            update["journal"] = None
        elif step == "stamp":  # a new version: its number and commit ids
            doc = codec.stamp(doc, data.draw(IDS))
        elif step == "journal id":
            update["journal_id"] = data.draw(st.one_of(st.none(), IDS))
        elif step == "schema":
            update["schema_version"] = data.draw(st.integers(1, 2))
        elif step == "extra field":  # a field of a newer objmanifest's, kept
            update[data.draw(st.sampled_from(["future", "later"]))] = data.draw(
                st.one_of(st.none(), st.integers(), IDS, st.lists(IDS, max_size=2))
            )
        elif step == "renamed":
            update[data.draw(st.sampled_from(["task_id", "stage"]))] = data.draw(IDS)
        before, doc = doc, doc.model_copy(update={"entries": items, **update})
        check(codec, before, doc, data.draw(st.booleans()))


def check(codec: ShardCodec, before: Shard, doc: Shard, transitions_first: bool) -> None:
    """The loop asks for the transitions first, then the encoding; either order holds."""
    if transitions_first:
        assert codec.transitions(before, doc) == plain_transitions(before, doc)
        assert codec.encode(doc) == plain(doc)
    else:
        assert codec.encode(doc) == plain(doc)
        assert codec.transitions(before, doc) == plain_transitions(before, doc)


def test_the_skeleton_is_made_of_every_field_of_a_shard_but_those_a_commit_changes() -> None:
    """A skeleton is made again when one of its small fields changes: a field added to
    ``Shard`` must be one of them (or one put into it, like the version), or a skeleton
    made before would keep that field's old value."""
    holes = {"journal", "entries", "archived"}
    assert set(Shard.model_fields) == {*SMALL_FIELDS, "version", "commits", *holes}


def test_an_unchanged_item_is_not_encoded_again() -> None:
    """What the reuse rests on: an item carried over as the same object keeps its piece;
    the one a commit replaced is encoded anew (a piece is never taken for another object)."""
    codec = ShardCodec("job", "s")
    a, b = entry("a"), entry("b")
    doc = Shard(task_id="job", stage="s", entries={"a": a, "b": b})
    for _ in range(Fragments.WARM + 1):  # warm: pieces are made
        codec.encode(doc)
    # Poison the remembered piece of b: it must come back for b, and only for b.
    run = codec.fragments._runs["entries"]
    assert run.pieces is not None
    run.pieces[1] = b'"b":"remembered"'
    codec.fragments._runs["entries"] = run._replace(joined=b",".join(run.pieces))
    renewed = doc.with_entries({"a": a.model_copy(update={"epoch": 7})})
    assert b'"b":"remembered"' in codec.encode(renewed)
    replaced = doc.with_entries({"b": b.model_copy()})
    assert codec.encode(replaced) == plain(replaced)


def test_a_shard_read_afresh_is_encoded_whole_until_it_is_written_warm() -> None:
    """After a fresh read every entry is a new object: making a piece of each costs more than
    pydantic's one pass, so pieces wait until the shard was encoded twice in a row with most
    entries unchanged (a busy shard, read again after each lost race, never pays them)."""
    codec = ShardCodec("job", "s")
    doc = Shard(task_id="job", stage="s", entries={f: entry(f) for f in "abcd"})
    for i in range(Fragments.WARM + 1):
        assert codec.encode(doc) == plain(doc)
        made = codec.fragments._runs["entries"].pieces is not None
        assert made is (i == Fragments.WARM), i
    read_again = codec.decode("k", plain(doc))
    assert codec.encode(read_again) == plain(read_again)
    assert codec.fragments._runs["entries"].pieces is None


def test_what_with_entries_set_is_known_only_for_the_pair_it_made_in_its_thread() -> None:
    """``entries_changed`` answers for the last ``with_entries`` of the calling thread, and
    only about the very mapping it started from and the one it made: any other pair (an
    older version, a copy, another thread's) is compared item by item."""
    doc = Shard(task_id="job", stage="s", entries={"a": entry("a"), "b": entry("b")})
    first = doc.with_entries({"b": entry("b", epoch=1), "c": entry("c")})
    assert entries_changed(doc.entries, first.entries) == ("b", "c")
    second = first.with_entries({"a": entry("a", epoch=2)})
    assert entries_changed(first.entries, second.entries) == ("a",)
    assert entries_changed(doc.entries, first.entries) is None  # not the last one made
    assert entries_changed(first.entries, dict(second.entries)) is None  # a copy
    seen: list[tuple[str, ...] | None] = []
    thread = threading.Thread(
        target=lambda: seen.append(entries_changed(first.entries, second.entries))
    )
    thread.start()
    thread.join()
    assert seen == [None]


@settings(max_examples=30, deadline=None)
@given(st.lists(IDS, min_size=COMMITS_KEPT + 2, max_size=COMMITS_KEPT + 6), st.integers(0, 99))
def test_commit_ids_encode_as_pydantic_does_as_the_oldest_are_dropped(
    ids: list[str], rewritten: int
) -> None:
    """Each version's commit ids are the last one's, the oldest dropped once there are
    ``COMMITS_KEPT``, and its own last (a group's members share one, remembered once);
    another list altogether (a fresh read) is encoded whole."""
    codec = ShardCodec("job", "s")
    doc = Shard(task_id="job", stage="s")
    for n, commit_id in enumerate(ids):
        doc = codec.stamp(doc, commit_id)
        assert codec.encode(doc) == plain(doc)
        if n == rewritten:
            doc = doc.model_copy(update={"commits": tuple(reversed(doc.commits))})
            assert codec.encode(doc) == plain(doc)


@given(st.text(st.characters(codec=None, exclude_categories=())))
def test_a_string_is_quoted_as_pydantic_writes_it(text: str) -> None:
    try:
        expected: bytes | type[Exception] = pydantic_core.to_json(text)
    except pydantic_core.PydanticSerializationError:
        expected = pydantic_core.PydanticSerializationError
    if isinstance(expected, bytes):
        assert quoted(text) == expected
    else:
        with pytest.raises(expected):
            quoted(text)


JOURNAL_STEPS = st.sampled_from(["append", "append", "append", "flush", "rewrite", "read", "empty"])


@settings(max_examples=100, deadline=None)
@given(st.data(), st.lists(JOURNAL_STEPS, min_size=1, max_size=40))
def test_a_journal_encodes_as_pydantic_does_as_records_come_and_go(
    data: st.DataObject, steps: list[str]
) -> None:
    """Records appended (one or a group's several), a flushed block's dropped from the start,
    the last one written again, every record read afresh, none left: each version of the
    journal is encoded exactly as pydantic encodes it."""
    codec = ShardCodec("job", "s")
    doc, version = Shard(task_id="job", stage="s", journal=()), 0
    for step in steps:
        records = doc.journal or ()
        if step == "append":
            more = data.draw(st.integers(1, 3))
            records = (*records, *(record(version + i) for i in range(1, more + 1)))
            version += more
        elif step == "flush" and records:
            records = records[data.draw(st.integers(1, len(records))) :]
        elif step == "rewrite" and records:
            records = (*records[:-1], record(version))
        elif step == "read":
            records = tuple(r.model_copy() for r in records)
        elif step == "empty":
            records = ()
        doc = doc.model_copy(update={"journal": records})
        assert codec.encode(doc) == plain(doc)
