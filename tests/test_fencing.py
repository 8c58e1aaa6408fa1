"""Fencing: a holder whose claim was taken over changes nothing, whatever its name.

Every agent here works through its own ``Task`` (its own store client and cache), as agents
in separate processes do. A zombie may carry the *same* agent name as the holder that took
its entry over (a CLI step rerun with the same ``--agent``, a restarted worker): then only
the epoch tells them apart. Holders that stall are frozen with a proxy that holds all their
requests (their lease renewals too), the light form of stopping their process.
"""

from __future__ import annotations

import io
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import objmanifest as om
from tests.support import rawstore
from tests.support.backends import Stall, stalling
from tests.support.stores import Server

pytestmark = pytest.mark.behaviour

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part
TASK = "fence"
NAMES = pytest.mark.parametrize(
    ("zombie_name", "rescuer_name"),
    [("zombie", "rescuer"), ("worker", "worker")],
    ids=["other-name", "same-name"],
)


def create(store: om.ObjectStore) -> om.Task:
    return om.Task.create(store, TASK, stages=["collect"], lease_seconds=1, max_retries=3)


def view(server: Server, prefix: str, endpoint_url: str | None = None) -> om.Task:
    """The task as another process sees it: its own client, clock and cache."""
    return om.Task.open(server.connect(prefix, endpoint_url), TASK)


def take_over(agent: om.Agent, file_id: str, within: float = 30) -> om.Claim:
    """Claim ``file_id`` as soon as its holder's lease has expired (by the store's clock)."""
    deadline = time.monotonic() + within
    while True:
        try:
            claim = agent.claim(file_id)
        except om.NotClaimable as e:
            if "held by" not in e.reason or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        assert claim is not None
        return claim


def held_fields(entry: om.Entry) -> tuple[Any, ...]:
    """What a holder's change could alter; the live holder's renewals move only the lease."""
    return (
        entry.state,
        entry.owner,
        entry.epoch,
        entry.retry_count,
        entry.key,
        entry.checksum,
        entry.size,
        entry.error,
    )


def assert_fenced(agent: om.Agent, claim: om.Claim, task: om.Task) -> None:
    """Every change the stale claim tries is refused with LeaseLost and changes nothing."""
    before = held_fields(task.entry(claim.file_id))
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("renew", lambda: agent.renew(claim)),
        ("put", lambda: agent.put(claim, b"the zombie's late bytes")),
        ("fail", lambda: agent.fail(claim, "the zombie gives up")),
    ]
    for what, attempt in attempts:
        with pytest.raises(om.LeaseLost, match=f"epoch {claim.epoch}"):
            attempt()
        assert held_fields(task.entry(claim.file_id)) == before, what


class Background:
    """A call run in a thread; ``result()`` joins it and returns or raises what it did."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._outcome: tuple[bool, Any] | None = None

        def run() -> None:
            try:
                self._outcome = (True, call())
            except BaseException as e:  # handed to result()
                self._outcome = (False, e)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 60) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout}s"
        assert self._outcome is not None
        ok, value = self._outcome
        if not ok:
            raise value
        return value


class Gate:
    """Blocks the reads of a source at a point until opened; ``reached`` tells the test
    the writer got there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._open = threading.Event()

    def wait(self) -> None:
        self.reached.set()
        if not self._open.wait(60):
            raise OSError("the test never opened the gate")

    def open(self) -> None:
        self._open.set()

    def wait_reached(self, timeout: float = 30) -> None:
        assert self.reached.wait(timeout), f"the writer did not get there within {timeout}s"


class GatedStream(io.RawIOBase):
    """A non-seekable source read in one go (one object): the read waits at the gate."""

    def __init__(self, data: bytes, gate: Gate) -> None:
        self.data, self.gate = data, gate

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.gate.wait()
        data, self.data = self.data, b""
        return data


class GatedFile(io.RawIOBase):
    """A seekable source with no file descriptor (read part by part): reads at or past
    ``gate_at`` wait at the gate."""

    def __init__(self, data: bytes, gate: Gate, gate_at: int) -> None:
        self.inner, self.gate, self.gate_at = io.BytesIO(data), gate, gate_at

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def read(self, size: int = -1) -> bytes:
        if self.inner.tell() >= self.gate_at:
            self.gate.wait()
        return self.inner.read(size)


def wait_held(proxy: Stall, count: int = 1, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while proxy.held < count:
        assert time.monotonic() < deadline, "the stalled holder sent nothing"
        time.sleep(0.05)


# -- a stale epoch, with the new holder still writing --------------------------------------


@NAMES
def test_a_stale_epoch_is_refused_while_the_new_holder_writes(
    server: Server, prefix: str, zombie_name: str, rescuer_name: str
) -> None:
    """The zombie's lease expired and the entry was taken over: while the new holder is
    still writing, and after it finished, every change the zombie tries raises LeaseLost
    and changes nothing; consumers read the new holder's bytes."""
    task = create(server.connect(prefix))
    task.declare("x", stage="collect")
    zombie = task.agent(zombie_name)
    old = zombie.claim("x")
    assert old is not None and old.epoch == 1
    rescuer = view(server, prefix).agent(rescuer_name)
    new = take_over(rescuer, "x")
    assert new.epoch == 2

    version = task.shard("collect").version
    assert_fenced(zombie, old, task)
    taken = task.entry("x")
    assert (taken.state, taken.owner, taken.epoch) == (om.State.writing, rescuer_name, 2)
    assert task.shard("collect").version == version
    assert taken.lease_expires_at == new.lease_expires_at  # not renewed by the zombie

    ready = rescuer.put(new, b"the rescuer's bytes")
    assert (ready.state, ready.epoch) == (om.State.ready, 2)
    version = task.shard("collect").version
    assert_fenced(zombie, old, task)
    assert task.shard("collect").version == version
    assert task.entry("x") == ready
    assert task.agent("reader").consume("x") == b"the rescuer's bytes"
    assert rawstore.keys(task.store, f"{TASK}/data/") == [f"{TASK}/data/collect/x@2"]


# -- a holder that stalls in the middle of its put ------------------------------------------


@NAMES
def test_a_holder_that_stalls_mid_put_is_fenced_when_it_comes_back(
    server: Server, prefix: str, zombie_name: str, rescuer_name: str
) -> None:
    """The zombie stalls inside put (its data write and its lease renewals are held), so its
    lease expires and the rescuer takes the entry over. The zombie comes back while the
    rescuer is writing: its put raises LeaseLost, as does every later change, and nothing it
    sent is visible. The rescuer finishes; the zombie is refused again; consumers read the
    rescuer's bytes."""
    task = create(server.connect(prefix))
    task.declare("x", stage="collect")
    with stalling(server) as proxy:
        zombie = om.Task.open(proxy.connect(prefix), TASK).agent(zombie_name)
        old = zombie.claim("x")
        assert old is not None
        proxy.pause()
        zombie_put = Background(lambda: zombie.put(old, b"the zombie's bytes"))
        wait_held(proxy)

        rescuer = view(server, prefix).agent(rescuer_name)
        new = take_over(rescuer, "x")
        assert new.epoch == old.epoch + 1
        gate = Gate()
        rescuer_put = Background(
            lambda: rescuer.put(new, GatedStream(b"the rescuer's bytes", gate))
        )
        gate.wait_reached()
        before = held_fields(task.entry("x"))

        proxy.resume()  # the zombie comes back while the rescuer is writing
        with pytest.raises(om.LeaseLost, match="epoch 1"):
            zombie_put.result()
        assert held_fields(task.entry("x")) == before
        assert_fenced(zombie, old, task)

        gate.open()
        ready = rescuer_put.result()
        assert (ready.state, ready.owner, ready.epoch) == (om.State.ready, rescuer_name, 2)
        version = task.shard("collect").version
        assert_fenced(zombie, old, task)
        assert task.shard("collect").version == version
    assert task.agent("reader").consume("x") == b"the rescuer's bytes"
    assert rawstore.keys(task.store, f"{TASK}/data/") == [f"{TASK}/data/collect/x@2"]


# -- a chunked put by a fenced holder --------------------------------------------------------


@pytest.mark.parametrize("comes_back", ["while-rescuer-writes", "after-rescuer-finished"])
def test_a_fenced_chunked_put_cannot_make_the_entry_ready(
    server: Server, prefix: str, comes_back: str
) -> None:
    """A holder (same name as the rescuer) stalls after the first part of a chunked put; the
    rescuer takes the entry over and adopts the upload with other bytes. When the zombie
    comes back its late part may land in the upload the rescuer is finishing (over the
    rescuer's part, on a store that keeps one upload per part number), but its put raises
    LeaseLost, the entry becomes ready with the rescuer's bytes only, and no upload is left
    open."""
    store = server.connect(prefix)
    task = create(store)
    task.declare("big", stage="collect")
    size = 2 * PART + 1000
    theirs = random.Random(1).randbytes(size)
    ours = random.Random(2).randbytes(size)
    chunked: dict[str, Any] = {"part_size": PART, "threshold": MiB, "concurrency": 1}
    try:
        with stalling(server) as proxy:
            zombie = om.Task.open(proxy.connect(prefix), TASK).agent("worker")
            old = zombie.claim("big")
            assert old is not None
            zombie_gate = Gate()
            zombie_put = Background(
                lambda: zombie.put(old, GatedFile(theirs, zombie_gate, PART), **chunked)
            )
            zombie_gate.wait_reached()  # part 1 is sent and recorded
            proxy.pause()
            zombie_gate.open()  # part 2 goes out, and is held with the renewals
            wait_held(proxy)

            rescuer = view(server, prefix).agent("worker")
            new = take_over(rescuer, "big")
            assert new.epoch == 2
            gate = Gate()
            rescuer_put = Background(
                lambda: rescuer.put(new, GatedFile(ours, gate, 2 * PART), **chunked)
            )
            gate.wait_reached()  # parts 1 and 2 of the rescuer's bytes are sent
            if comes_back == "after-rescuer-finished":
                gate.open()
                assert rescuer_put.result().state is om.State.ready
            before = held_fields(task.entry("big"))

            proxy.resume()
            with pytest.raises(om.LeaseLost, match="epoch 1"):
                zombie_put.result()
            assert held_fields(task.entry("big")) == before
            assert_fenced(zombie, old, task)
            gate.open()
            ready = rescuer_put.result()
        assert (ready.state, ready.epoch, ready.size) == (om.State.ready, 2, size)
        assert task.agent("reader").consume("big") == ours
        assert rawstore.multipart_uploads(store, f"{TASK}/") == []
        assert rawstore.keys(store, f"{TASK}/data/") == [ready.key]
    finally:
        rawstore.abort_uploads(store, f"{TASK}/")


# -- data is written once ------------------------------------------------------------------


def test_a_put_repeated_after_ready_keeps_the_first_bytes(task: om.Task) -> None:
    """The holder's data is written with If-None-Match, so a second put with other bytes,
    once the entry is ready, cannot replace the bytes the entry points at. That put is
    refused with LeaseLost (the claim no longer holds a writing entry) and leaves nothing
    behind."""
    task.declare("x", stage="collect")
    agent = task.agent("p")
    claim = agent.claim("x")
    assert claim is not None
    first = agent.put(claim, b"the first bytes")
    with pytest.raises(om.LeaseLost, match="now ready"):
        agent.put(claim, b"other bytes, same epoch")
    assert task.entry("x") == first
    assert task.agent("reader").consume("x") == b"the first bytes"
    assert first.key is not None
    assert rawstore.keys(task.store, "job/data/") == [first.key]
