"""How many data objects ``put_many`` sends at once: a batch of bytes (already in memory)
as many as the store has connections; a batch with a file in it, or an explicit
``concurrency``, that many at a time (memory stays as ``put``'s)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import objmanifest as om
from objmanifest.data.sources import Source
from objmanifest.store import MemoryStore
from tests.support.internals import engine

N = 24


def batch_of(connections: int = 32) -> tuple[om.Agent, list[om.Claim], MemoryStore]:
    store = MemoryStore(f"width-{uuid.uuid4().hex}", "p", connections=connections)
    task = om.Task.create(store, "job", stages=["s"])
    task.declare_many([(f"f{i:02d}", "s") for i in range(N)])
    agent = task.agent("ann")
    return agent, agent.claim_many("s", limit=N), store


def data_threads(
    agent: om.Agent, store: MemoryStore, barrier: threading.Barrier | None = None
) -> set[int]:
    """The threads that sent data objects; with ``barrier``, each waits there first, so
    they are all in flight at once."""
    seen: set[int] = set()
    layout = engine(agent).layout

    def hook(name: str, key: str) -> None:
        if name == "put" and layout.parse(key).kind == "data":
            seen.add(threading.get_ident())
            if barrier is not None:
                barrier.wait(timeout=10)

    store.faults.hooks.append(hook)
    return seen


def test_a_batch_of_bytes_goes_up_all_at_once() -> None:
    agent, claims, store = batch_of()
    seen = data_threads(agent, store, threading.Barrier(N))  # broken unless all N are in flight
    results = agent.put_many(claims, [c.file_id.encode() for c in claims])
    assert all(isinstance(r, om.Entry) for r in results), results
    assert len(seen) == N


def test_the_store_connections_cap_a_batch_of_bytes() -> None:
    agent, claims, store = batch_of(connections=5)
    seen = data_threads(agent, store)
    results = agent.put_many(claims, [c.file_id.encode() for c in claims])
    assert all(isinstance(r, om.Entry) for r in results), results
    assert 1 <= len(seen) <= 5


def test_an_explicit_concurrency_is_kept() -> None:
    agent, claims, store = batch_of()
    seen = data_threads(agent, store)
    results = agent.put_many(claims, [c.file_id.encode() for c in claims], concurrency=3)
    assert all(isinstance(r, om.Entry) for r in results), results
    assert 1 <= len(seen) <= 3


def test_a_batch_with_a_file_goes_up_at_the_transfer_concurrency(tmp_path: Path) -> None:
    agent, claims, store = batch_of()
    path = tmp_path / "one"
    path.write_bytes(b"from a file")
    seen = data_threads(agent, store)
    datas: list[Source] = [c.file_id.encode() for c in claims[1:]]
    results = agent.put_many(claims, [path, *datas])
    assert all(isinstance(r, om.Entry) for r in results), results
    assert 1 <= len(seen) <= engine(agent).transfer.concurrency == 8


def test_the_ready_commits_of_a_batch_over_several_partitions_go_out_at_once() -> None:
    store = MemoryStore(f"width-{uuid.uuid4().hex}", "p")
    task = om.Task.create(store, "job", stages=["s"], partitions={"s": 4})
    task.declare_many([(f"f{i:02d}", "s") for i in range(N)])
    agent = task.agent("ann")
    claims = [agent.claim(f"f{i:02d}") for i in range(N)]
    assert all(claims)
    shards = {c.shard for c in claims if c is not None}
    assert len(shards) == 4
    layout, data_puts = engine(task).layout, [0]
    barrier = threading.Barrier(len(shards))  # broken unless every shard's commit is in flight
    committing: set[str] = set()

    def hook(name: str, key: str) -> None:
        parsed = layout.parse(key)
        if name == "put" and parsed.kind == "data":
            data_puts[0] += 1
        elif name == "put" and parsed.kind == "shard" and data_puts[0] == N:
            assert parsed.shard is not None
            committing.add(parsed.shard)
            barrier.wait(timeout=10)

    store.faults.hooks.append(hook)
    ready = [c for c in claims if c is not None]
    results = agent.put_many(ready, [c.file_id.encode() for c in ready])
    assert all(isinstance(r, om.Entry) and r.state is om.State.ready for r in results), results
    assert [r.file_id for r in results if isinstance(r, om.Entry)] == [c.file_id for c in ready]
    assert committing == shards
