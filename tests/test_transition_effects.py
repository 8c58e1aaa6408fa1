"""Commits as named events, and the side effects of transitions that run from them.

Every path that makes an entry ``dead`` (``fail``, a takeover in ``claim`` and in
``claim_many``, ``reap``) must abort the entry's multipart upload, whoever commits it: the
bucket's list of unfinished uploads is read afterwards and must not name it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest

import objmanifest as om
from tests.support.breaking import BreakingFile

pytestmark = pytest.mark.behaviour

MiB = 1024 * 1024
PART = 5 * MiB


def open_uploads(store: om.ObjectStore) -> list[str]:
    """Keys of the unfinished multipart uploads under the store's prefix."""
    return [key for key, _ in store.list_uploads("")]


def wait_expired(task: om.Task, claim: om.Claim) -> None:
    """Sleep until the store's clock is past the entry's lease and its margin (the lease as
    the entry has it now: the put renewed it in the background before it broke)."""
    expiry = task.entry(claim.file_id).lease_expires_at
    assert expiry is not None
    deadline = time.monotonic() + 30
    while task.store.now() <= expiry + timedelta(seconds=2.2):
        assert time.monotonic() < deadline, "the lease never expired on the store's clock"
        time.sleep(0.2)


def broken_upload(task: om.Task, file_id: str) -> om.Claim:
    """Claim ``file_id`` and leave its chunked upload half sent, as a crashed producer does."""
    agent = task.agent("producer")
    claim = agent.claim(file_id)
    assert claim is not None
    data = bytes(range(256)) * (3 * PART // 256)
    with pytest.raises(OSError, match="disk failed"):
        agent.put(
            claim,
            BreakingFile(data, PART, "the producer's disk failed"),
            part_size=PART,
            threshold=MiB,
            concurrency=1,
        )  # type: ignore[arg-type]
    assert any(file_id in key for key in open_uploads(task.store)), "no upload was left open"
    return claim


def by_fail(task: om.Task, claim: om.Claim) -> None:
    assert task.agent("producer").fail(claim, "giving up").state is om.State.dead


def by_claim_takeover(task: om.Task, claim: om.Claim) -> None:
    wait_expired(task, claim)
    with pytest.raises(om.NotClaimable, match=r"dead after 1 failure$"):
        task.agent("rescuer").claim(claim.file_id)


def by_claim_many_takeover(task: om.Task, claim: om.Claim) -> None:
    wait_expired(task, claim)
    assert task.agent("rescuer").claim_many(stage="make", limit=5) == []


def by_reap(task: om.Task, claim: om.Claim) -> None:
    wait_expired(task, claim)
    assert [(e.file_id, e.state) for e in task.reap()] == [(claim.file_id, om.State.dead)]


@pytest.mark.parametrize(
    "kill", [by_fail, by_claim_takeover, by_claim_many_takeover, by_reap], ids=lambda f: f.__name__
)
def test_every_path_to_dead_aborts_the_upload(
    store: om.ObjectStore, kill: Callable[[om.Task, om.Claim], None]
) -> None:
    lease = 30 if kill is by_fail else 1.5
    task = om.Task.create(store, "job", stages=["make"], lease_seconds=lease, max_retries=0)
    task.declare("big", stage="make")
    claim = broken_upload(task, "big")
    kill(task, claim)
    assert task.entry("big").state is om.State.dead
    assert [key for key in open_uploads(store) if "big" in key] == []


def test_an_upload_dies_with_its_entry_whichever_process_commits(store: om.ObjectStore) -> None:
    """The reaper is another Task object (another process, in effect): the abort follows
    the commit, not the object that started the upload."""
    producer_view = om.Task.create(store, "job", stages=["make"], lease_seconds=1.5, max_retries=0)
    producer_view.declare("big", stage="make")
    claim = broken_upload(producer_view, "big")
    reaper_view = om.Task.open(store, "job")
    wait_expired(reaper_view, claim)
    assert [e.state for e in reaper_view.reap()] == [om.State.dead]
    assert open_uploads(store) == []


@pytest.mark.stage_layout
def test_commits_are_published_as_named_events(task: om.Task) -> None:
    seen: list[om.CommitEvent] = []
    stop = task.subscribe(seen.append)
    task.declare("a", stage="collect")
    agent = task.agent("w1")
    claim = agent.claim("a")
    assert claim is not None
    agent.renew(claim)
    agent.put(claim, b"data")
    task.agent("reader").consume("a")
    stop()
    task.declare("b", stage="collect")  # after unsubscribing: not seen
    names = [(e.command, e.key.rsplit("/", 1)[-1], e.actor) for e in seen]
    assert names == [
        ("declare", "index.json", ""),
        ("declare", "collect.json", ""),
        ("claim", "collect.json", "w1"),
        ("renew", "collect.json", "w1"),
        ("finish", "collect.json", "w1"),
        ("consume", "collect.json", "reader"),
    ]
    moves = [(t.item, t.before, t.after, t.epoch) for e in seen[1:] for t in e.transitions]
    assert moves == [
        ("a", None, "pending", 0),
        ("a", "pending", "writing", 1),
        ("a", "writing", "writing", 1),
        ("a", "writing", "ready", 1),
        ("a", "ready", "consumed", 1),
    ]
    versions = [e.version for e in seen[1:]]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    ready = seen[4].transitions[0]
    assert ready.checksum == task.entry("a").checksum


def test_a_failing_observer_does_not_undo_a_commit(task: om.Task) -> None:
    def broken(event: om.CommitEvent) -> None:
        raise RuntimeError("observer bug")

    task.subscribe(broken)
    task.declare("a", stage="collect")
    claim = task.agent("w").claim("a")
    assert claim is not None and task.entry("a").state is om.State.writing
