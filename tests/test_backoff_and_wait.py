"""Retry backoff, stage deadlines and waiting for stages, on every backend (Python API and
command line): a failed entry waits out its backoff on the store's clock, late entries are
listed, ``wait`` returns when stages are done, times out, and stops at a dead entry."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import objmanifest as om
from objmanifest.core.model import LAYOUT_SCHEMA
from tests import test_cli
from tests.support.internals import engine
from tests.test_cli import Cli, E

pytestmark = pytest.mark.behaviour

cli = test_cli.cli

BOUND = 120.0
"""How long a poll for something that must happen may go on (a bound, not a measurement)."""


def produce(task: om.Task, file_id: str, agent: str = "p") -> None:
    claim = task.agent(agent).claim(file_id)
    assert claim is not None
    task.agent(agent).put(claim, file_id.encode())


def fail_once(task: om.Task, file_id: str) -> om.Entry:
    agent = task.agent("w")
    claim = agent.claim(file_id)
    assert claim is not None
    agent.fail(claim, "boom")
    return task.entry(file_id)


def claim_when_free(task: om.Task, file_id: str) -> om.Claim:
    """Claim ``file_id`` as soon as its backoff has passed (refused until then)."""
    deadline = task.store.now() + timedelta(seconds=BOUND)
    while True:
        try:
            claim = task.agent("w").claim(file_id)
        except om.NotClaimable as e:
            assert e.reason.startswith("backing off until "), e.reason
            assert task.store.now() < deadline
            task.store.runtime.sleep(0.1)
            continue
        assert claim is not None
        return claim


# -- retry backoff ------------------------------------------------------------------------


def test_a_failed_entry_backs_off_doubling_per_retry(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["a"], max_retries=5, retry_backoff=3600)
    assert task.header.schema_version == LAYOUT_SCHEMA
    assert task.header.requires == "0.3.0"
    task.declare("x", stage="a")
    first = fail_once(task, "x")
    assert first.state is om.State.failed
    assert first.updated_at is not None
    assert first.retry_at == first.updated_at + timedelta(seconds=3600)
    with pytest.raises(om.NotClaimable) as refused:
        task.agent("w").claim("x")
    assert refused.value.reason.startswith(f"backing off until {first.retry_at.isoformat()}")
    assert task.agent("w").claim(stage="a") is None
    status = task.status()
    assert [(n.file_id, n.reason) for n in status.backing_off] == [
        ("x", f"may be retried from {first.retry_at.isoformat()}")
    ]
    again = om.Task.open(store, "job")
    assert engine(again).rules.retry_backoff == 3600
    assert engine(again).rules.retry_backoff_max == 3600 * 64


def test_the_backoff_passes_on_the_store_clock_and_doubles(store: om.ObjectStore) -> None:
    task = om.Task.create(
        store, "job", stages=["a"], max_retries=5, retry_backoff=1, retry_backoff_max=1.5
    )
    task.declare("x", stage="a")
    first = fail_once(task, "x")
    assert first.updated_at is not None
    assert first.retry_at == first.updated_at + timedelta(seconds=1)
    claim = claim_when_free(task, "x")
    assert claim.epoch == 2
    task.agent("w").fail(claim, "boom again")
    second = task.entry("x")
    assert second.updated_at is not None
    assert second.retry_at == second.updated_at + timedelta(seconds=1.5)  # capped, not 2 s


def test_no_backoff_by_default_and_the_header_stays_readable_by_0_2(task: om.Task) -> None:
    assert task.header.retry_backoff is None and task.header.deadlines is None
    task.declare("x", stage="collect")
    failed = fail_once(task, "x")
    assert failed.retry_at is None
    assert task.agent("w").claim("x") is not None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_backoff": -1}, "retry_backoff must be a number of seconds from 0"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a number of seconds from 0"),
        ({"retry_backoff": True}, "retry_backoff must be a number of seconds from 0"),
        ({"retry_backoff_max": 5}, "needs a retry_backoff of at most it"),
        ({"retry_backoff": 10, "retry_backoff_max": 5}, "needs a retry_backoff of at most it"),
        ({"deadlines": {"nope": 5}}, "deadlines name 'nope', which is not a stage"),
        ({"deadlines": {"a": 0}}, "the deadline of stage 'a' must be above 0 seconds"),
        ({"deadlines": [("a", 5)]}, "deadlines must map stage names to seconds"),
    ],
)
def test_bad_timing_settings_are_refused(
    store: om.ObjectStore, options: dict[str, object], message: str
) -> None:
    with pytest.raises(om.InvalidInput, match=message):
        om.Task.create(store, "job", stages=["a"], **options)  # type: ignore[arg-type]
    assert om.Task.list(store) == []


# -- deadlines ---------------------------------------------------------------------------


def test_entries_past_their_stage_deadline_are_late(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["a", "b"], deadlines={"a": 1})
    task.declare_many([("w", "a"), ("r", "a"), ("c", "a"), ("other", "b")])
    produce(task, "r")
    produce(task, "c")
    task.agent("q").consume("c")
    holder = task.agent("h")
    claim = holder.claim("w")
    assert claim is not None
    task.agent("h2").claim("other")
    status = task.status()
    deadline = task.store.now() + timedelta(seconds=BOUND)
    while len(status.late) < 2 and task.store.now() < deadline:
        status = task.status()
    entry = task.entry("w")
    ready = task.entry("r")
    assert entry.claimed_at is not None and ready.ready_at is not None
    due_w = (entry.claimed_at + timedelta(seconds=1)).isoformat()
    due_r = (ready.ready_at + timedelta(seconds=1)).isoformat()
    assert sorted((n.file_id, n.state.value, n.reason) for n in status.late) == [
        ("r", "ready", f"ready past its stage's deadline: due consumed by {due_r}"),
        ("w", "writing", f"writing past its stage's deadline: due ready by {due_w}"),
    ]
    assert status.overdue == []  # the lease (300 s) is not expired: late is not overdue
    holder.renew(claim)
    assert task.entry("w").claimed_at == entry.claimed_at


# -- waiting for stages ------------------------------------------------------------------


def test_wait_returns_once_every_entry_is_ready_counting_entries_declared_meanwhile(
    task: om.Task,
) -> None:
    assert task.wait(["collect"], timeout=0) == {}
    task.declare_many([("a", "collect"), ("b", "collect"), ("w", "write")])
    produce(task, "a")
    polling = threading.Event()
    result: dict[str, object] = {}

    def declare_more(waiting: list[str]) -> None:
        assert waiting == ["b"]
        task.declare("c", stage="collect")
        polling.set()

    def run() -> None:
        result["found"] = task.wait(["collect"], timeout=BOUND, on_wait=declare_more)

    waiter = threading.Thread(target=run)
    waiter.start()
    assert polling.wait(BOUND)
    produce(task, "b")
    produce(task, "c")
    waiter.join(BOUND)
    assert result["found"] == {s: om.State.ready for s in ("a", "b", "c")}
    task.agent("q").consume("a")
    assert task.wait(["collect"], until="ready", timeout=0)["a"] is om.State.consumed
    with pytest.raises(om.WaitTimeout) as late:
        task.wait(["collect"], until="consumed", timeout=0)
    assert late.value.file_ids == ("b", "c")
    assert "waiting for 2 entries of collect to be consumed: b, c" in str(late.value)
    with pytest.raises(om.WaitTimeout) as everything:
        task.wait(timeout=0.5)
    assert everything.value.file_ids == ("w",)


def test_wait_stops_at_once_at_a_dead_entry(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["a"], max_retries=0)
    task.declare_many([("d", "a"), ("p", "a")])
    fail_once(task, "d")
    with pytest.raises(om.DeadWaitedFor) as dead:
        task.wait(["a"])  # no timeout: it must not wait at all
    assert dead.value.file_ids == ("d",)
    assert "d of a is dead" in str(dead.value)


def test_wait_refuses_bad_arguments(task: om.Task) -> None:
    with pytest.raises(om.InvalidInput, match="until must be 'ready' or 'consumed'"):
        task.wait(until="done")
    with pytest.raises(om.NotFound):
        task.wait(["nope"])
    with pytest.raises(om.InvalidInput, match="not the string"):
        task.wait("collect")
    with pytest.raises(om.InvalidInput, match="timeout must be"):
        task.wait(timeout=-1)


def test_outstanding_is_one_look_at_what_wait_waits_for(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["a", "b"], max_retries=0)
    assert task.outstanding() == ({}, [])
    task.declare_many([("r", "a"), ("p", "a"), ("q", "b")])
    produce(task, "r")
    assert task.outstanding(["a"]) == ({"r": om.State.ready, "p": om.State.pending}, ["p"])
    assert sorted(task.outstanding(["a"], until="consumed")[1]) == ["p", "r"]
    found, waiting = task.outstanding()
    assert set(found) == {"r", "p", "q"} and sorted(waiting) == ["p", "q"]
    assert task.outstanding(iter(["a", "a"]))[1] == ["p"]  # any iterable, each stage once
    fail_once(task, "q")
    with pytest.raises(om.DeadWaitedFor) as dead:
        task.outstanding(["b"])
    assert dead.value.file_ids == ("q",)
    assert task.outstanding(["a"])[1] == ["p"]  # the dead entry is of another stage
    with pytest.raises(om.InvalidInput, match="until must be 'ready' or 'consumed'"):
        task.outstanding(until="done")
    with pytest.raises(om.NotFound, match="its stages are a, b"):
        task.outstanding(["nope"])
    with pytest.raises(om.InvalidInput, match="not the string"):
        task.outstanding("a")


# -- the command line ----------------------------------------------------------------------


@pytest.mark.processes
def test_wait_and_backoff_from_a_shell(cli: Cli, store: om.ObjectStore) -> None:
    made = cli.json(
        "init", "a", "b", "--retries", "0", "--retry-backoff", "600", "--deadline", "a=60"
    )
    assert (made["retry_backoff"], made["deadlines"], made["schema_version"]) == (
        600.0,
        {"a": 60.0},
        LAYOUT_SCHEMA,
    )
    task = om.Task.open(store, "job")
    task.declare_many([("x", "a"), ("y", "b")])
    produce(task, "x")
    assert cli.json("wait", "--stage", "a") == {"until": "ready", "stages": ["a"], "entries": 1}
    assert cli.run("wait", "--stage", "a").text == "all 1 entries of a are ready\n"
    timed_out = cli.json("wait", "--stage", "b", "--timeout", "0", code=E.WAIT_TIMEOUT)
    assert (timed_out["error"], timed_out["file_ids"]) == ("WaitTimeout", ["y"])
    cli.json("wait", "--stage", "a", "--until", "consumed", "--timeout", "0", code=E.WAIT_TIMEOUT)
    fail_once(task, "y")
    dead = cli.json("wait", code=E.WAITED_FOR_DEAD)
    assert (dead["error"], dead["file_ids"]) == ("DeadWaitedFor", ["y"])
    cli.run("wait", "--until", "done", code=E.USAGE)
    cli.run("wait", "--stage", "nope", code=E.NOT_FOUND)


@pytest.mark.processes
def test_init_backoff_refusals_from_a_shell(cli: Cli) -> None:
    cli.run("init", "a", "--retry-backoff", "-1", code=E.USAGE)
    cli.run("init", "a", "--deadline", "a", code=E.USAGE)
    cli.run("init", "a", "--deadline", "b=5", code=E.USAGE)
    cli.run("init", "a", "--deadline", "a=5", "--deadline", "a=6", code=E.USAGE)
