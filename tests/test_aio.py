"""``objmanifest.aio``: the behaviour suite's core cases through the async API, on every
backend, and what a cancelled coroutine leaves behind (its thread stopped at a checkpoint:
an entry still writing under its claim, never half-ready; no partial file at ``dest``).

Each test drives its coroutines with ``asyncio.run``; a stall (``backends.stalling``: a
proxy on S3, a call hook on ``MemoryStore``) holds store calls so a cancellation lands
where the test says."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, get_args, get_type_hints, is_typeddict

import pytest

import objmanifest as om
from objmanifest.aio import AsyncAgent, AsyncTask
from tests.support.backends import Stall, stalling
from tests.support.stores import Server

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def presented(name: str) -> list[str]:
    """The members the API reference presents for ``objmanifest.NAME``."""
    found = re.search(
        rf"::: objmanifest\.{name}\n    options:\n      members:\n((?:        - \w+\n)+)",
        REFERENCE.read_text(),
    )
    assert found, f"docs/reference.md lists no members of {name}"
    return re.findall(r"- (\w+)", found.group(1))


@pytest.mark.parametrize(("sync", "twin"), [(om.Task, AsyncTask), (om.Agent, AsyncAgent)])
def test_every_call_the_reference_presents_has_its_coroutine_twin(sync: type, twin: type) -> None:
    """Each call of ``Task`` and ``Agent`` the docs present exists on its async twin, and is
    a coroutine there when it does I/O (everything but properties and the two factories
    that only build objects or count: ``agent``, ``subscribe``, ``request_counts``)."""
    names = presented(sync.__name__)
    assert len(names) >= 10
    missing = [n for n in names if not hasattr(twin, n)]
    assert missing == [], f"no coroutine twin in objmanifest.aio: {missing}"
    for name in names:
        if isinstance(inspect.getattr_static(sync, name), property):
            assert isinstance(inspect.getattr_static(twin, name), property), name
        elif name not in ("agent", "subscribe", "request_counts"):
            assert inspect.iscoroutinefunction(getattr(twin, name)), f"{twin.__name__}.{name}"
    hidden = [n for n in names if n.startswith("_")]
    assert hidden == []


def typed_options(coroutine: Callable[..., Any]) -> set[str] | None:
    """The keys of the ``TypedDict`` a coroutine's ``**options: Unpack[...]`` takes; None
    for ``**options`` of any name, or none."""
    for param in inspect.signature(coroutine).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            unpacked = get_args(get_type_hints(coroutine)[param.name])
            if unpacked and is_typeddict(unpacked[0]):
                return set(unpacked[0].__required_keys__ | unpacked[0].__optional_keys__)
    return None


@pytest.mark.parametrize(("sync", "twin"), [(om.Task, AsyncTask), (om.Agent, AsyncAgent)])
def test_every_coroutine_twin_takes_the_arguments_of_its_call(sync: type, twin: type) -> None:
    """The same names, kinds and defaults as the call it runs (or a ``**options`` passed on
    to it: when typed, exactly its keyword arguments), but ``stop``: a coroutine is stopped
    by cancelling it."""
    differ = []
    for name in presented(sync.__name__):
        if isinstance(inspect.getattr_static(sync, name), property):
            continue
        wanted = inspect.signature(getattr(sync, name)).parameters
        taken = inspect.signature(getattr(twin, name)).parameters
        passed_on = any(p.kind is p.VAR_KEYWORD for p in taken.values())
        options = typed_options(getattr(twin, name))
        if options is not None:
            keywords = {a for a, p in wanted.items() if p.kind is p.KEYWORD_ONLY} - {"stop"}
            differ += [f"{name}(**{arg})" for arg in sorted(options ^ keywords)]
        for arg, param in wanted.items():
            got = taken.get(arg)
            if got is None and passed_on and param.kind is not param.POSITIONAL_ONLY:
                continue
            if arg != "stop" and (
                got is None or (got.kind, got.default) != (param.kind, param.default)
            ):
                differ.append(f"{name}({arg})")
    assert differ == []


pytestmark = pytest.mark.behaviour

T = TypeVar("T")

BOUND = 60.0
"""Seconds a test waits for something that must happen (never a measured assertion)."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (on the loop) until ``condition()`` holds; fail after ``BOUND`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not condition():
        assert loop.time() < deadline, f"{what} did not happen in {BOUND:g}s"
        await asyncio.sleep(0.01)


async def expired(task: AsyncTask, claim: om.Claim) -> None:
    """Sleep until the store's clock is past the lease and its margin."""
    while task.store.now() <= claim.lease_expires_at + timedelta(seconds=2.2):
        await asyncio.sleep(0.05)


def make(store: om.ObjectStore, lease: float = 30, retries: int = 3) -> AsyncTask:
    task = om.Task.create(
        store, "job", stages=["collect", "write"], lease_seconds=lease, max_retries=retries
    )
    return AsyncTask(task)


async def cancelled(job: asyncio.Task[Any]) -> None:
    """Cancel ``job`` and see it end cancelled."""
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job


async def held_then_cancelled(stall: Stall, start: Callable[[], Awaitable[Any]]) -> None:
    """Start ``start()`` while every store call is held, cancel it once one is held, then
    let the calls go: what the coroutine's thread does next, it does cancelled."""
    stall.pause()
    try:
        job = asyncio.ensure_future(start())
        await until(lambda: stall.held >= 1, "a store call held")
        job.cancel()
        # The cancellation reaches the coroutine on its next step, which the loop runs
        # before this one's (callbacks run in order): by then it has told its thread.
        await asyncio.sleep(0)
    finally:
        stall.resume()
    with pytest.raises(asyncio.CancelledError):
        await job


# -- the core cases -----------------------------------------------------------------------


def test_declare_claim_put_consume_round_trip(store: om.ObjectStore, tmp_path: Path) -> None:
    async def main() -> None:
        async with make(store) as task:
            await task.declare("raw/a", stage="collect")
            await task.declare("draft", stage="write", depends_on=["raw/a"], consumers=["c"])
            assert await task.stage_of("draft") == "write"
            producer = task.agent("p")
            assert isinstance(producer, AsyncAgent) and producer.name == "p"
            with pytest.raises(om.NotClaimable, match="raw/a"):
                await producer.claim("draft")  # its dependency is not ready
            claim = await producer.claim(stage="collect")
            assert claim is not None and claim.file_id == "raw/a"
            claim = await producer.renew(claim)
            assert (await task.held(claim)).state is om.State.writing
            entry = await producer.put(claim, b"raw bytes")
            assert entry.state is om.State.ready and entry.size == 9
            second = await producer.claim("draft")
            assert second is not None
            [done] = await producer.put_many([second], [b"# draft"])
            assert isinstance(done, om.Entry) and done.state is om.State.ready

            assert await task.agent("q").consume("raw/a") == b"raw bytes"
            marked = await task.agent("c").consume("draft", dest=tmp_path / "d.md")
            assert marked.state is om.State.consumed
            assert (tmp_path / "d.md").read_bytes() == b"# draft"
            status = await task.status()
            assert status.stages["collect"]["consumed"] == 1
            assert status.stages["write"]["consumed"] == 1
            assert [e.file_id for e in await task.entries("write")] == ["draft"]
            assert (await task.entry("raw/a")).consumed_by == ("q",)

            opened = await AsyncTask.open(store, "job", workers=2)
            async with opened:
                assert (await opened.entry("draft")).state is om.State.consumed
            assert await AsyncTask.list(store) == ["job"]
            assert (await task.index()).stage_of("draft") == "write"
            await AsyncTask.delete_by_id(store, "job")
            assert await AsyncTask.list(store) == []

    run(main())


def test_consume_waits_for_an_entry_put_while_it_waits(store: om.ObjectStore) -> None:
    async def main() -> None:
        async with make(store) as task:
            await task.declare("a", stage="collect")
            with pytest.raises(om.NotReady):
                await task.agent("c").consume("a", wait=0)
            waiting = asyncio.ensure_future(task.agent("c").consume("a", wait=BOUND))
            await asyncio.sleep(0.3)  # the wait has looked and found it pending
            assert not waiting.done()
            producer = task.agent("p")
            claim = await producer.claim("a")
            assert claim is not None
            await producer.put(claim, b"made while waited for")
            assert await waiting == b"made while waited for"
            assert (await task.entry("a")).consumed_by == ("c",)

    run(main())


def test_a_pool_of_no_workers_is_refused_and_a_task_is_what_is_wrapped(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "job", stages=["collect"])
    with pytest.raises(om.InvalidInput, match="workers must be a whole number"):
        AsyncTask(task, workers=0)
    with pytest.raises(TypeError, match="AsyncTask wraps a Task"):
        AsyncTask(store)  # type: ignore[arg-type]


def test_a_fenced_put_raises_lease_lost_and_the_new_holder_finishes(store: om.ObjectStore) -> None:
    async def main() -> None:
        async with make(store, lease=1) as task:
            await task.declare("a", stage="collect")
            old, new = task.agent("old"), task.agent("new")
            stale = await old.claim("a")
            assert stale is not None
            with pytest.raises(om.NotClaimable) as refused:
                await new.claim("a")  # held, lease not expired
            assert "old" in refused.value.reason
            await expired(task, stale)
            fresh = await new.claim("a")
            assert fresh is not None and fresh.epoch == stale.epoch + 1
            with pytest.raises(om.LeaseLost):
                await old.put(stale, b"zombie")
            with pytest.raises(om.LeaseLost):
                await old.renew(stale)
            assert (await new.put(fresh, b"winner")).state is om.State.ready
            assert await task.agent("c").consume("a") == b"winner"

    run(main())


def test_wait_returns_once_the_stage_is_ready_and_times_out_otherwise(
    store: om.ObjectStore,
) -> None:
    async def main() -> None:
        async with make(store) as task:
            await task.declare_many([(f"f{i}", "collect") for i in range(3)])
            with pytest.raises(om.WaitTimeout) as timeout:
                await task.wait(["collect"], timeout=0.3)
            assert sorted(timeout.value.file_ids) == ["f0", "f1", "f2"]
            outstanding: list[list[str]] = []
            waiter = asyncio.ensure_future(
                task.wait(["collect"], timeout=BOUND, on_wait=outstanding.append)
            )
            # Produce only once the waiter has seen the stage outstanding: were the puts
            # done before its first read, it would find everything ready and never wait.
            await until(lambda: bool(outstanding), "the waiter's first read")
            producer = task.agent("p")
            for claim in await producer.claim_many("collect", limit=3):
                await producer.put(claim, claim.file_id.encode())
            found = await waiter
            assert found == dict.fromkeys(["f0", "f1", "f2"], om.State.ready)
            assert sorted(outstanding[0]) == ["f0", "f1", "f2"]
            assert await task.outstanding(["collect"]) == (found, [])
            with pytest.raises(om.InvalidInput):
                await task.wait("collect")

    run(main())


def test_fifty_coroutines_claiming_one_stage_produce_every_entry_once(
    store: om.ObjectStore,
) -> None:
    entries = 120

    async def main() -> None:
        async with make(store) as task:
            await task.declare_many([(f"e/{i:03d}", "collect") for i in range(entries)])
            made: list[str] = []

            async def worker(n: int) -> None:
                agent = task.agent(f"w{n}")
                while (claim := await agent.claim(stage="collect")) is not None:
                    await agent.put(claim, claim.file_id.encode())
                    made.append(claim.file_id)

            await asyncio.gather(*(worker(n) for n in range(50)))
            counts = Counter(made)
            assert [fid for fid, n in counts.items() if n != 1] == []
            assert sorted(counts) == [f"e/{i:03d}" for i in range(entries)]
            status = await task.status()
            assert status.stages["collect"]["ready"] == entries

    run(main())


# -- cancellation -------------------------------------------------------------------------


def test_a_cancelled_put_leaves_the_entry_writing_and_the_holder_puts_again(
    server: Server, prefix: str
) -> None:
    with stalling(server) as stall:

        async def main() -> None:
            async with make(stall.connect(prefix)) as task:
                await task.declare("a", stage="collect")
                agent = task.agent("p")
                claim = await agent.claim("a")
                assert claim is not None
                await held_then_cancelled(stall, lambda: agent.put(claim, b"first"))
                entry = await task.entry("a")
                assert (entry.state, entry.owner, entry.epoch) == (
                    om.State.writing,
                    "p",
                    claim.epoch,
                )
                assert entry.checksum is None
                done = await agent.put(claim, b"second")
                assert done.state is om.State.ready
                assert await task.agent("c").consume("a") == b"second"

        run(main())


def test_a_cancelled_put_is_never_made_ready_and_a_takeover_has_the_entry(
    server: Server, prefix: str
) -> None:
    with stalling(server) as stall:

        async def main() -> None:
            async with make(stall.connect(prefix), lease=1) as task:
                await task.declare("a", stage="collect")
                old, new = task.agent("old"), task.agent("new")
                claim = await old.claim("a")
                assert claim is not None
                await held_then_cancelled(stall, lambda: old.put(claim, b"abandoned"))
                assert (await task.entry("a")).state is om.State.writing
                await expired(task, claim)
                taken = await new.claim("a")
                assert taken is not None and taken.epoch == claim.epoch + 1
                assert (await new.put(taken, b"taken over")).state is om.State.ready
                assert await task.agent("c").consume("a") == b"taken over"
                ready = [t for t in await task.history("a") if t.to_state == "ready"]
                assert [(t.actor, t.epoch) for t in ready] == [("new", taken.epoch)]

        run(main())


def test_a_cancelled_put_many_leaves_every_entry_writing(server: Server, prefix: str) -> None:
    with stalling(server) as stall:

        async def main() -> None:
            async with make(stall.connect(prefix)) as task:
                await task.declare_many([(f"b{i}", "collect") for i in range(3)])
                agent = task.agent("p")
                claims = await agent.claim_many("collect", limit=3)
                assert len(claims) == 3
                datas = [b"x", b"y", b"z"]
                await held_then_cancelled(stall, lambda: agent.put_many(claims, datas))
                states = {e.file_id: e.state for e in await task.entries("collect")}
                assert states == dict.fromkeys(["b0", "b1", "b2"], om.State.writing)
                results = await agent.put_many(claims, datas)
                assert [r.state for r in results if isinstance(r, om.Entry)] == [om.State.ready] * 3

        run(main())


def test_a_put_cancelled_after_its_ready_commit_waits_for_it_and_reports_it(
    store: om.ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    inside, go_on = threading.Event(), threading.Event()

    def hold_the_ready_commit(event: om.CommitEvent) -> None:
        if any(c.item == "a" and c.after == "ready" for c in event.transitions):
            inside.set()
            go_on.wait(BOUND)

    async def main() -> None:
        async with make(store) as task:
            task.subscribe(hold_the_ready_commit)
            await task.declare("a", stage="collect")
            agent = task.agent("p")
            claim = await agent.claim("a")
            assert claim is not None
            job = asyncio.ensure_future(agent.put(claim, b"landed"))
            await until(inside.is_set, "the ready commit")
            job.cancel()
            await asyncio.sleep(0.2)
            assert not job.done(), "the cancelled put returned while its commit was in flight"
            go_on.set()
            with pytest.raises(asyncio.CancelledError):
                await job
            assert (await task.entry("a")).state is om.State.ready

    with caplog.at_level(logging.INFO, logger="objmanifest.aio"):
        run(main())
    assert "put of 'a' was cancelled after its commit was sent; the commit landed" in caplog.text


def test_a_cancelled_consume_leaves_dest_as_it_was_and_marks_nothing(
    server: Server, prefix: str, tmp_path: Path
) -> None:
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"what was there")
    with stalling(server) as stall:

        async def main() -> None:
            async with make(stall.connect(prefix)) as task:
                await task.declare("a", stage="collect")
                producer = task.agent("p")
                claim = await producer.claim("a")
                assert claim is not None
                await producer.put(claim, bytes(range(256)) * 4096)  # 1 MiB
                consumer = task.agent("c")
                await held_then_cancelled(stall, lambda: consumer.consume("a", dest=dest))
                assert dest.read_bytes() == b"what was there"
                assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
                assert (await task.entry("a")).state is om.State.ready
                await held_then_cancelled(stall, lambda: consumer.consume("a"))
                assert (await task.entry("a")).state is om.State.ready
                marked = await consumer.consume("a", dest=dest)
                assert marked.state is om.State.consumed
                assert dest.read_bytes() == bytes(range(256)) * 4096

        run(main())


def test_a_claim_that_lands_after_its_cancellation_is_released(server: Server, prefix: str) -> None:
    with stalling(server) as stall:

        async def main() -> None:
            async with make(stall.connect(prefix)) as task:
                await task.declare("a", stage="collect")
                await held_then_cancelled(stall, lambda: task.agent("gone").claim("a"))
                entry = await task.entry("a")
                assert (entry.state, entry.retry_count) == (om.State.pending, 0)
                assert entry.epoch >= 1  # the claim landed, then was given back
                taken = await task.agent("next").claim("a")
                assert taken is not None and taken.epoch == entry.epoch + 1

        run(main())


# -- the sync checkpoints the cancellations use ---------------------------------------------


def test_a_put_told_to_stop_raises_interrupted_and_the_entry_stays_writing(
    task: om.Task,
) -> None:
    task.declare("a", stage="collect")
    agent = task.agent("p")
    claim = agent.claim("a")
    assert claim is not None
    stop = threading.Event()
    stop.set()
    with pytest.raises(om.Interrupted, match=r"'a'.*stays writing under this claim"):
        agent.put(claim, b"never", stop=stop)
    assert task.entry("a").state is om.State.writing
    with pytest.raises(om.Interrupted, match="consume of 'a'"):
        task.agent("c").consume("a", stop=stop)  # refused before it reads anything
    assert agent.put(claim, b"now", stop=threading.Event()).state is om.State.ready


def test_a_chunked_put_stopped_between_parts_keeps_them_for_its_next_put(
    task: om.Task, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    part = 5 << 20
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * (part * 2 // 256) + b"tail")  # 3 parts
    task.declare("big", stage="collect")
    agent = task.agent("p")
    claim = agent.claim("big")
    assert claim is not None
    stop = threading.Event()

    def after_a_part(done: int, total: int | None) -> None:
        stop.set()

    options: dict[str, Any] = {"part_size": part, "concurrency": 1, "threshold": 1 << 20}
    with pytest.raises(om.Interrupted):
        agent.put(claim, source, progress=after_a_part, stop=stop, **options)
    assert task.entry("big").state is om.State.writing
    with caplog.at_level(logging.INFO, logger="objmanifest.agent"):
        entry = agent.put(claim, source, **options)
    assert entry.state is om.State.ready and entry.size == source.stat().st_size
    assert "parts_adopted=1" in caplog.text  # the part sent before the stop was kept

    # A chunked consume stopped between parts: nothing at dest, nothing marked.
    dest = tmp_path / "out" / "big.bin"
    consumer, stop = task.agent("c"), threading.Event()
    with pytest.raises(om.Interrupted, match="left as it was"):
        consumer.consume("big", dest, concurrency=1, parents=True, progress=after_a_part, stop=stop)
    assert list(dest.parent.iterdir()) == []
    assert task.entry("big").state is om.State.ready
    assert consumer.consume("big", dest).state is om.State.consumed
    assert dest.read_bytes() == source.read_bytes()
