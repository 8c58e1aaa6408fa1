"""Journal retention: a task bounds its journal by age or count, a trim drops whole blocks
beyond the bound (never a record still inside the live object), and readers say what was
dropped."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core.model import RetentionMarker
from objmanifest.journal.retention import MarkerCodec, TrimJournal
from tests.support.internals import engine
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put

pytestmark = pytest.mark.behaviour


def _task(store: Any, **retention: Any) -> om.Task:
    return om.Task.create(store, "job", stages=["collect"], lease_seconds=600, **retention)


def _commit_until(task: om.Task, version: int) -> om.Claim:
    """Declare ``f``, claim it and renew it until the shard is at ``version``."""
    task.declare("f", stage="collect")
    agent = task.agent("a")
    claim = agent.claim("f")
    assert claim is not None
    key, codec = engine(task).shard_key("collect"), engine(task).codec("collect")
    while codec.version(engine(task).docs.cached(key, codec)) != version:
        agent.renew(claim)
    return claim


def _versions(task: om.Task) -> list[int]:
    key = engine(task).shard_key("collect")
    return [r.version for r in engine(task).journal.records(key, engine(task).codec("collect"))]


def _blocks(task: om.Task) -> list[tuple[int, int]]:
    found = []
    for key in task.store.list_keys(
        engine(task).layout.journal_of(engine(task).shard_key("collect"))
    ):
        ref = engine(task).layout.parse_block(key)
        if ref is not None:
            found.append((ref.first, ref.last))
    return sorted(found)


def _ranges(dropped: list[om.Dropped]) -> list[tuple[str, int, int, int]]:
    return [(d.object_key, d.first, d.last, d.records) for d in dropped]


def test_settings_are_checked_like_the_lease_and_kept_in_the_header(store: om.ObjectStore) -> None:
    for bad in (float("inf"), float("nan"), 0, -1.0, True, "60", 1e12):
        with pytest.raises(om.InvalidInput, match="journal_keep_seconds must be a number"):
            _task(store, journal_keep_seconds=bad)
    for bad in (0, -3, 1.5, True, "5", 10**10):
        with pytest.raises(om.InvalidInput, match="journal_keep_versions must be a whole"):
            _task(store, journal_keep_versions=bad)
    assert list(store.list_keys("")) == []  # refused before any request
    task = _task(store, journal_keep_seconds=86400, journal_keep_versions=1000)
    header = om.Task.open(store, "job").header
    assert (header.journal_keep_seconds, header.journal_keep_versions) == (86400.0, 1000)
    with pytest.raises(om.InvalidInput, match="journal_keep_versions"):
        task.trim_journal(keep_versions=0)


@pytest.mark.stage_layout
def test_a_count_bound_drops_whole_old_blocks_and_readers_say_so(store: om.ObjectStore) -> None:
    task = _task(store, journal_keep_versions=40)
    claim = _commit_until(task, 102)
    task.flush_journal()
    task.agent("a").renew(claim)  # v103: knows every whole block is stored, carries 97..103
    task.flush_journal()
    key = engine(task).shard_key("collect")
    assert _versions(task) == list(range(1, 104))
    assert _blocks(task) == [(1, 32), (33, 64), (65, 96)]
    live_before = task.shard("collect").journal

    assert _ranges(task.trim_journal(dry_run=True)) == [(key, 1, 32, 32)]
    assert _blocks(task) == [(1, 32), (33, 64), (65, 96)]  # a dry run drops nothing

    dropped = task.trim_journal()  # 33..64 has 39 newer records: kept
    assert _ranges(dropped) == [(key, 1, 32, 32)]
    assert _blocks(task) == [(33, 64), (65, 96)]
    assert _versions(task) == list(range(33, 104))  # each remaining version once
    assert task.shard("collect").journal == live_before  # the live object is untouched
    said = task.dropped("f")
    assert _ranges(said) == [(key, 1, 32, 32)]
    assert said == task.dropped()  # the index kept its few records
    assert "records before version 33 of" in said[0].line()
    assert task.history("f")[0].version == 33
    assert task.trim_journal() == []  # nothing more is beyond the bound

    # A tighter bound given to the trim: the marker widens to everything dropped.
    assert _ranges(task.trim_journal(keep_versions=5)) == [(key, 33, 96, 64)]
    assert _ranges(task.dropped()) == [(key, 1, 96, 96)]
    assert _versions(task) == list(range(97, 104))
    assert _blocks(task) == []


@pytest.mark.stage_layout
def test_an_age_bound_never_drops_a_block_the_live_object_carries(store: om.ObjectStore) -> None:
    task = _task(store, journal_keep_seconds=3600)
    _commit_until(task, 96)  # the block 65..96 starts once v96 landed: v96 carries it
    task.flush_journal()
    assert task.trim_journal() == []  # nothing is an hour old
    newest = (
        engine(task)
        .journal.records(engine(task).shard_key("collect"), engine(task).codec("collect"))[-1]
        .at
    )
    while task.store.now() < newest + timedelta(seconds=1):
        task.store.runtime.sleep(0.05)  # until the store's clock is past every record
    live = {r.version for r in task.shard("collect").journal}
    assert set(range(65, 97)) <= live
    dropped = task.trim_journal(keep_seconds=0.5)
    gone = {v for d in dropped for v in range(d.first, d.last + 1)}
    expected = {v for first in (1, 33) for v in range(first, first + 32)} - live
    assert gone == expected  # every old block the live object no longer carries
    assert _versions(task) == sorted(set(range(1, 97)) - gone)
    assert (65, 96) in _blocks(task)


@pytest.mark.stage_layout
def test_a_trim_that_died_after_saying_is_finished_by_the_next(store: om.ObjectStore) -> None:
    task = _task(store, journal_keep_versions=40)
    claim = _commit_until(task, 102)
    task.flush_journal()
    task.agent("a").renew(claim)
    task.flush_journal()
    key = engine(task).shard_key("collect")
    planned = task.trim_journal(dry_run=True)
    marker_key = engine(task).layout.journal_retention(key)
    # The trim said what it drops, then died before deleting the block.
    engine(task).docs.commit(marker_key, MarkerCodec(key), TrimJournal(tuple(planned)))
    assert (1, 32) in _blocks(task)
    assert _versions(task) == list(range(33, 104))  # readers skip what the marker names
    assert _ranges(task.dropped()) == [(key, 1, 32, 32)]
    assert task.trim_journal() == []  # nothing new is dropped ...
    assert _blocks(task) == [(33, 64), (65, 96)]  # ... and the leftover block is gone
    marker = engine(task).docs.read(marker_key, MarkerCodec(key))
    assert isinstance(marker, RetentionMarker) and marker.dropped[0].records == 32


@pytest.mark.stage_layout
def test_a_task_without_retention_keeps_its_whole_journal(store: om.ObjectStore) -> None:
    task = _task(store)
    _commit_until(task, 70)
    task.flush_journal()
    assert task.trim_journal() == []
    assert task.dropped() == []
    assert _versions(task) == list(range(1, 71))


@pytest.mark.stage_layout
def test_trims_while_an_agent_commits_lose_no_record_within_the_bound(
    store: om.ObjectStore,
) -> None:
    task = _task(store, journal_keep_versions=40)
    claim = _commit_until(task, 2)
    trimmer = om.Task.open(store, "job")  # another process's view: its own cache and writer
    agent = task.agent("a")
    done = threading.Event()
    dropped: list[om.Dropped] = []

    def trim_in_a_loop() -> None:
        while not done.is_set():
            dropped.extend(trimmer.trim_journal())

    with ThreadPoolExecutor(1) as pool:
        trims = pool.submit(trim_in_a_loop)
        for _ in range(200):
            agent.renew(claim)
        done.set()
        trims.result()
    task.flush_journal()
    agent.renew(claim)  # v203
    task.flush_journal()
    dropped.extend(trimmer.trim_journal())
    said = task.dropped()
    assert len(said) == 1 and said[0].first == 1
    assert said[0].records == sum(d.records for d in dropped) == said[0].last
    # Everything after the dropped range is there, once each, up to the newest version.
    assert _versions(task) == list(range(said[0].last + 1, 204))
    assert said[0].last == 160  # 161..192 has 11 newer records: within the bound


@pytest.mark.stage_layout
def test_a_corrupt_marker_is_named_and_nothing_is_deleted(store: om.ObjectStore) -> None:
    task = _task(store, journal_keep_versions=40)
    claim = _commit_until(task, 102)
    task.flush_journal()
    task.agent("a").renew(claim)
    task.flush_journal()
    marker_key = engine(task).layout.journal_retention(engine(task).shard_key("collect"))
    raw_put(store, marker_key, b"not json")
    with pytest.raises(om.CorruptShard, match="retention"):
        task.log()
    with pytest.raises(om.CorruptShard, match="retention"):
        task.trim_journal()
    assert _blocks(task) == [(1, 32), (33, 64), (65, 96)]
    assert raw_get(store, marker_key) == b"not json"  # a corrupt object is never overwritten
