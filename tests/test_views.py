"""Long-lived views: a Task whose cached shard predates another agent's commits.

A change is tried first on the cached copy of a shard. When that copy says "refused" or
"nothing to do", the answer may be stale: it must be checked against a fresh read before it
is believed. Each test here makes sure the view's cache really is stale when it acts (the
view reads nothing in between), so it is that check which is exercised.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import objmanifest as om
from tests.support.stores import Server

pytestmark = pytest.mark.behaviour


def test_reap_on_a_stale_view_releases_a_lease_it_has_not_seen(server: Server, prefix: str) -> None:
    """The view cached the shard while the entry was pending; another agent claimed it
    since, and the lease expired. Reaping on the cached copy finds nothing to release: the
    view must look again, and release it."""
    view = om.Task.create(
        server.connect(prefix), "views", stages=["s"], lease_seconds=1, max_retries=3
    )
    view.declare("x", stage="s")
    assert view.reap() == []  # caches the shard: nothing held
    other = om.Task.open(server.connect(prefix), "views")
    claim = other.agent("w").claim("x")
    assert claim is not None
    deadline = time.monotonic() + 30
    while view.store.now() <= claim.lease_expires_at + timedelta(seconds=2.2):  # no reads
        assert time.monotonic() < deadline, "the store's clock did not pass the lease"
        time.sleep(0.1)
    released = view.reap()
    assert [(e.file_id, e.state, e.retry_count) for e in released] == [("x", om.State.failed, 1)]
    entry = other.entry("x")
    assert (entry.state, entry.owner) == (om.State.failed, None)


def test_a_holder_acting_through_a_stale_view_is_not_refused(server: Server, prefix: str) -> None:
    """Agent ``w`` claims through one view (a process) and renews, fails and puts through
    another, whose cached shard still shows each entry pending. A refusal decided on that
    copy would be wrong: each change must succeed."""
    mine = om.Task.create(server.connect(prefix), "views", stages=["s"], lease_seconds=30)
    mine.declare_many([("r", "s"), ("f", "s"), ("p", "s")])
    elsewhere = om.Task.open(server.connect(prefix), "views").agent("w")
    agent = mine.agent("w")
    assert mine.entry("p").state is om.State.pending  # caches the shard

    claim = elsewhere.claim("r")
    assert claim is not None
    renewed = agent.renew(claim)
    assert (renewed.epoch, renewed.agent) == (1, "w")
    assert renewed.lease_expires_at >= claim.lease_expires_at

    claim = elsewhere.claim("f")  # the view's copy is stale again: f is pending there
    assert claim is not None
    failed = agent.fail(claim, "gave up")
    assert (failed.state, failed.retry_count, failed.error) == (om.State.failed, 1, "gave up")

    claim = elsewhere.claim("p")
    assert claim is not None
    ready = agent.put(claim, b"made through the other view")
    assert (ready.state, ready.epoch) == (om.State.ready, 1)
    assert mine.agent("reader").consume("p") == b"made through the other view"
