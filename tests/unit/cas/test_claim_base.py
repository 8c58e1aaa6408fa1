"""A claim chooses on the cached shard while it is likely current (``Manifest.claim_base``):
warm, a produced entry costs its three PUTs and nothing else; a stale cache still makes the
right choice (the claim's write meets a 412, the shard is read again, the claim chooses
again on it); a shard whose cache is old, or that lost a race lately (unless this process
just confirmed it), is read first; the dependencies in other shards are read fresh
whatever is cached. On ``MemoryStore``, each
agent its own task object (its own cache, as another process), and a monotonic clock that
moves only when a test moves it."""

from __future__ import annotations

import uuid

import pytest

import objmanifest as om
from objmanifest.cas.policy import CasPolicy
from objmanifest.core.runtime import Runtime
from objmanifest.core.states import State
from objmanifest.errors import NotClaimable
from objmanifest.store import MemoryStore
from tests.support.internals import engine

FRESH = CasPolicy().fresh_seconds


class Monotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Rig:
    """Ours (``task``, ``agent``) and a rival's task object on one in-memory bucket."""

    def __init__(self, stages: list[str], files: list[tuple[str, str]]) -> None:
        bucket = f"claim-base-{uuid.uuid4().hex}"
        self.clock = Monotonic()
        self.store = MemoryStore(bucket, "p", runtime=Runtime(monotonic=self.clock))
        self.task = om.Task.create(self.store, "job", stages=stages, lease_seconds=600)
        self.task.declare_many(files)
        self.rival = om.Task.open(MemoryStore(bucket, "p"), "job")
        self.agent = self.task.agent("ann")

    def calls(self) -> dict[str, int]:
        return dict(self.store.faults.calls)

    def forget_calls(self) -> None:
        self.store.faults.calls.clear()


@pytest.fixture
def rig() -> Rig:
    return Rig(["s"], [(f"f{i}", "s") for i in range(4)])


def test_a_warm_claim_and_put_cost_three_puts_and_no_read(rig: Rig) -> None:
    first = rig.agent.claim(stage="s")  # the declaration's write left the shard cached
    assert first is not None
    rig.agent.put(first, b"one")
    rig.forget_calls()

    claim = rig.agent.claim(stage="s")
    assert claim is not None
    rig.agent.put(claim, b"two")
    assert rig.calls() == {"put": 3}  # the claim's, the data's, the ready one
    assert claim.file_id not in {first.file_id}
    assert rig.rival.entry(claim.file_id).state is State.ready


def test_a_stale_cache_loses_its_write_and_the_claim_chooses_again(rig: Rig) -> None:
    mine = engine(rig.task).read_shard("s")
    taken = rig.rival.agent("rex").claim(stage="s")  # what our cache would choose first
    assert taken is not None
    assert mine.entries[taken.file_id].state is State.pending  # our cache is stale
    rig.forget_calls()

    claim = rig.agent.claim(stage="s")
    assert claim is not None
    assert claim.file_id != taken.file_id
    assert rig.calls() == {"put": 2, "get": 1}  # the 412, the re-read, the write that won
    assert engine(rig.task).docs.stats.conflicts == 1
    held = rig.rival.entry(taken.file_id)
    assert (held.state, held.owner, held.epoch) == (State.writing, "rex", 1)
    assert rig.rival.entry(claim.file_id).owner == "ann"


def test_a_stale_cache_does_not_claim_an_entry_taken_meanwhile_by_its_id(rig: Rig) -> None:
    engine(rig.task).read_shard("s")
    rig.rival.agent("rex").claim("f0")
    with pytest.raises(NotClaimable, match="f0"):
        rig.agent.claim("f0")  # pending in our cache: a 412, then refused on a fresh read
    assert rig.rival.entry("f0").owner == "rex"


def test_a_stale_cache_with_nothing_claimable_reads_and_finds_what_was_declared_since() -> None:
    rig = Rig(["s"], [("f0", "s")])
    only = rig.agent.claim(stage="s")
    assert only is not None
    rig.rival.declare("late", "s")  # not in our cache
    claim = rig.agent.claim(stage="s")
    assert claim is not None
    assert claim.file_id == "late"


def test_a_lost_race_makes_the_next_claims_read_the_shard_first(rig: Rig) -> None:
    engine(rig.task).read_shard("s")
    rig.rival.agent("rex").claim(stage="s")
    assert rig.agent.claim(stage="s") is not None  # a 412 on the stale cache
    rig.forget_calls()

    rig.clock.t += FRESH - 0.25  # the claim's PUT confirmed its version, but the race is recent
    assert rig.agent.claim(stage="s") is not None
    assert rig.calls() == {"get": 1, "put": 1}  # a 304, then the claim's PUT
    rig.clock.t += 0.25
    rig.forget_calls()
    assert rig.agent.claim(stage="s") is not None
    assert rig.calls() == {"put": 1}  # quiet for fresh_seconds: no read again


def test_a_cache_confirmed_longer_ago_than_fresh_seconds_is_read_first(rig: Rig) -> None:
    engine(rig.task).read_shard("s")
    rig.clock.t += FRESH
    rig.forget_calls()
    assert rig.agent.claim(stage="s") is not None
    assert rig.calls() == {"get": 1, "put": 1}


def test_a_dependency_in_another_shard_is_read_fresh_though_both_shards_are_cached() -> None:
    rig = Rig(["a", "b"], [("a1", "a")])
    rig.task.declare("b1", "b", depends_on=["a1"])
    engine(rig.task).read_shard("a")  # a1 pending in our cache, and stays so
    maker = rig.rival.agent("rex")
    made = maker.claim("a1")
    maker.put(made, b"a1")
    assert engine(rig.task).docs.likely_current(engine(rig.task).layout.shard("a"))
    rig.forget_calls()

    claim = rig.agent.claim(stage="b")
    assert claim is not None
    assert claim.file_id == "b1"
    assert rig.calls() == {"get": 2, "put": 1}  # the index and shard a, fresh; b's PUT


def test_an_entry_declared_since_the_cache_has_its_dependencies_read_fresh() -> None:
    """The cached shard lacks the entry: the claim finds nothing on it, re-reads, and the
    new entry's dependency in another shard is read then (not taken as undeclared)."""
    rig = Rig(["a", "b"], [("a1", "a"), ("b0", "b")])
    rig.agent.claim("b0")  # shard b cached, confirmed by our write
    maker = rig.rival.agent("rex")
    made = maker.claim("a1")
    maker.put(made, b"a1")
    rig.rival.declare("b1", "b", depends_on=["a1"])

    claim = rig.agent.claim(stage="b")
    assert claim is not None
    assert claim.file_id == "b1"
