"""The store model of the capacity runs (``tests/support/storemodel.py`` on the
discrete-event scheduler of ``tests/support/des.py``): it enforces its profile's limits
with the services' answers, and a capacity run of the real agents on it replays exactly for
a seed and breaks no invariant. Small agent counts, simulated time only: nothing here is
timed.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from bench import capacity
from objmanifest.errors import StoreError
from objmanifest.store import CREATE, PutMode, memory
from objmanifest.store.errors import PreconditionFailed
from tests.support.des import Scheduler
from tests.support.storemodel import PROFILES, Latency, Limit, ModelStore, Profile, StoreModel


@pytest.fixture
def bucket() -> Iterator[str]:
    name = f"model-{uuid.uuid4().hex[:8]}"
    yield name
    memory._BUCKETS.pop(name, None)


def writers(
    profile: Profile, bucket: str, n: int, key: str = "k/object", rounds: int = 1
) -> tuple[Counter[str], StoreModel]:
    """``n`` fibers, all starting at the same instant, each making ``rounds`` read-then-
    conditional-write attempts on one object: what each attempt was answered."""
    sched = Scheduler()
    model = StoreModel(profile, sched, bucket)
    answers: Counter[str] = Counter()
    seed = ModelStore(model, sched.runtime("seed"), "seed")

    def create() -> None:
        seed.put(key, b"0", mode=CREATE)

    def writer(i: int) -> None:
        store = ModelStore(model, sched.runtime(f"w{i}"), f"w{i}")
        for _ in range(rounds):
            blob = store.get(key)
            assert blob is not None
            try:
                store.put(key, f"{i}".encode(), mode=PutMode.update(blob.etag))
                answers["ok"] += 1
            except PreconditionFailed as e:
                answers[e.answer] += 1
            except StoreError:
                answers["gave up"] += 1

    sched.spawn(create, "create")
    for i in range(n):
        sched.spawn(lambda i=i: writer(i), f"w{i}", at=1.0)
    sched.run(120.0)
    sched.shutdown()
    assert sched.errors == []
    return answers, model


def test_a_write_in_flight_gets_409_and_a_stale_one_412_on_s3(bucket: str) -> None:
    answers, model = writers(PROFILES["s3-standard"], bucket, 20)
    assert answers["ok"] >= 1
    assert answers["409"] >= 1  # arrived while the first accepted write was in flight
    assert answers["ok"] + answers["409"] + answers["412"] == 20
    assert model.max_object_cas_per_s <= 15


def test_one_object_never_takes_more_conditional_writes_per_second_than_its_profile(
    bucket: str,
) -> None:
    """A writer whose writes take a millisecond, writing as fast as it can: the object
    takes one every 1/rate seconds, no more."""
    fast = dataclasses.replace(
        PROFILES["s3-express"], cas=Latency(0.001, 0.002), cas_per_object=10.0
    )
    sched = Scheduler()
    model = StoreModel(fast, sched, bucket)
    landed: list[float] = []

    def writer() -> None:
        store = ModelStore(model, sched.runtime("w"), "w")
        etag = store.put("k/object", b"0", mode=CREATE)
        while sched.now < 5.0:
            etag = store.put("k/object", b"x", mode=PutMode.update(etag))
            landed.append(sched.now)

    sched.spawn(writer, "w")
    sched.run(10.0)
    sched.shutdown()
    assert sched.errors == []
    assert model.max_object_cas_per_s == 10
    assert 45 <= len(landed) <= 51  # five seconds of ten a second, not five thousand


def test_gcs_throttles_a_second_write_to_one_object_within_a_second(bucket: str) -> None:
    answers, model = writers(PROFILES["gcs"], bucket, 5, rounds=3)
    assert answers["ok"] >= 3
    assert model.counts.busy > 0  # 429s, retried by the client
    assert model.counts.retries > 0
    assert model.max_object_cas_per_s == 1


def test_a_prefix_over_its_rate_is_throttled_retried_and_never_served_beyond_it(
    bucket: str,
) -> None:
    narrow = dataclasses.replace(
        PROFILES["s3-standard"],
        limits=(Limit("prefix", reads=20, writes=10),),
        cas_per_object=None,
    )
    sched = Scheduler()
    model = StoreModel(narrow, sched, bucket)
    done: Counter[str] = Counter()

    def agent(i: int) -> None:
        store = ModelStore(model, sched.runtime(f"a{i}"), f"a{i}")
        for n in range(10):
            try:
                store.put(f"hot/{i}-{n}", b"x", mode=CREATE)
                store.get(f"hot/{i}-{n}")
                store.put(f"cold{i}/{n}", b"x", mode=CREATE)
                done["ok"] += 1
            except StoreError:
                done["gave up"] += 1

    for i in range(10):
        sched.spawn(lambda i=i: agent(i), f"a{i}")
    sched.run(300.0)
    sched.shutdown()
    assert model.counts.throttled > 0 and model.counts.retries > 0
    maxima = model.scope_maxima()
    assert max(maxima.values()) <= 20
    assert all(n <= 10 for scope, n in maxima.items() if scope.endswith("(writes)"))
    assert done["ok"] + done["gave up"] == 100


def test_gcs_clients_pace_their_writes_once_throttled_and_are_throttled_far_less(
    bucket: str,
) -> None:
    """Twenty clients writing as fast as they can into a bucket that takes twenty writes a
    second: paced as ``GCSStore`` paces them (``SendRate``), every write lands and a small
    share is throttled; sent again by the backoff alone, many more are."""
    tight = dataclasses.replace(
        PROFILES["gcs"], limits=(Limit("bucket", writes=20),), cas_per_object=None
    )
    unpaced = dataclasses.replace(tight, retry=dataclasses.replace(tight.retry, paced=False))

    def throttled(profile: Profile) -> tuple[int, int]:
        sched = Scheduler()
        model = StoreModel(profile, sched, f"{bucket}-{profile.retry.paced}")
        landed = Counter[str]()

        def client(i: int) -> None:
            store = ModelStore(model, sched.runtime(f"c{i}"), f"c{i}")
            for n in range(20):
                store.put(f"k/{i}-{n}", b"x", mode=CREATE)
                landed["ok"] += 1

        for i in range(20):
            sched.spawn(lambda i=i: client(i), f"c{i}")
        sched.run(600.0)
        sched.shutdown()
        memory._BUCKETS.pop(model.bucket, None)
        assert sched.errors == []
        assert model.max_scope_requests_per_s <= 20
        return landed["ok"], model.counts.throttled

    (paced_landed, paced), (unpaced_landed, backoff_only) = throttled(tight), throttled(unpaced)
    assert paced_landed == unpaced_landed == 400
    assert 0 < paced < backoff_only / 2


def test_a_capacity_run_replays_exactly_for_its_seed_and_breaks_no_invariant() -> None:
    plan = capacity.Plan("s3-standard", agents=8, partitions=4, seconds=3.0, warmup=1.0, seed=3)
    first, again = capacity.run(plan), capacity.run(plan)
    same = ("entries", "p50_s", "p99_s", "requests", "by_request", "conflicts_per_commit")
    assert {k: first[k] for k in same} == {k: again[k] for k in same}
    assert first["entries"] > 0
    assert first["violations"] == 0 and first["escaped"] == []
    other = capacity.run(dataclasses.replace(plan, seed=4))
    assert other["by_request"] != first["by_request"]


def test_greenlets_and_threads_run_a_seed_alike() -> None:
    """Fibers as greenlets share one thread; as threads they are what the library meets in
    production. A run is the same either way."""
    plan = capacity.Plan("s3-standard", agents=8, partitions=4, seconds=3.0, warmup=1.0, seed=5)
    green, threads = capacity.run(plan), capacity.run(dataclasses.replace(plan, threads=True))
    same = ("entries", "p50_s", "p99_s", "requests", "by_request", "conflicts_per_commit")
    assert {k: green[k] for k in same} == {k: threads[k] for k in same}
    assert threads["threads"] >= 8 and green["threads"] == 0


def test_agents_sharing_one_shard_lose_races_and_the_object_stays_within_its_rate() -> None:
    plan = capacity.Plan("s3-standard", agents=12, layout="stage", seconds=4.0, warmup=1.0)
    result = capacity.run(plan)
    assert result["busy"] > 0 and result["stale"] > 0  # 409s and 412s
    assert result["conflicts_per_commit"] > 0.3
    assert result["max_object_cas_per_s"] <= 15
    assert result["entries_per_s"] <= 7.5  # two conditional writes per entry, one object
    assert result["violations"] == 0 and result["escaped"] == []
