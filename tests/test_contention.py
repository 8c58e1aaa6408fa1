"""A stage whose agents collide is named by anyone who reads the task: the races a commit
lost travel in its journal record, inside the shard, so ``status``, its JSON, the command
line, the web page's data and the metrics of a process that lost nothing itself all see
it, and name the stage that needs more partitions.

The agents' runtime has a clock that does not move, so each keeps choosing on the version
it wrote last (``likely_current``) and loses a race whenever the other wrote since: the
collisions are the same on every run.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from prometheus_client import CollectorRegistry
from rich.console import Console

import objmanifest as om
from objmanifest import metrics
from objmanifest.cli.render import status_view
from objmanifest.core.runtime import DEFAULT
from objmanifest.wire.shapes import status_json

STILL = replace(DEFAULT, monotonic=lambda: 0.0)


def collided() -> tuple[om.ObjectStore, om.Task]:
    """Two agents, each with a task object of its own, produce a stage's entries in turn;
    another stage is produced by one agent alone."""
    name = f"contention-{uuid.uuid4().hex[:8]}"
    store = om.connect(f"memory://{name}/p", runtime=STILL)
    om.Task.create(store, "job", stages=["hot", "calm"])
    a, b = om.Task.open(store, "job"), om.Task.open(store, "job")
    a.declare_many(
        [(f"h{i:02d}", "hot") for i in range(24)] + [(f"c{i}", "calm") for i in range(12)]
    )
    ann, bob = a.agent("ann"), b.agent("bob")
    for i in range(0, 24, 2):
        mine, theirs = ann.claim(f"h{i:02d}"), bob.claim(f"h{i + 1:02d}")
        assert mine is not None and theirs is not None
        ann.put(mine, b"a")
        bob.put(theirs, b"b")
    for i in range(12):
        claim = ann.claim(f"c{i}")
        assert claim is not None
        ann.put(claim, b"c")
    return store, om.Task.open(store, "job")


def test_status_names_the_stage_whose_agents_lose_races_from_another_process() -> None:
    _, reader = collided()  # a third task object: it lost no race itself
    assert reader.request_counts()["conflicts"] == 0
    status = reader.status()
    assert status.contended == ["hot"]
    assert status.contention["hot"] >= 0.5 and status.contention["calm"] == 0.0
    shown = status_json(status)
    assert shown["contended"] == ["hot"] and shown["contention"]["hot"] >= 0.5
    console = Console(width=200, record=True)
    console.print(status_view(status))
    text = console.export_text()
    assert "contended hot" in text and "split it into more partitions" in text


def test_the_metrics_carry_each_stage_s_lost_races_per_commit() -> None:
    _, reader = collided()
    registry = CollectorRegistry()
    metrics.register(reader, registry)
    hot = registry.get_sample_value(
        "objmanifest_lost_races_per_commit", {"task": "job", "stage": "hot"}
    )
    calm = registry.get_sample_value(
        "objmanifest_lost_races_per_commit", {"task": "job", "stage": "calm"}
    )
    assert hot is not None and hot >= 0.5 and calm == 0.0


def test_a_task_without_collisions_names_none_and_its_json_is_as_before() -> None:
    store = om.connect(f"memory://contention-{uuid.uuid4().hex[:8]}/p", runtime=STILL)
    task = om.Task.create(store, "job", stages=["a"])
    task.declare_many([(f"x{i}", "a") for i in range(3)])
    status = task.status()
    assert status.contended == [] and status.contention == {}  # too few commits to say
    assert "contended" not in status_json(status)
