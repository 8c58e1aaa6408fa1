"""Races and faults with real processes: producers racing, a fenced zombie, agents whose
clocks are wrong, responses lost on the way back, and a store that ignores conditions.

Agents in other processes run ``tests/workers/agent.py`` and report in JSON lines. Every wait is
bounded, and every child is killed when its test ends, whatever the outcome.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.store import make_client
from tests.support.faults import FaultProxy, ignoring_conditions
from tests.support.internals import engine
from tests.support.stores import Server

WORKER = Path(__file__).parent / "workers" / "agent.py"
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"  # where Debian puts it, any arch
TASK = "job"
STAGE = "collect"


# -- child processes -------------------------------------------------------------------


class Worker:
    """One ``tests/workers/agent.py`` process; its stdout read as JSON lines by a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if line:
                try:
                    self.lines.put(json.loads(line))
                except ValueError:
                    self.lines.put({"event": "garbage", "line": line})
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def _fail(self, why: str) -> None:
        tail = "".join(self.stderr)[-3000:]
        pytest.fail(f"worker {self.name}: {why}\n--- stderr ---\n{tail}")

    def next(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next line, which must be ``event`` (``start`` lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"no {event!r} line within {timeout}s")
                raise  # unreachable: pytest.fail raises
            if line is None:
                self.proc.wait(timeout=10)
                self._fail(f"exited ({self.proc.returncode}) before a {event!r} line")
                raise AssertionError  # unreachable
            if line["event"] == event:
                return line
            if line["event"] != "start" or event == "start":
                self._fail(f"expected {event!r}, got {line}")

    def send(self, text: str = "go") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait for a clean exit; the lines not yet taken."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"still running after {timeout}s")
        for t in self._readers:
            t.join(timeout=10)
        if self.proc.returncode != 0:
            self._fail(f"exit code {self.proc.returncode}")
        out = []
        while (line := self.lines.get_nowait()) is not None:
            out.append(line)
        return out

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a stopped process too
        try:
            self.proc.wait(timeout=10)
        finally:
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


Spawn = Callable[..., Worker]


@pytest.fixture
def spawn(server: Server, store: om.ObjectStore) -> Iterator[Spawn]:
    """Start workers against the test's store; all of them are killed at the end."""
    started: list[Worker] = []

    def start(
        name: str, *args: str, wait_go: bool = False, env: dict[str, str] | None = None
    ) -> Worker:
        cmd = [
            sys.executable,
            str(WORKER),
            "--bucket",
            store.bucket,
            "--prefix",
            store.prefix,
            "--task",
            TASK,
            "--name",
            name,
        ]
        if wait_go:
            cmd.append("--wait-go")
        full_env = {**os.environ, **server.env, "PYTHONUNBUFFERED": "1", **(env or {})}
        worker = Worker([*cmd, *args], full_env, name)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def fresh(server: Server, store: om.ObjectStore) -> om.Task:
    """The task through a new client with an empty cache: the store as it is now."""
    return om.Task.open(server.connect(store.prefix), TASK)


def data_key(file_id: str, epoch: int) -> str:
    """Where the design puts a holder's bytes: ``TASK_ID/data/STAGE/FILE_ID@EPOCH``."""
    return f"{TASK}/data/{STAGE}/{file_id}@{epoch}"


def payload(file_id: str, name: str, epoch: int) -> bytes:
    return f"{file_id}|{name}|{epoch}".encode()  # as tests/workers/agent.py produces it


# -- four producer processes -------------------------------------------------------------


@pytest.mark.heavy
def test_racing_producer_processes_make_each_entry_ready_exactly_once(
    server: Server, store: om.ObjectStore, task: om.Task, spawn: Spawn
) -> None:
    ids = [f"item-{i:02d}" for i in range(40)]
    task.declare_many([(fid, STAGE) for fid in ids])
    workers = [spawn(f"producer-{i}", "produce", "--stage", STAGE, wait_go=True) for i in range(4)]
    for w in workers:
        w.next("waiting", timeout=30)
    for w in workers:  # released together, so their claims race
        w.send("go")
    lines = {w.name: w.finish(timeout=60) for w in workers}

    produced: list[tuple[str, str, int]] = []  # (producer, file id, epoch)
    conflicts = 0
    for name, out in lines.items():
        assert [x for x in out if x["event"] == "error"] == [], name
        produced += [(name, x["file_id"], x["epoch"]) for x in out if x["event"] == "produced"]
        (done,) = [x for x in out if x["event"] == "done"]
        conflicts += done["stats"]["conflicts"]
    reported = Counter(fid for _, fid, _ in produced)
    assert set(reported) == set(ids), "every entry produced"
    assert [fid for fid, n in reported.items() if n > 1] == [], "no entry produced twice"
    # Losing a race proves they raced. (How the work is split is not asserted: the last
    # winner holds a fresh ETag and commits without a read while losers back off, so one
    # process sometimes does all 40.)
    assert conflicts > 0, "the producers never raced: the test proved nothing"

    by_id = {fid: (name, epoch) for name, fid, epoch in produced}
    now = fresh(server, store)
    entries = {e.file_id: e for e in now.entries(STAGE)}
    assert sorted(entries) == ids
    reader = now.agent("reader")
    for fid, entry in entries.items():
        name, epoch = by_id[fid]
        data = payload(fid, name, epoch)
        assert entry.state is om.State.ready, fid
        assert (entry.owner, entry.epoch) == (name, epoch), fid
        assert entry.epoch == 1, f"{fid} was claimed {entry.epoch} times"
        assert entry.retry_count == 0, fid
        assert entry.key == data_key(fid, epoch)
        assert (entry.checksum, entry.size) == (checksum.of_bytes(data), len(data))
        assert reader.consume(fid) == data
    assert {e.state for e in now.entries(STAGE)} == {om.State.consumed}


# -- a zombie holder ---------------------------------------------------------------------


@pytest.mark.heavy
def test_a_stopped_holder_is_fenced_after_its_lease_is_taken_over(
    server: Server, store: om.ObjectStore, spawn: Spawn
) -> None:
    """The zombie holds x and y and stops. After its leases expire by the store's clock the
    rescuer takes both over, finishes x, and is still writing y when the zombie wakes up and
    tries to put both: each is refused, and nothing the zombie did is visible."""
    task = om.Task.create(store, TASK, stages=[STAGE], lease_seconds=2, max_retries=3)
    task.declare_many([("x", STAGE), ("y", STAGE), ("z", STAGE)])
    zombie = spawn(
        "zombie", "hold", "--file-id", "x", "--file-id", "y", "--payload", "the zombie's bytes"
    )
    held = {c["file_id"]: c for c in (zombie.next("claimed")["claim"] for _ in range(2))}
    zombie.signal(signal.SIGSTOP)
    assert {(c["agent"], c["epoch"]) for c in held.values()} == {("zombie", 1)}
    expires = max(datetime.fromisoformat(c["lease_expires_at"]) for c in held.values())

    rescuer = task.agent("rescuer")
    with pytest.raises(om.NotClaimable, match="held by zombie"):
        rescuer.claim("x")  # the lease is live: no takeover yet
    deadline = time.monotonic() + 30
    while store.now() < expires + timedelta(seconds=3):  # the store's clock, not ours
        assert time.monotonic() < deadline, "the store's clock did not pass the lease"
        time.sleep(0.2)

    claims: dict[str, om.Claim] = {}
    for f in ("x", "y"):
        claim = rescuer.claim(f)
        assert claim is not None and claim.epoch == held[f]["epoch"] + 1
        claims[f] = claim
        taken = task.entry(f)
        assert (taken.state, taken.owner, taken.epoch, taken.retry_count) == (
            om.State.writing,
            "rescuer",
            held[f]["epoch"] + 1,
            1,
        )
    data = {f: f"the rescuer's bytes for {f}".encode() for f in claims}
    rescuer.put(claims["x"], data["x"])  # x is ready before the zombie wakes; y is not
    before = task.shard(STAGE)

    zombie.signal(signal.SIGCONT)
    zombie.send("go")
    outcomes = {o["file_id"]: o for o in (zombie.next("put") for _ in range(2))}
    zombie.finish(timeout=30)
    assert {f: o["outcome"] for f, o in outcomes.items()} == {"x": "LeaseLost", "y": "LeaseLost"}, (
        outcomes
    )
    woken = fresh(server, store).shard(STAGE)
    assert (woken.version, woken.commits) == (before.version, before.commits), (
        "the fenced holder changed the shard"
    )
    assert woken.entries["y"] == before.entries["y"]  # still the rescuer's, writing

    rescuer.put(claims["y"], data["y"])
    after = fresh(server, store).shard(STAGE)
    consumer = fresh(server, store).agent("consumer")
    for f, claim in claims.items():
        entry = after.entries[f]
        assert entry.state is om.State.ready, f
        assert (entry.owner, entry.epoch, entry.retry_count) == ("rescuer", claim.epoch, 1)
        assert (entry.checksum, entry.size) == (checksum.of_bytes(data[f]), len(data[f]))
        assert entry.key == data_key(f, claim.epoch)
        assert consumer.consume(f) == data[f]
    zombie_keys = [data_key(f, c["epoch"]) for f, c in held.items()]
    referenced = [e.key for e in after.entries.values() if e.key]
    assert not [k for k in referenced for z in zombie_keys if k.startswith(z)], referenced
    assert after.entries["z"].state is om.State.pending


# -- agents whose clocks are wrong ---------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_an_agent_with_a_wrong_clock_judges_leases_by_the_store_clock(
    server: Server, store: om.ObjectStore, task: om.Task, spawn: Spawn, offset: str
) -> None:
    found = sorted(glob.glob(FAKETIME_GLOB))
    if not found:  # a missing tool must not turn this test into a silent pass
        pytest.fail(
            f"libfaketime is not installed (no {FAKETIME_GLOB}): install the `faketime` "
            "package (scripts/test.sh does when it runs as root)"
        )
    faketime_lib = found[0]
    skew = 600.0 if offset.startswith("+") else -600.0
    task.declare_many([("held", STAGE), ("free", STAGE), ("mine", STAGE)])
    steady = task.agent("steady")
    held = steady.claim("held")
    assert held is not None
    before = store.now()

    skewed = spawn(
        "skewed",
        "claim-once",
        "--file-id",
        "held",
        "--stage",
        STAGE,
        env={"LD_PRELOAD": faketime_lib, "FAKETIME": offset},
    )
    start = skewed.next("start", timeout=30)
    assert abs(start["time"] - time.time() - skew) < 30, "faketime did not skew the child"
    by_id = skewed.next("claim", timeout=30)
    by_stage = skewed.next("claim", timeout=30)
    skewed.finish(timeout=30)
    after = store.now()

    # A live lease stays live whatever the agent's clock says.
    assert by_id["claim"] is None and by_id["error"] == "NotClaimable", by_id
    assert "held by steady" in by_id["message"]
    child_now = datetime.fromisoformat(by_id["store_now"])
    assert before - timedelta(seconds=3) <= child_now <= after + timedelta(seconds=3)
    current = task.entry("held")
    assert (current.state, current.owner, current.epoch, current.retry_count) == (
        om.State.writing,
        "steady",
        held.epoch,
        0,
    )

    # A lease the skewed agent takes ends lease_seconds after the store's now, not its own.
    claim = by_stage["claim"]
    assert claim is not None and claim["file_id"] == "free", by_stage
    lease = timedelta(seconds=task.lease_seconds)
    expires = datetime.fromisoformat(claim["lease_expires_at"])
    assert before + lease - timedelta(seconds=3) <= expires <= after + lease + timedelta(seconds=3)
    mine = steady.claim("mine")
    assert mine is not None
    assert abs((mine.lease_expires_at - expires).total_seconds()) < 5
    assert task.entry("free").lease_expires_at == expires

    # The steady holder was never fenced.
    assert steady.put(held, b"steady").state is om.State.ready


# -- lost responses ------------------------------------------------------------------------


@pytest.mark.parametrize("client_retries", [True, False], ids=["botocore-retries", "no-retries"])
def test_a_write_whose_response_is_lost_is_applied_exactly_once(
    server: Server, store: om.ObjectStore, client_retries: bool
) -> None:
    config: dict[str, Any] = (
        {} if client_retries else {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    )
    shard_path = f"{TASK}/shards/{STAGE}.json"
    with FaultProxy(server.endpoint_url) as proxy:
        through = om.S3Store(make_client(proxy.endpoint_url, **config), store.bucket, store.prefix)
        task = om.Task.create(through, TASK, stages=[STAGE], lease_seconds=60, max_retries=3)
        task.declare_many([(f, STAGE) for f in ("a", "b", "c", "d")])
        direct = fresh(server, store)
        agent = task.agent("unlucky")
        drops = 0

        def lose_next(path: str = shard_path) -> None:
            nonlocal drops
            proxy.drop_response("PUT", path)
            drops += 1

        def state() -> dict[str, tuple[om.State, str | None, int, int]]:
            return {
                e.file_id: (e.state, e.owner, e.epoch, e.retry_count) for e in direct.entries(STAGE)
            }

        w, p = om.State.writing, om.State.pending

        # A claim by stage: the first entry is taken once, and nothing else.
        lose_next()
        claim_a = agent.claim(stage=STAGE)
        assert proxy.dropped == drops == 1
        assert claim_a is not None and (claim_a.file_id, claim_a.epoch) == ("a", 1)
        assert state() == {
            "a": (w, "unlucky", 1, 0),
            "b": (p, None, 0, 0),
            "c": (p, None, 0, 0),
            "d": (p, None, 0, 0),
        }

        # A claim of a named entry: it succeeds (no NotClaimable "held by unlucky").
        lose_next()
        claim_b = agent.claim("b")
        assert claim_b is not None and claim_b.epoch == 1
        assert proxy.dropped == drops
        assert state()["b"] == (w, "unlucky", 1, 0)

        # The data object's response is lost: the bytes are still at the epoch's own key.
        lose_next(f"{TASK}/data/{STAGE}/a%401")  # the key as it is sent, URL-quoted
        ready = agent.put(claim_a, b"bytes of a")
        assert ready.state is om.State.ready
        assert proxy.dropped == drops
        assert ready.key == data_key("a", 1)

        # The shard's response to a put is lost: ready once, at the same epoch.
        claim_c = agent.claim("c")
        assert claim_c is not None
        lose_next()
        ready_c = agent.put(claim_c, b"bytes of c")
        assert (ready_c.state, ready_c.epoch) == (om.State.ready, 1)
        assert proxy.dropped == drops

        # A fail whose response is lost counts one retry, and does not come back LeaseLost.
        lose_next()
        failed = agent.fail(claim_b, "gave up")
        assert (failed.state, failed.retry_count) == (om.State.failed, 1)
        assert proxy.dropped == drops
        assert state()["b"] == (om.State.failed, None, 1, 1)

        assert proxy.dropped == drops == 5
        shard_drops = 4
        if client_retries:  # botocore's retry met our own write: a 412 we recognised
            assert engine(task).docs.stats.conflicts == shard_drops
            assert engine(task).docs.stats.lost_responses == 0
        else:  # the error reached our loop, which read back and found its commit
            assert engine(task).docs.stats.lost_responses == shard_drops
            assert engine(task).docs.stats.conflicts == 0

    final = state()
    # declare, claim a, claim b, ready a, claim c, ready c, fail b: one version each
    assert direct.shard(STAGE).version == 7
    assert final["a"] == (om.State.ready, "unlucky", 1, 0)
    assert final["c"] == (om.State.ready, "unlucky", 1, 0)
    assert final["d"] == (p, None, 0, 0)
    reader = direct.agent("reader")
    assert reader.consume("a") == b"bytes of a"
    assert reader.consume("c") == b"bytes of c"


NO_CLIENT_RETRIES: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}


@pytest.mark.parametrize("client_retries", [True, False], ids=["botocore-retries", "no-retries"])
def test_create_whose_answer_is_lost_returns_its_own_task(
    server: Server, store: om.ObjectStore, client_retries: bool
) -> None:
    """The header landed but its answer was lost: the same call finds its own header
    (same creation id) and returns the task instead of AlreadyExists."""
    header_path = f"/{store.bucket}/{store.full_key(TASK)}/task.json"
    with FaultProxy(server.endpoint_url) as proxy:
        client = make_client(proxy.endpoint_url, **({} if client_retries else NO_CLIENT_RETRIES))
        through = om.S3Store(client, store.bucket, store.prefix)
        proxy.drop_response("PUT", header_path)
        task = om.Task.create(through, TASK, stages=[STAGE, "write"], lease_seconds=60)
        assert proxy.dropped == 1
        header_puts = [r for r in proxy.requests if r == ("PUT", header_path)]
        assert len(header_puts) == (2 if client_retries else 1)
        stored = om.Task.open(store, TASK).header
        assert stored == task.header
        assert stored.stages == (STAGE, "write") and stored.lease_seconds == 60
        assert list(store.list_keys("")) == [f"{TASK}/task.json"]
        task.declare("a", stage=STAGE)  # the task returned works
    assert om.Task.open(store, TASK).entry("a").state is om.State.pending


def test_rerunning_create_after_a_lost_answer_finds_the_task_exists(
    server: Server, store: om.ObjectStore
) -> None:
    """A first call's header landed, but neither its answer nor the read-back reached it:
    it fails. A rerun is another call (another creation id): AlreadyExists, and the header
    the first call wrote stays as it was."""
    header_path = f"/{store.bucket}/{store.full_key(TASK)}/task.json"
    with FaultProxy(server.endpoint_url) as proxy:
        through = om.S3Store(
            make_client(proxy.endpoint_url, **NO_CLIENT_RETRIES), store.bucket, store.prefix
        )
        proxy.drop_response("PUT", header_path)
        proxy.drop_response("GET", header_path)
        with pytest.raises(om.StoreError, match=r"could not read .*task\.json"):
            om.Task.create(through, TASK, stages=[STAGE], lease_seconds=60)
        assert proxy.dropped == 2
        first = om.Task.open(store, TASK).header  # it did land
        with pytest.raises(om.AlreadyExists, match=rf"task '{TASK}' already exists"):
            om.Task.create(through, TASK, stages=[STAGE], lease_seconds=60)
    assert om.Task.open(store, TASK).header == first  # not overwritten by the rerun
    assert first.stages == (STAGE,)


# -- a store that ignores conditions -------------------------------------------------------


def test_a_store_that_ignores_conditional_headers_is_refused(
    server: Server, store: om.ObjectStore
) -> None:
    with ignoring_conditions(server.endpoint_url) as proxy:
        through = server.connect(store.prefix, endpoint_url=proxy.endpoint_url)
        with pytest.raises(om.UnsupportedStore, match="does not enforce conditional") as refused:
            om.Task.create(through, TASK, stages=[STAGE])
        assert ("PUT", f"/{store.bucket}/{store.full_key(TASK)}/task.json") not in proxy.requests
    message = str(refused.value)
    assert "If-None-Match: * is ignored" in message, message
    assert "If-Match is ignored" in message, message
    assert list(store.list_keys(f"{TASK}/")) == []
    with pytest.raises(om.NotFound, match=f"task '{TASK}' does not exist"):
        om.Task.open(store, TASK)
    assert list(store.list_keys("")) == [], "the probe left objects behind"


@pytest.mark.parametrize("retries", [True, False], ids=["client-retries", "no-retries"])
def test_a_lost_probe_response_does_not_refuse_a_good_store(
    server: Server, store: om.ObjectStore, retries: bool
) -> None:
    """A dropped answer to a probe write must not look like a refusal (nor leak the probe)."""
    extra = {} if retries else {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    with FaultProxy(server.endpoint_url) as proxy:
        client = make_client(proxy.endpoint_url, **extra)
        through = om.connect(f"s3://{store.bucket}/{store.prefix}", client=client)
        proxy.drop_response("PUT", ".objmanifest-probe", count=2)
        task = om.Task.create(through, TASK, stages=[STAGE])
        assert proxy.dropped == 2
    assert om.Task.open(store, TASK).stages == task.stages
    assert list(store.list_keys("")) == [f"{TASK}/task.json"], "the probe left objects behind"
