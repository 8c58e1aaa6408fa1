"""Claims by stage of a split stage start at the agent's home partition (``Agent._home_of``):
at first a random one, then the last one it claimed from, until a race for it is lost,
when the agent moves to a random other partition. While it has no settled home, it passes
over partitions where another agent holds a lease, if others remain. So agents of one hot
stage spread out until each has a partition of its own, and an agent alone keeps the shard
it writes warm.

On ``MemoryStore``, each agent its own task object (its own cache, as another process), a
monotonic clock that moves only when a test moves it, and ``random`` scripted."""

from __future__ import annotations

import uuid
from itertools import groupby

import objmanifest as om
from objmanifest.core.layout import partition_of
from objmanifest.core.runtime import Runtime
from objmanifest.store import MemoryStore
from tests.support.internals import engine

PARTS = 4


class Script:
    """``random`` answering from a list, then 0.0."""

    def __init__(self) -> None:
        self.answers: list[float] = []

    def __call__(self) -> float:
        return self.answers.pop(0) if self.answers else 0.0


def make_task(bucket: str, script: Script, files: int = 40) -> om.Task:
    runtime = Runtime(monotonic=lambda: 1000.0, random=script)
    store = MemoryStore(bucket, "p", runtime=runtime)
    try:
        task = om.Task.create(store, "job", stages=["s"], partitions={"s": PARTS})
        task.declare_many([(f"f{i:02d}", "s") for i in range(files)])
    except om.ObjManifestError:
        task = om.Task.open(store, "job")
    return task


def partition(claim: om.Claim | None) -> int:
    assert claim is not None
    return partition_of(claim.file_id, PARTS)


def drained(task: om.Task, n: int) -> bool:
    shard = engine(task).read_shard(f"s~{n}")
    return all(e.state is not om.State.pending for e in shard.entries.values())


def test_an_agent_stays_on_its_partition_until_it_has_nothing_claimable() -> None:
    script = Script()
    task = make_task(f"homes-{uuid.uuid4().hex}", script)
    agent = task.agent("ann")
    script.answers = [0.6]  # the first claim starts at partition 2 of 4
    order = [partition(agent.claim(stage="s")) for _ in range(40)]
    assert agent.claim(stage="s") is None
    visits = [n for n, _ in groupby(order)]
    assert visits == [2, 3, 0, 1]  # each drained in turn, in partition order from the first


def test_each_new_agent_starts_at_a_random_partition() -> None:
    script = Script()
    bucket = f"homes-{uuid.uuid4().hex}"
    make_task(bucket, script)
    starts = []
    for i, rand in enumerate([0.1, 0.3, 0.55, 0.99]):
        script.answers = [rand]
        starts.append(partition(make_task(bucket, script).agent(f"a{i}").claim(stage="s")))
    assert starts == [0, 1, 2, 3]


def test_the_agent_that_loses_a_race_for_its_partition_moves_to_a_random_other() -> None:
    script = Script()
    bucket = f"homes-{uuid.uuid4().hex}"
    ann_task, bob_task = make_task(bucket, script), make_task(bucket, script)
    ann, bob = ann_task.agent("ann"), bob_task.agent("bob")
    engine(bob_task).read_shard("s~0")  # bob's cache: partition 0 before ann's claim
    assert partition(ann.claim(stage="s")) == 0
    # bob starts at partition 0 too; his cache misses ann's claim, so he sees nobody there,
    # and his write meets a 412. Then 0.7 of the three others sends him to partition 3.
    script.answers = [0.0, 0.7]
    assert partition(bob.claim(stage="s")) == 0
    assert engine(bob_task).docs.stats.conflicts == 1
    assert [partition(bob.claim(stage="s")) for _ in range(3)] == [3, 3, 3]
    engine(ann_task).read_shard("s~0")  # ann's cache holds bob's claim there
    assert [partition(ann.claim(stage="s")) for _ in range(3)] == [0, 0, 0]
    assert engine(ann_task).docs.stats.conflicts == 0
    assert engine(bob_task).docs.stats.conflicts == 1


def test_an_agent_looking_for_a_home_passes_over_partitions_others_work_in() -> None:
    script = Script()
    bucket = f"homes-{uuid.uuid4().hex}"
    make_task(bucket, script)
    holders = [make_task(bucket, script).agent(f"h{n}") for n in range(PARTS)]
    for n, holder in enumerate(holders[:2]):  # partitions 0 and 1 each have a holder
        script.answers = [n / PARTS]
        assert partition(holder.claim(stage="s")) == n
    script.answers = [0.0]  # a new agent starts at partition 0
    newcomer = make_task(bucket, script).agent("new")
    assert partition(newcomer.claim(stage="s")) == 2  # the first one nobody works in
    assert partition(newcomer.claim(stage="s")) == 2  # and it stays


def test_where_every_partition_has_a_holder_the_first_one_looked_at_is_taken() -> None:
    script = Script()
    bucket = f"homes-{uuid.uuid4().hex}"
    make_task(bucket, script)
    for n in range(PARTS):
        script.answers = [n / PARTS]
        holder = make_task(bucket, script).agent(f"h{n}")
        assert partition(holder.claim(stage="s")) == n
    script.answers = [0.5]
    assert partition(make_task(bucket, script).agent("new").claim(stage="s")) == 2


def test_a_claim_that_finds_nothing_at_home_leaves_home_where_it_found_some() -> None:
    script = Script()
    task = make_task(f"homes-{uuid.uuid4().hex}", script, files=40)
    agent, other = task.agent("ann"), task.agent("bob")
    assert partition(agent.claim(stage="s")) == 0
    for entry in engine(task).read_shard("s~0").entries.values():  # another agent empties it
        if entry.state is om.State.pending:
            other.claim(entry.file_id)
    assert drained(task, 0)
    assert partition(agent.claim(stage="s")) == 1
    assert partition(agent.claim(stage="s")) == 1
