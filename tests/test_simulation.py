"""The deterministic simulation (``tests/support/sim.py``): the CI seeds break no invariant, a seed
replays exactly, each deliberately broken variant of the library is caught within the CI
seeds, and the bugs the simulation found stay fixed.

``OBJMANIFEST_SIM_SEEDS=0-499`` runs those seeds instead of the CI ones.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest

from objmanifest.core.states import State
from objmanifest.errors import LeaseLost
from objmanifest.store.errors import NoSuchObject, OutcomeUnknown
from objmanifest.store.memory import MemoryStore
from objmanifest.task import Task
from tests.support import checker, sim
from tests.support.internals import engine
from tests.support.stores import ManualClock

CI_SEEDS = sim.seeds_of(os.environ.get("OBJMANIFEST_SIM_SEEDS", "0-19"))


def test_the_ci_seeds_break_no_invariant_and_every_fault_happens() -> None:
    totals = sim.Totals()
    for seed in CI_SEEDS:
        totals.add(sim.simulate(seed))
    report = "\n".join(totals.lines())
    assert totals.failing == [], report
    assert totals.unsettled == 0, report
    assert sum(totals.ops.values()) >= 200 * len(CI_SEEDS), report
    assert set(totals.ops) == set(checker.KINDS), report
    # The shell agents (a process per call, claims rebuilt from what claim printed) work.
    assert min(totals.by_shells[k] for k in (checker.CLAIM, checker.RENEW, checker.PUT)) > 0
    assert set(totals.outcomes) == {checker.OK, checker.UNKNOWN, checker.REFUSED}, report
    faults = {"503", "lost", "dropped", "cut", "stall", "slow", "clock-jump", "kill", "rot"}
    assert set(totals.faults) == faults, report


def test_a_seed_replays_exactly() -> None:
    first, again = sim.simulate(7), sim.simulate(7)
    assert first.log.lines() == again.log.lines()
    assert (first.steps, first.faults, first.sim_seconds) == (
        again.steps,
        again.faults,
        again.sim_seconds,
    )
    other = sim.simulate(8)
    assert other.log.lines() != first.log.lines()


# -- deliberately broken variants -----------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(sim.BROKEN))
def test_a_broken_variant_is_caught_within_the_ci_seeds(
    monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    plant, expected = sim.BROKEN[variant]
    plant(monkeypatch.setattr)
    for seed in CI_SEEDS:
        found = Counter(v.invariant for v in sim.simulate(seed).violations)
        if found[expected]:
            return
    pytest.fail(f"no seed of {CI_SEEDS[0]}..{CI_SEEDS[-1]} broke {expected}")


# -- the bugs it found ------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> Iterator[MemoryStore]:
    yield MemoryStore(f"sim-bugs-{uuid.uuid4().hex[:12]}", clock=clock)


def fenced_holder(store: MemoryStore, clock: ManualClock) -> tuple[Task, object]:
    """A task where ``old`` holds a claim that ``new`` has since taken over."""
    task = Task.create(store, "job", ["make"], lease_seconds=10)
    task.declare("a", "make")
    old = task.agent("old").claim("a")
    clock.now += timedelta(seconds=30)
    assert task.agent("new").claim("a") is not None
    return task, old


def test_a_fenced_put_whose_cleanup_delete_answer_is_lost_is_still_lease_lost(
    store: MemoryStore, clock: ManualClock
) -> None:
    """Seed 7: the fenced holder's delete of its own object lost its answer, and
    ``OutcomeUnknown`` escaped ``put`` (``MemoryStore`` said it, ``S3Store`` says
    ``StoreError``)."""
    task, old = fenced_holder(store, clock)
    store.faults.add("delete", "/data/", effect="lose")
    deletes = store.faults.calls["delete"]
    with pytest.raises(LeaseLost):
        task.agent("old").put(old, b"late bytes")  # type: ignore[arg-type]
    assert store.faults.calls["delete"] == deletes + 1
    with pytest.raises(NoSuchObject):  # the delete was applied all the same
        store.head(engine(task).layout.data("make", "a", 1))


def test_gc_whose_delete_answer_is_lost_reports_it_and_lets_nothing_out(
    store: MemoryStore, clock: ManualClock
) -> None:
    """Seed 3: ``gc`` removing a fenced holder's data lost the delete's answer."""
    task, _ = fenced_holder(store, clock)
    fenced = engine(task).layout.data("make", "a", 1)
    store.put(fenced, b"a fenced holder's bytes")
    store.faults.add("delete", fenced, effect="lose")
    report = task.gc()
    assert len(report.errors) == 1
    assert report.errors[0].startswith(f"could not remove {store.describe(fenced)}: ")
    with pytest.raises(NoSuchObject):
        store.head(fenced)
    assert task.gc().errors == []


def consumed_task(store: MemoryStore) -> Task:
    task = Task.create(store, "job", ["make"])
    task.declare("a", "make")
    worker = task.agent("p")
    claim = worker.claim("a")
    assert claim is not None
    worker.put(claim, b"bytes")
    worker.consume("a")
    return task


def archive_objects(store: MemoryStore) -> list[str]:
    return sorted(store.list_keys("job/archive/"))


def test_an_archive_whose_object_answer_is_lost_adopts_its_own_object(
    store: MemoryStore,
) -> None:
    """Seed 0: the create-only PUT of the archive object lost its answer, and
    ``OutcomeUnknown`` escaped ``Task.archive``."""
    task = consumed_task(store)
    store.faults.add("put", "/archive/", effect="lose")
    report = task.archive(older_than=0)
    assert report.archived == {"make": ["a"]}
    assert report.objects == archive_objects(store) and len(report.objects) == 1
    assert task.entry("a").state is State.consumed
    assert task.shard("make").entries == {}


def test_an_archive_object_lost_on_its_way_is_written_again(store: MemoryStore) -> None:
    task = consumed_task(store)
    lost: list[str] = []

    def lose_request(op: str, key: str) -> None:
        if op == "put" and "/archive/" in key and not lost:
            lost.append(key)
            raise OutcomeUnknown(f"{key}: the request was lost on its way")

    store.faults.hooks.append(lose_request)
    report = task.archive(older_than=0)
    assert report.objects == lost == archive_objects(store)
    assert report.archived == {"make": ["a"]}


def test_an_archive_key_holding_other_bytes_is_left_alone_for_a_new_one(
    store: MemoryStore,
) -> None:
    """A 412 that is not our own write: the object is someone else's; archive under a
    new id, and leave that object as it is."""
    task = consumed_task(store)
    other = MemoryStore(store.bucket)
    planted: list[str] = []

    def plant(op: str, key: str) -> None:
        if op == "put" and "/archive/" in key and not planted:
            planted.append(key)
            other.put(key, b"someone else's archive object")

    store.faults.hooks.append(plant)
    report = task.archive(older_than=0)
    assert report.archived == {"make": ["a"]}
    assert len(report.objects) == 1 and report.objects != planted
    assert archive_objects(store) == sorted(planted + report.objects)
    blob = store.get(planted[0])
    assert blob is not None and blob.body == b"someone else's archive object"
