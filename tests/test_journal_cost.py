"""What a produced entry costs with the journal on (``bench/request_count.py`` measures the
same at a proxy): three PUTs (the claim's, the data's, the ready one), plus one block PUT per
``BLOCK`` versions of the shard, each block sent once. A warm claim chooses on the cached
shard, which the agent's own last commit confirmed current, without reading it again; a
busy shard is read first (``tests/unit/cas/test_claim_base.py``)."""

from __future__ import annotations

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from tests.support.internals import engine
from tests.support.rawstore import requests as requests

pytestmark = pytest.mark.behaviour


@pytest.mark.stage_layout
def test_a_produced_entry_costs_three_requests_and_its_share_of_a_block(
    store: om.ObjectStore,
) -> None:
    # A cached version counts as current for an hour here (1 s by default), so that a pause
    # of a loaded machine between two calls cannot add a read.
    policy = om.CasPolicy(fresh_seconds=3600)
    task = om.Task.create(store, "job", stages=["collect"], lease_seconds=600, policy=policy)
    entries = 64
    task.declare_many([(f"f{i:03d}", "collect") for i in range(entries)])  # the shard at v1
    agent = task.agent("a")
    with requests(store) as seen:
        while (claim := agent.claim(stage="collect")) is not None:
            agent.put(claim, claim.file_id.encode())
        task.flush_journal()
    blocks = (1 + 2 * entries) // BLOCK
    # No claim reads the shard its last commit wrote, but the one that found nothing left:
    # a no-op decided on a cached version is checked by a read (a 304).
    assert seen["GetObject"] == 1
    # Claim, data and ready PUTs, and every whole block sent exactly once.
    assert seen["PutObject"] == 3 * entries + blocks
    assert sum(seen.values()) == 3 * entries + 1 + blocks
    assert sum(seen.values()) / entries <= 3.1


def test_one_commit_per_process_keeps_the_journal_bounded_and_trimmable(
    store: om.ObjectStore,
) -> None:
    """Shell steps and tool calls: each commit from a new ``Task`` that knows of no block
    stored. The shard and the index carry fewer than ``2 * BLOCK`` records whatever made
    them, a commit costs its two PUTs (plus each block about twice over the run), and
    retention can drop what the objects no longer carry."""
    om.Task.create(store, "job", stages=["collect"], journal_keep_versions=40)
    processes = 90
    puts: list[int] = []
    for i in range(processes):
        task = om.Task.open(store, "job")  # as `objmanifest declare` opens it
        with requests(store) as seen:
            task.declare(f"f{i:03d}", "collect")
            task.flush_journal()
        puts.append(seen["PutObject"])
    task = om.Task.open(store, "job")
    # Each object whose first block ends 40 versions or more before its newest one lets go
    # of that block (the index always; a stage's shard unless its partitions share the 90).
    droppable = 0
    for key, codec in engine(task).journaled_objects():
        journal = codec.journal(engine(task).docs.read(key, codec))
        assert journal is not None and len(journal[1]) < 2 * BLOCK, key
        newest = max((r.version for r in journal[1]), default=0)
        droppable += BLOCK if newest - BLOCK >= 40 else 0
    assert droppable >= BLOCK
    assert sum(puts) / processes <= 2 + 4 / BLOCK + 0.01
    assert max(puts) <= 6
    dropped = task.trim_journal()
    assert sum(d.records for d in dropped) >= droppable
    steps = task.history("f089")
    assert [s.to_state for s in steps] == ["pending"]
    declared = [r for r in task.log() if r.command == "declare"]
    assert len({t.item for r in declared for t in r.transitions}) >= processes - 40
