"""What a produced entry costs with the journal on (``bench/request_count.py`` measures the
same at a proxy): one conditional GET and three PUTs, plus one block PUT per ``BLOCK``
versions of the shard, each block sent once."""

from __future__ import annotations

import pytest
from conftest import requests

import objmanifest as om
from objmanifest import cas

pytestmark = pytest.mark.behaviour


@pytest.mark.stage_layout
def test_a_produced_entry_costs_four_requests_and_its_share_of_a_block(
    store: om.Store,
) -> None:
    task = om.Task.create(store, "job", stages=["collect"], lease_seconds=600)
    entries = 64
    task.declare_many([(f"f{i:03d}", "collect") for i in range(entries)])  # the shard at v1
    agent = task.agent("a")
    with requests(store) as seen:
        while (claim := agent.claim(stage="collect")) is not None:
            agent.put(claim, claim.file_id.encode())
        task.flush_journal()
    blocks = (1 + 2 * entries) // cas.BLOCK
    # One GET per claim (the claim that found nothing left checks its no-op on a second).
    assert seen["GetObject"] == entries + 2
    # Claim, data and ready PUTs, and every whole block sent exactly once.
    assert seen["PutObject"] == 3 * entries + blocks
    assert sum(seen.values()) == 4 * entries + 2 + blocks
    assert sum(seen.values()) / entries <= 4.25
