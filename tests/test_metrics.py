"""Prometheus metrics on every backend: after a scripted run (claims, a finish, failures to
death, a takeover, a reap, a consume, a lost race) every value is what happened, read back
through the registry and its ASGI app."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import objmanifest as om
from tests.support.internals import engine

pytestmark = pytest.mark.behaviour

BOUND = 120.0
"""How long a poll for an expired lease may go on (a bound, not a measurement)."""


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"task": "job", **labels})


def take_over(task: om.Task, agent: str, file_id: str) -> om.Claim:
    """Claim ``file_id`` once its holder's lease expired."""
    deadline = task.store.now() + timedelta(seconds=BOUND)
    while True:
        try:
            claim = task.agent(agent).claim(file_id)
        except om.NotClaimable:
            assert task.store.now() < deadline
            task.store.runtime.sleep(0.2)
            continue
        assert claim is not None
        return claim


def reap_when_expired(task: om.Task) -> list[om.Entry]:
    deadline = task.store.now() + timedelta(seconds=BOUND)
    while not (reaped := task.reap()):
        assert task.store.now() < deadline
        task.store.runtime.sleep(0.2)
    return reaped


def scripted_run(task: om.Task) -> None:
    task.declare_many([("x", "a"), ("y", "a"), ("z", "a"), ("q", "a")])
    ann, bob = task.agent("ann"), task.agent("bob")
    claim = ann.claim("x")
    assert claim is not None
    ann.put(claim, b"12345")  # 5 bytes up
    for _ in range(2):  # max_retries=1: the second failure kills it
        claim = ann.claim("y")
        assert claim is not None
        ann.fail(claim, "boom")
    assert task.entry("y").state is om.State.dead
    assert ann.claim("z") is not None
    taken = take_over(task, "bob", "z")  # one takeover, one retry spent by a claim
    bob.put(taken, b"1234567")  # 7 bytes up
    assert ann.claim("q") is not None
    assert [e.file_id for e in reap_when_expired(task)] == ["q"]
    assert task.agent("c").consume("x") == b"12345"  # 5 bytes down


def test_values_after_a_scripted_run_match_what_happened(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["a", "b"], lease_seconds=1, max_retries=1)
    registry = CollectorRegistry()
    metrics = om.metrics.register(task, registry=registry, cache_seconds=0)
    assert metrics.registry is registry
    seen: list[str] = []
    task.subscribe(lambda e: seen.append(e.command))
    scripted_run(task)
    # A lost race: another process's Task changes shard a behind this one's cached version.
    task.declare("mine", stage="b")
    held = task.agent("ann").claim("mine")
    assert held is not None
    om.Task.open(store, "job").declare("other", stage="b")
    conflicts = engine(task).docs.stats.conflicts
    task.agent("ann").renew(held)
    assert engine(task).docs.stats.conflicts == conflicts + 1

    commits = {c: seen.count(c) for c in set(seen)}
    assert commits["claim"] == 7  # x, y twice, z by ann and by bob, q, mine
    assert (commits["finish"], commits["fail"], commits["consume"]) == (2, 2, 1)
    for command, n in commits.items():
        assert value(registry, "objmanifest_commits_total", command=command) == n
        # Every commit in the latency histogram of its command, each having taken some time.
        assert value(registry, "objmanifest_commit_seconds_count", command=command) == n
        inf = value(registry, "objmanifest_commit_seconds_bucket", command=command, le="+Inf")
        assert inf == n
        assert (value(registry, "objmanifest_commit_seconds_sum", command=command) or 0) > 0
    assert value(registry, "objmanifest_commit_seconds_count", command="revive") is None
    assert value(registry, "objmanifest_retries_total", command="fail") == 2
    assert value(registry, "objmanifest_retries_total", command="claim") == 1
    assert value(registry, "objmanifest_retries_total", command="reap") == 1
    assert value(registry, "objmanifest_takeovers_total") == 1
    assert value(registry, "objmanifest_reaps_total") == 1
    assert value(registry, "objmanifest_deaths_total", command="fail") == 1
    assert value(registry, "objmanifest_bytes_total", direction="up") == 12
    assert value(registry, "objmanifest_bytes_total", direction="down") == 5
    stats = engine(task).docs.stats
    assert value(registry, "objmanifest_cas_conflicts_total") == stats.conflicts >= 1
    assert value(registry, "objmanifest_cas_writes_total") == stats.writes
    assert value(registry, "objmanifest_cas_lost_responses_total") == stats.lost_responses == 0

    def entries(stage: str, state: str) -> float | None:
        return value(registry, "objmanifest_entries", stage=stage, state=state)

    # x consumed, y dead, z ready, q failed (reaped)
    assert [entries("a", s.value) for s in om.State] == [0, 0, 1, 1, 1, 1]
    assert (entries("b", "pending"), entries("b", "writing")) == (1, 1)
    assert value(registry, "objmanifest_attention_entries", stage="a", kind="dead") == 1
    assert value(registry, "objmanifest_attention_entries", stage="a", kind="late") == 0

    text = asyncio.run(scrape(om.metrics.asgi_app(registry)))
    assert 'objmanifest_takeovers_total{task="job"} 1.0' in text
    assert 'objmanifest_commit_seconds_count{command="fail",task="job"} 2.0' in text
    assert 'objmanifest_entries{stage="a",state="dead",task="job"} 1.0' in text

    metrics.stop()
    assert registry.get_sample_value("objmanifest_takeovers_total", {"task": "job"}) is None
    task.declare("after", stage="b")  # no longer counted
    assert metrics.count("commits", "declare") == commits["declare"]


def test_the_status_gauges_are_cached(task: om.Task) -> None:
    registry = CollectorRegistry()
    metrics = om.metrics.register(task, registry=registry, cache_seconds=3600)
    task.declare("a", stage="collect")
    assert value(registry, "objmanifest_entries", stage="collect", state="pending") == 1
    task.declare("b", stage="collect")
    assert value(registry, "objmanifest_entries", stage="collect", state="pending") == 1
    metrics.cache_seconds = 0
    assert value(registry, "objmanifest_entries", stage="collect", state="pending") == 2


def test_commit_latency_falls_in_the_first_bucket_that_holds_it(task: om.Task) -> None:
    registry = CollectorRegistry()
    metrics = om.metrics.register(task, registry=registry, cache_seconds=3600)
    at = task.store.now()
    for seconds in (0.0005, 0.001, 0.0011, 30.0, 31.0):
        metrics.observe(om.CommitEvent("k", 1, "claim", "ann", "c", at, (), seconds))

    def bucket(le: str) -> float | None:
        return value(registry, "objmanifest_commit_seconds_bucket", command="claim", le=le)

    assert om.metrics.COMMIT_BUCKETS[0] == 0.001 and om.metrics.COMMIT_BUCKETS[-1] == 30.0
    assert (bucket("0.001"), bucket("0.0025"), bucket("10.0"), bucket("30.0")) == (2, 3, 3, 4)
    assert bucket("+Inf") == 5
    total = value(registry, "objmanifest_commit_seconds_sum", command="claim")
    assert total == pytest.approx(0.0005 + 0.001 + 0.0011 + 30.0 + 31.0)


OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def test_the_docs_list_every_metric_with_its_labels(task: om.Task) -> None:
    """The metrics table of docs/operations.md names every family with its labels."""
    registry = CollectorRegistry()
    om.metrics.register(task, registry=registry, cache_seconds=0)
    task.declare("a", stage="collect")
    claim = task.agent("ann").claim("a")
    assert claim is not None
    task.agent("ann").put(claim, b"abc")
    task.agent("bob").consume("a")
    exposed: dict[str, set[str]] = {}
    for family in registry.collect():
        suffix = "_total" if family.type == "counter" else ""
        labels = exposed.setdefault(family.name + suffix, set())
        for found in family.samples:
            labels.update(set(found.labels) - {"task"})
    rows = re.findall(r"^\| `(objmanifest_\w+)` \|[^|]+\|([^|]*)\|", OPERATIONS.read_text(), re.M)
    listed = {name: set(re.findall(r"`(\w+)`", labels)) for name, labels in rows}
    assert set(listed) == set(exposed)
    for name, labels in exposed.items():
        assert labels <= listed[name], name  # those a sample had here, at least
    assert listed["objmanifest_commit_seconds"] == {"command", "le"}


async def scrape(app: Any) -> str:
    """GET /metrics from an ASGI app, as a server would."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    return b"".join(m.get("body", b"") for m in sent[1:]).decode()


def test_request_counts_are_a_snapshot_of_what_the_task_object_sent() -> None:
    task = om.Task.create(om.MemoryStore("counts", "p"), "job", stages=["a"])
    assert task.request_counts() == dict.fromkeys(
        [
            "commits",
            "grouped",
            "conflicts",
            "reads",
            "not_modified",
            "lost_responses",
            "journal_blocks",
            "writes",
        ],
        0,
    )
    task.declare("x", "a")  # the index, then the shard: two commits, two PUTs
    counts = task.request_counts()
    assert (counts["commits"], counts["writes"], counts["conflicts"]) == (2, 2, 0)
    counts["commits"] = 99  # a snapshot: changing it changes nothing
    task.entry("x")  # reads what it committed: 304s
    again = task.request_counts()
    assert again["commits"] == 2 and again["not_modified"] > counts["not_modified"]
    assert again["reads"] > counts["reads"]
