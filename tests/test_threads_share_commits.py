"""Group commits on every backend: the worker threads of one process share one task, so
their commits of one stage's shard queue up behind the write in flight and go out together.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

import objmanifest as om
from tests.support.internals import engine

pytestmark = pytest.mark.behaviour

THREADS = 16
ENTRIES = 96


def test_a_pool_of_threads_produces_every_entry_once_in_fewer_writes_than_commits(
    task: om.Task,
) -> None:
    ids = [f"raw/{i}" for i in range(ENTRIES)]
    task.declare_many([(f, "collect") for f in ids])
    task.shard("collect")  # cached: every thread starts from the same version
    before = replace(engine(task).docs.stats)
    start = threading.Barrier(THREADS)

    def work(n: int) -> list[om.Claim]:
        agent = task.agent(f"w{n}")
        done: list[om.Claim] = []
        start.wait(timeout=60)
        while (claim := agent.claim(stage="collect")) is not None:
            agent.put(claim, f"{claim.file_id} by w{n}".encode())
            done.append(claim)
        return done

    with ThreadPoolExecutor(THREADS) as pool:
        produced = [c for done in pool.map(work, range(THREADS)) for c in done]

    after = engine(task).docs.stats
    commits = after.commits - before.commits
    writes = after.writes - before.writes
    counts = Counter(c.file_id for c in produced)
    assert [f for f, n in counts.items() if n > 1] == [], "an entry was produced twice"
    assert sorted(counts) == sorted(ids)
    reader = task.agent("reader")
    for claim in produced:
        entry = task.entry(claim.file_id)
        assert (entry.state, entry.owner, entry.epoch) == (om.State.ready, claim.agent, 1)
        assert reader.consume(claim.file_id) == f"{claim.file_id} by {claim.agent}".encode()
    assert commits >= 2 * ENTRIES  # a claim and a finish each (and any renewal)
    assert writes < commits, "no commit went out in another's write"
    history = task.history(ids[0])
    assert [t.command for t in history] == ["declare", "claim_many", "finish", "consume"]
