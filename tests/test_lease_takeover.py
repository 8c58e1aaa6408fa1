"""Leases: when one may be taken over, by whose clock, and what releasing a dead one frees.

Times are the store's: each agent's ``store.now()`` (its estimate of the store's clock from
the ``Date`` of its answers), or the ``Date`` of a fresh answer, never this machine's clock.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta

import pytest

import objmanifest as om
from tests.support import rawstore
from tests.support.backends import skewed
from tests.support.breaking import BreakingFile
from tests.support.stores import Server, memory_store

pytestmark = pytest.mark.behaviour

MiB = 1024 * 1024
PART = 5 * MiB


def create(store: om.ObjectStore, lease: float = 1, retries: int = 3) -> om.Task:
    return om.Task.create(
        store, "leases", stages=["collect"], lease_seconds=lease, max_retries=retries
    )


def wait_on_clock(task: om.Task, moment: datetime, within: float = 30) -> None:
    """Until ``task``'s estimate of the store's clock passes ``moment``. Each round asks the
    store once (a 304), so the estimate is sharp: the ``Date`` header's whole seconds are
    pinned by the answer that comes just after a second begins."""
    deadline = time.monotonic() + within
    while task.store.now() < moment:
        assert time.monotonic() < deadline, f"the store's clock did not reach {moment}"
        task.shard("collect")
        time.sleep(0.05)


# -- the margin ----------------------------------------------------------------------------


def test_a_lease_is_taken_over_only_once_its_2s_margin_has_passed(
    server: Server, prefix: str
) -> None:
    """Expiry allows a takeover only 2 s after the recorded end (the ``Date`` header has
    whole seconds): half a second after it the holder keeps its entry, and 2.5 s after it
    another agent takes it over. Both moments are on the taker's own clock. On memory the
    store runs on the wall clock here, not the session's faster one: the refused claim has
    to land inside the margin's 1.5 s even on a busy machine."""

    def connect() -> om.ObjectStore:
        return memory_store(prefix, skew=0) if server.name == "memory" else server.connect(prefix)

    holder_task = create(connect())
    holder_task.declare("x", stage="collect")
    claim = holder_task.agent("holder").claim("x")
    assert claim is not None
    taker_task = om.Task.open(connect(), "leases")
    taker = taker_task.agent("taker")

    wait_on_clock(taker_task, claim.lease_expires_at + timedelta(seconds=0.5))
    with pytest.raises(om.NotClaimable, match="held by holder"):
        taker.claim("x")
    kept = taker_task.entry("x")
    assert (kept.state, kept.owner, kept.epoch, kept.retry_count) == (
        om.State.writing,
        "holder",
        1,
        0,
    )

    wait_on_clock(taker_task, claim.lease_expires_at + timedelta(seconds=2.5))
    taken = taker.claim("x")
    assert taken is not None and taken.epoch == 2
    entry = taker_task.entry("x")
    assert (entry.owner, entry.retry_count) == ("taker", 1)


# -- whose clock ---------------------------------------------------------------------------


@pytest.mark.parametrize("skew", [3600, -3600], ids=["store-1h-ahead", "store-1h-behind"])
def test_leases_follow_the_store_clock_not_the_agents(
    server: Server, prefix: str, skew: int
) -> None:
    """The store's clock is an hour off this machine's (a proxy shifts the ``Date`` of
    every answer). A lease ends ``lease_seconds`` after the claim on the store's clock, and
    a takeover is judged on it: refused while the lease runs, allowed once the store's
    clock is past its end and margin. The lease is 5 s, so the refusal does not depend on
    the taker asking within 3 s of the claim on a busy machine."""
    with skewed(server, skew) as connect:
        store = connect(prefix)
        task = create(store, lease=5)
        task.declare("x", stage="collect")
        lease = timedelta(seconds=task.lease_seconds)
        before = rawstore.date(store)
        assert abs((before - datetime.now(before.tzinfo)).total_seconds() - skew) < 60
        claim = task.agent("holder").claim("x")
        after = rawstore.date(store)
        assert claim is not None
        claimed_at = claim.lease_expires_at - lease
        assert before - timedelta(seconds=1) <= claimed_at <= after + timedelta(seconds=2)
        assert task.entry("x").lease_expires_at == claim.lease_expires_at

        taker_task = om.Task.open(connect(prefix), "leases")
        taker = taker_task.agent("taker")
        with pytest.raises(om.NotClaimable, match="held by holder"):
            taker.claim("x")
        deadline = time.monotonic() + 30
        while rawstore.date(store) < claim.lease_expires_at + timedelta(seconds=3):
            assert time.monotonic() < deadline, "the store's clock did not pass the lease"
            time.sleep(0.2)
        taken = taker.claim("x")
        assert taken is not None and taken.epoch == 2
        now = rawstore.date(store)
        assert now - timedelta(seconds=1) <= taken.lease_expires_at - lease
        assert taken.lease_expires_at - lease <= now + timedelta(seconds=2)


# -- reaping a dead chunked entry ------------------------------------------------------------


def test_reaping_a_dead_chunked_entry_aborts_its_upload(store: om.ObjectStore) -> None:
    """A chunked put breaks after its first part: the upload stays open for an adopter. Its
    lease expires with no retries left, so reap makes the entry dead, and nobody will adopt
    the upload any more: reap aborts it, and no multipart upload of the task is left."""
    task = create(store, retries=0)
    task.declare("big", stage="collect")
    agent = task.agent("p")
    claim = agent.claim("big")
    assert claim is not None
    source = BreakingFile(random.Random(3).randbytes(2 * PART), fail_at=PART)
    try:
        with pytest.raises(OSError, match="the source broke"):
            agent.put(claim, source, part_size=PART, threshold=MiB, concurrency=1)  # type: ignore[arg-type]
        assert [k for k, _ in rawstore.multipart_uploads(store, "leases/")] == [
            "leases/data/collect/big@1"
        ]
        expiry = task.entry("big").lease_expires_at
        assert expiry is not None
        wait_on_clock(task, expiry + timedelta(seconds=2.2))
        released = task.reap()
        assert [(e.file_id, e.state) for e in released] == [("big", om.State.dead)]
        assert rawstore.multipart_uploads(store, "leases/") == []
    finally:
        rawstore.abort_uploads(store, "leases/")
