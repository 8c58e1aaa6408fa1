"""A deterministic simulation of many agents on one ``MemoryStore``, judged by the checker.

Every agent is a thread, but only one runs at a time: each store call (a fault hook of its
``MemoryStore``) and each sleep hands control back to the scheduler, which picks the next
agent with the seed's random generator. Time is simulated: the runtime each agent's store
is given (``objmanifest.core.runtime.Runtime``) has the simulated monotonic clock and sleep, a
seeded ``random``, ids made from the seed, background jobs (lease renewal) that fire at
their agent's own store calls, and pools that run their jobs at once in the caller. So a
seed replays exactly: the same agents, the same operations, the same faults, the same log.

Agents: a declarer (declares the files in batches), producers (``claim``, ``claim_many``,
``claim(stage=)``, ``renew``, ``put`` single and chunked, ``put_many``, ``fail``,
``release``), consumers (queue entries by any agent, broadcast entries by role), and a
janitor (``reap``, ``archive``, ``gc``). Faults while the run is in its chaos phase: 503s
(a call refused before it is applied), lost answers (applied, answer lost), writes lost
on their way (not applied, outcome unknown), reads cut short, stalls past the lease
(zombies: the agent and its renewals stop, then it carries on with the call), jumps of the
store's clock, data rotting at rest, agents that die (every call they would still make
fails) and restart with the same name. Then a drain phase without faults lets every entry
reach its end, and ``checker.check`` judges the store and the log.

    python -m tests.support.sim --seeds 0-99
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from objmanifest.cas import codecs
from objmanifest.core import changes, checksum, leases
from objmanifest.core.model import Claim, Entry
from objmanifest.core.runtime import Repeating, Runtime
from objmanifest.core.states import State
from objmanifest.data import transfer
from objmanifest.errors import (
    AlreadyConsumed,
    ChecksumMismatch,
    DataChanged,
    DataRemoved,
    LeaseLost,
    NotAConsumer,
    NotClaimable,
    NotFound,
    NotReady,
    ObjManifestError,
    StoreError,
)
from objmanifest.store import memory
from objmanifest.store.errors import NoSuchObject, OutcomeUnknown
from objmanifest.store.memory import MemoryStore
from objmanifest.task import Task
from tests.support import checker
from tests.support.checker import OK, REFUSED, UNKNOWN, OpLog, Violation
from tests.support.internals import engine

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
MiB = 1024 * 1024
LEASE = 10.0
STAGES = ("make", "join")
STORE_WRITES = frozenset(
    {"put", "delete", "create_upload", "upload_part", "complete_upload", "abort_upload"}
)
WRITES = frozenset({"put", "complete_upload"})
"""Store calls whose request can be lost on its way (not applied, outcome unknown)."""


class Killed(BaseException):
    """Raised in a dead agent's thread at every store call it would still make."""


@dataclass(frozen=True)
class Settings:
    """One simulation's shape and fault rates (per store call, or per scheduling step)."""

    files: int = 16
    """Files of the first stage; half as many of the second depend on them."""
    producers: int = 3
    shells: int = 1
    """Producers that make each call from a process of their own (``Shell``)."""
    chaos_ops: int = 260
    """Agent operations logged before the faults stop and the run drains."""
    drain_steps: int = 60_000
    p_503: float = 0.02
    p_lost: float = 0.01
    p_lost_write: float = 0.08
    """Lost answers: of a read, of a write (applied, then the answer lost)."""
    p_dropped: float = 0.01
    p_cut: float = 0.02
    p_stall: float = 0.004
    p_jump: float = 0.001
    p_kill: float = 0.0015
    p_rot: float = 0.001
    p_slow: float = 0.05
    """A producer pauses past its lease between its claim and its put."""
    p_chunked: float = 0.03
    chunked_max: int = 2
    skew: float = 3 * LEASE
    """Each agent's local clock is off by up to this many seconds (only what a bug that
    reads it would see)."""


@dataclass
class Result:
    seed: int
    agents: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)
    """Exceptions the public API let out that it must not (not an ``ObjManifestError``)."""
    log: OpLog = field(default_factory=OpLog)
    steps: int = 0
    sim_seconds: float = 0.0
    settled: bool = False
    states: Counter[str] = field(default_factory=Counter)
    """The entries' states at the end."""
    puts: Counter[str] = field(default_factory=Counter)
    """Puts acknowledged, by how: single, chunked, put_many."""
    by_shells: Counter[str] = field(default_factory=Counter)
    """Operations the shell agents (each call from a process of its own) saw succeed."""
    stuck: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.violations or self.escaped)

    def line(self) -> str:
        faults = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        return (
            f"seed {self.seed}: {self.agents} agents, {sum(self.ops.values())} ops, "
            f"{self.steps} steps, {self.sim_seconds:.0f} s simulated; faults: {faults or '-'}; "
            f"end states: {_counts(self.states)}; "
            f"violations {len(self.violations)}, escaped {len(self.escaped)}"
        )


# -- the scheduler ----------------------------------------------------------------------------


class Inline(cf.Executor):
    """A pool that runs each job at once, in the caller's thread (only one runs anyway)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:
            future.set_exception(e)
        return future


@dataclass
class Timer:
    job: Callable[[], bool]
    interval: float
    due: float
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


class Actor:
    """One incarnation of one agent: a thread that runs only while it holds the baton."""

    def __init__(self, sim: Sim, name: str, kind: str, incarnation: int) -> None:
        self.sim, self.name, self.kind, self.incarnation = sim, name, kind, incarnation
        tag = f"{sim.seed}/{name}/{incarnation}"
        self.choices = random.Random(f"{tag}/choices")
        self.lib_random = random.Random(f"{tag}/library")
        self.faults = random.Random(f"{tag}/faults")
        self.ids = 0
        self.skew = random.Random(f"{sim.seed}/{name}/skew").uniform(-1, 1) * sim.settings.skew
        self.wake = sim.now
        self.killed = False
        self.done = False
        self.timers: list[Timer] = []
        self.in_timer = False
        self.baton = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._main, name=f"sim-{name}", daemon=True)

    def new_id(self) -> str:
        self.ids += 1
        tag = f"{self.sim.seed}/{self.name}/{self.incarnation}/{self.ids}"
        return hashlib.blake2b(tag.encode(), digest_size=16).hexdigest()

    def runtime(self) -> Runtime:
        sim = self.sim
        return Runtime(
            monotonic=sim.monotonic,
            sleep=sim.sleep,
            random=self.lib_random.random,
            new_id=self.new_id,
            every=sim.every,
            pool=lambda workers, name: Inline(),
            at_once=sim.at_once,
        )

    def _main(self) -> None:
        self.baton.acquire()
        try:
            if not self.killed:
                AGENTS[self.kind](self).run()
        except Killed:
            pass
        except BaseException as e:  # reported as a finding, and the thread ends cleanly
            self.sim.escape(self, e)
        finally:
            self.done = True
            self.sim.yielded.release()


AGENT_NAMES = ("declarer", "janitor", "q1", "q2", "x1", "y1", "y2")


class Sim:
    """One seeded run: the scheduler, the simulated clocks, the faults and the agents."""

    def __init__(self, seed: int, settings: Settings | None = None) -> None:
        self.seed = seed
        self.settings = settings or Settings()
        self.rng = random.Random(f"{seed}/scheduler")
        self.now = 0.0
        self.store_offset = 0.0
        self.chaos = True
        self.stopping = False
        self.current: Actor | None = None
        self.yielded = threading.Semaphore(0)
        self.actors: list[Actor] = []
        self.restarts: list[tuple[float, str, str, int]] = []
        self.result = Result(seed)
        self.log = self.result.log
        self.chunked = 0
        _RUNS[0] += 1
        self.bucket = f"sim-{seed}-{_RUNS[0]}"
        self.files = [f"m{i:02d}" for i in range(self.settings.files)]
        self.joins = [f"j{i:02d}" for i in range(0, self.settings.files, 2)]
        self.god = MemoryStore(self.bucket, clock=self.store_clock, runtime=self._god_runtime())

    # -- clocks and the runtime -----------------------------------------------------------

    def monotonic(self) -> float:
        return self.now

    def store_clock(self) -> datetime:
        return T0 + timedelta(seconds=self.now + self.store_offset)

    def local_now(self) -> datetime:
        """The current agent's own clock (skewed): only a bug reads it."""
        skew = self.current.skew if self.current is not None else 0.0
        return T0 + timedelta(seconds=self.now + skew)

    def _god_runtime(self) -> Runtime:
        ids = iter(range(1, 1 << 30))
        return Runtime(
            monotonic=self.monotonic,
            sleep=lambda s: None,
            random=random.Random(f"{self.seed}/god").random,
            new_id=lambda: hashlib.blake2b(f"{self.seed}/god/{next(ids)}".encode()).hexdigest()[
                :32
            ],
            every=self.every,
            pool=lambda workers, name: Inline(),
            at_once=self.at_once,
        )

    def sleep(self, seconds: float) -> None:
        actor = self.current
        if actor is None:
            return
        actor.wake = self.now + max(0.0, seconds)
        self.switch()

    def every(self, job: Callable[[], bool], interval: float, name: str) -> Repeating:
        timer = Timer(job, interval, self.now + interval)
        if self.current is not None:
            self.current.timers.append(timer)
        return timer

    def at_once(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        order = list(range(len(calls)))
        self.rng.shuffle(order)
        results: list[Any] = [None] * len(calls)
        errors: list[BaseException | None] = [None] * len(calls)
        for i in order:
            try:
                results[i] = calls[i]()
            except Exception as e:
                errors[i] = e
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results

    # -- switching ------------------------------------------------------------------------

    def switch(self) -> None:
        """Give the baton back to the scheduler and wait to be picked again."""
        actor = self.current
        assert actor is not None
        self.yielded.release()
        actor.baton.acquire()
        if actor.killed:
            raise Killed()

    def hook(self, op: str, key: str) -> None:
        """Called before every store call of an agent: faults, background jobs, a switch."""
        actor = self.current
        if actor is None:
            return
        if actor.killed:
            raise Killed()
        self.fire_timers(actor)
        if self.chaos and not actor.in_timer:
            self.maybe_fault(actor, op, key)
        actor.wake = self.now
        self.switch()
        self.maybe_fault_after(actor, op, key)

    def fire_timers(self, actor: Actor) -> None:
        if actor.in_timer:
            return
        for timer in list(actor.timers):
            if timer.stopped:
                actor.timers.remove(timer)
                continue
            if self.now < timer.due:
                continue
            timer.due = self.now + timer.interval
            actor.in_timer = True
            try:
                again = timer.job()
            except Exception as e:
                self.escape(actor, e)
                again = True
            finally:
                actor.in_timer = False
            if not again:
                timer.stopped = True

    def maybe_fault(self, actor: Actor, op: str, key: str) -> None:
        """Faults decided before the call: a stall, then perhaps nothing reaching it."""
        s, rng = self.settings, actor.faults
        if rng.random() < s.p_stall:
            self.result.faults["stall"] += 1
            actor.wake = self.now + LEASE * rng.uniform(1.3, 2.5)
            self.yielded.release()
            actor.baton.acquire()
            if actor.killed:
                raise Killed()

    def maybe_fault_after(self, actor: Actor, op: str, key: str) -> None:
        """Faults of the call itself, decided once the agent runs it."""
        s, rng = self.settings, actor.faults
        if not self.chaos:
            return
        roll = rng.random()
        if roll < s.p_503:
            self.result.faults["503"] += 1
            raise StoreError(f"could not {op} {key}: 503 SlowDown (simulated)")
        roll -= s.p_503
        if op in WRITES and roll < s.p_dropped:
            self.result.faults["dropped"] += 1
            raise OutcomeUnknown(f"{key}: the request was lost on its way (simulated)")
        roll -= s.p_dropped
        store = self.stores.get(actor)
        if store is None:
            return
        p_lost = s.p_lost_write if op in STORE_WRITES else s.p_lost
        if roll < p_lost:
            self.result.faults["lost"] += 1
            store.faults.add(op=op, key=key, effect="lose")
            return
        roll -= p_lost
        if op == "open" and roll < s.p_cut:
            self.result.faults["cut"] += 1
            store.faults.add(op="open", key=key, effect="cut")

    stores: dict[Actor, MemoryStore]

    def store_for(self, actor: Actor) -> MemoryStore:
        store = MemoryStore(self.bucket, clock=self.store_clock, runtime=actor.runtime())
        store.faults.hooks.append(self.hook)
        self.stores[actor] = store
        return store

    def escape(self, actor: Actor, e: BaseException) -> None:
        if isinstance(e, Killed):
            raise e
        self.result.escaped.append(f"{actor.name}: {type(e).__name__}: {e}")

    # -- global faults --------------------------------------------------------------------

    def global_faults(self) -> None:
        s, rng = self.settings, self.rng
        if rng.random() < s.p_jump:
            self.result.faults["clock-jump"] += 1
            self.store_offset += rng.choice((-1, 1)) * rng.uniform(2, 2 * LEASE)
        if rng.random() < s.p_kill:
            alive = [a for a in self.actors if not a.done and not a.killed]
            if alive:
                victim = rng.choice(alive)
                self.result.faults["kill"] += 1
                victim.killed = True
                victim.wake = self.now
                self.restarts.append(
                    (self.now + rng.uniform(1, 6), victim.name, victim.kind, victim.incarnation)
                )
        if rng.random() < s.p_rot:
            self.rot()

    def rot(self) -> None:
        """Flip one bit of a ready entry's single data object, at rest."""
        task = Task.open(self.god, "job")
        ready = sorted(
            (e.file_id, e.key)
            for stage in STAGES
            for e in task.entries(stage)
            if e.state is State.ready and e.key is not None and not e.is_chunked
        )
        if not ready:
            return
        _, key = self.rng.choice(ready)
        try:
            blob = self.god.get(key)
        except (NoSuchObject, ObjManifestError):
            return
        assert blob is not None
        body = bytearray(blob.body)
        body[len(body) // 2] ^= 0x01
        self.god.put(key, bytes(body), metadata=blob.metadata)
        self.result.faults["rot"] += 1

    # -- the run --------------------------------------------------------------------------

    def spawn(self, name: str, kind: str, incarnation: int = 0) -> Actor:
        actor = Actor(self, name, kind, incarnation)
        self.actors.append(actor)
        actor.thread.start()
        return actor

    def settled(self) -> bool:
        """Every file declared, every entry consumed, dead or blocked behind a dead one."""
        task = Task.open(self.god, "job")
        found: dict[str, Entry] = {}
        for name in engine(task).layout.all_shards(task.stages):
            shard = engine(task).read_shard(name)
            found.update(shard.entries)
            for fid, ref in (shard.archived or {}).items():
                found[fid] = Entry(file_id=fid, stage=shard.stage, state=ref.state)
        if len(found) < len(self.files) + len(self.joins):
            return False
        for e in found.values():
            if e.state in (State.consumed, State.dead):
                continue
            deps = [found.get(d) for d in e.depends_on]
            if e.state in (State.pending, State.failed) and any(
                d is not None and d.state is State.dead for d in deps
            ):
                continue
            return False
        return True

    def run(self) -> Result:
        self.stores = {}
        self.create()
        names = [*AGENT_NAMES, *(f"p{i}" for i in range(self.settings.producers))]
        names += [f"s{i}" for i in range(self.settings.shells)]
        for name in names:
            self.spawn(name, name.rstrip("0123456789") if name[0] in "pqsxy" else name)
        drain_from: int | None = None
        steps = next_check = 0
        CURRENT[:] = [self]
        try:
            while True:
                if self.chaos and len(self.log) >= self.settings.chaos_ops:
                    self.chaos = False
                    drain_from = steps
                for a in self.actors:
                    if not a.done and a.killed:
                        a.wake = min(a.wake, self.now)
                for due, name, kind, inc in sorted(self.restarts):
                    if due <= self.now or self.stopping:
                        self.restarts.remove((due, name, kind, inc))
                        if not self.stopping:
                            self.spawn(name, kind, inc + 1)
                alive = [a for a in self.actors if not a.done]
                if drain_from is not None and not self.stopping and steps >= next_check:
                    next_check = steps + 200
                    if self.settled() or steps - drain_from > self.settings.drain_steps:
                        self.result.settled = steps - drain_from <= self.settings.drain_steps
                        self.stopping = True
                        for a in alive:
                            a.wake = min(a.wake, self.now)
                if not alive and (self.stopping or not self.restarts):
                    break
                runnable = [a for a in alive if a.wake <= self.now]
                if not runnable:
                    wakes = [a.wake for a in alive] + [r[0] for r in self.restarts]
                    self.now = max(self.now, min(wakes))
                    continue
                actor = self.rng.choice(runnable)
                self.current = actor
                actor.baton.release()
                self.yielded.acquire()
                self.current = None
                steps += 1
                self.now += self.rng.uniform(0.0, 0.02)
                if self.chaos:
                    self.global_faults()
        finally:
            for a in self.actors:  # never leave a thread waiting for the baton
                if not a.done:
                    a.killed = True
                    a.baton.release()
        self.result.steps = steps
        self.result.sim_seconds = self.now
        self.result.agents = len(names)
        for op in self.log:
            self.result.ops[op.kind] += 1
            self.result.outcomes[op.outcome] += 1
            if op.kind == checker.PUT and op.outcome == OK:
                self.result.puts[op.detail] += 1
            if op.agent.startswith("s") and op.outcome == OK:
                self.result.by_shells[op.kind] += 1
        task = Task.open(self.god, "job")
        for name in engine(task).layout.all_shards(task.stages):
            shard = engine(task).read_shard(name)
            for e in shard.entries.values():
                self.result.states[e.state.value] += 1
                if e.state not in (State.consumed, State.dead):
                    self.result.stuck.append(
                        f"{e.file_id} {e.state.value} epoch {e.epoch} owner {e.owner} "
                        f"consumed_by {list(e.consumed_by)} deps {list(e.depends_on)}"
                    )
            for ref in (shard.archived or {}).values():
                self.result.states[ref.state.value] += 1
        live = {a.name for a in self.actors if not a.done}
        self.result.violations = checker.check(task, self.log, live_agents=live)
        memory._BUCKETS.pop(self.bucket, None)
        return self.result

    def create(self) -> None:
        """The task, in one of the three shard layouts (by the seed): a shard per stage,
        the first stage split in three partitions, or one shard for the whole task."""
        layout: dict[str, Any] = [{}, {"partitions": {"make": 3}}, {"layout": "task"}][
            self.seed % 3
        ]
        Task.create(self.god, "job", list(STAGES), lease_seconds=LEASE, max_retries=3, **layout)

    def record(self, actor: Actor, kind: str, outcome: str = OK, **fields: Any) -> None:
        fields.setdefault("at", round(self.now, 3))
        self.log.record(actor.name, kind, outcome, **fields)


_RUNS = [0]
CURRENT: list[Sim] = []
"""The simulation running, for a planted bug that reads an agent's own clock."""


def local_now() -> datetime:
    """The running agent's own clock, skewed by up to ``Settings.skew``."""
    return CURRENT[0].local_now()


# -- the agents -------------------------------------------------------------------------------


def content(file_id: str, agent: str, epoch: int, size: int) -> bytes:
    unit = f"{file_id}|{agent}|{epoch}|".encode()
    return (unit * (size // len(unit) + 1))[:size]


class Agent:
    """The loop of one agent incarnation; ``step`` is one operation or a short sleep."""

    def __init__(self, actor: Actor) -> None:
        self.actor, self.sim = actor, actor.sim
        self.rng = actor.choices
        self.task: Task | None = None

    def sleep(self, low: float, high: float) -> None:
        self.sim.sleep(self.rng.uniform(low, high))

    def record(self, kind: str, outcome: str = OK, **fields: Any) -> None:
        self.sim.record(self.actor, kind, outcome, **fields)

    def run(self) -> None:
        store = self.sim.store_for(self.actor)
        while self.task is None:
            if self.sim.stopping:
                return
            try:
                self.task = Task.open(store, "job")
            except ObjManifestError:
                self.sleep(0.1, 0.5)
        while not self.sim.stopping:
            try:
                self.step(self.task)
            except ObjManifestError:  # a read of its own failed (store fault): carry on
                self.sleep(0.1, 1)

    def step(self, task: Task) -> None:
        raise NotImplementedError

    def attempt(
        self,
        kind: str,
        call: Callable[[], Any],
        refusals: tuple[type[Exception], ...] = (),
        **fields: Any,
    ) -> tuple[str, Any]:
        """Run one call of the public API and log its outcome (not when it succeeded: the
        caller logs what it learnt)."""
        try:
            return OK, call()
        except refusals as e:
            self.record(kind, REFUSED, detail=type(e).__name__, **fields)
            return REFUSED, e
        except ObjManifestError as e:
            self.record(kind, UNKNOWN, detail=type(e).__name__, **fields)
            return UNKNOWN, e


class Declarer(Agent):
    def step(self, task: Task) -> None:
        plan: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
            (f, "make", (), () if i % 2 == 0 else ("x", "y")) for i, f in enumerate(self.sim.files)
        ]
        plan += [(j, "join", (f"m{j[1:]}",), ()) for j in self.sim.joins]
        have: set[str] = set()
        for name in engine(task).layout.all_shards(task.stages):
            shard = engine(task).read_shard(name)
            have |= set(shard.entries) | set(shard.archived or {})
        # Not the index: a declaration cut short is in the index and in no shard yet.
        todo = [p for p in plan if p[0] not in have]
        if not todo:
            self.sleep(5, 10)
            return
        batch = todo[: self.rng.randint(1, 5)]
        if self.rng.random() < 0.5:  # as `objmanifest declare --from`: a process of its own
            task = Task.open(self.sim.store_for(self.actor), "job")
        outcome, _ = self.attempt(
            checker.DECLARE, lambda: task.declare_many(batch), file_id=batch[0][0]
        )
        if outcome == OK:
            for fid, stage, _deps, _cons in batch:
                self.record(checker.DECLARE, file_id=fid, stage=stage)
        self.sleep(0.2, 2)


class Producer(Agent):
    def step(self, task: Task) -> None:
        stage = self.rng.choice(STAGES)
        roll = self.rng.random()
        me = task.agent(self.actor.name)
        claims: list[Claim] = []
        if roll < 0.55:
            limit = self.rng.randint(1, 3)
            outcome, got = self.attempt(
                checker.CLAIM_MANY, lambda: me.claim_many(stage, limit), stage=stage
            )
            claims = got if outcome == OK else []
        elif roll < 0.9:
            outcome, got = self.attempt(
                checker.CLAIM_MANY, lambda: me.claim(stage=stage), stage=stage
            )
            claims = [got] if outcome == OK and got is not None else []
        else:
            fid = self.rng.choice(self.sim.files if stage == "make" else self.sim.joins)
            outcome, got = self.attempt(
                checker.CLAIM,
                lambda: me.claim(fid),
                (NotClaimable, NotFound),
                file_id=fid,
                stage=stage,
            )
            claims = [got] if outcome == OK else []
        for claim in claims:
            self.record(checker.CLAIM, file_id=claim.file_id, stage=stage, epoch=claim.epoch)
        if not claims:
            self.sleep(0.3, 1.5)
            return
        if len(claims) > 1 and self.rng.random() < 0.3:
            self.put_many(task, claims)
            return
        for claim in claims:
            self.work(task, claim)

    def holding(self, task: Task, claim: Claim) -> tuple[Any, Claim]:
        """The agent a holder call is made by, and the claim it names: this agent's own."""
        return task.agent(self.actor.name), claim

    def held(self, task: Task, claim: Claim, call: Callable[[Any, Claim], Any]) -> Any:
        me, held = self.holding(task, claim)
        return call(me, held)

    def work(self, task: Task, claim: Claim) -> None:
        fields: dict[str, Any] = {
            "file_id": claim.file_id,
            "stage": claim.stage,
            "epoch": claim.epoch,
        }
        if self.sim.chaos and self.rng.random() < self.sim.settings.p_slow:
            self.sim.result.faults["slow"] += 1  # a pause past the lease: a zombie holder
            self.sleep(1.2 * LEASE, 2.5 * LEASE)
        else:
            self.sleep(0, 0.5 * LEASE)
        if self.rng.random() < 0.2:
            outcome, got = self.attempt(
                checker.RENEW,
                lambda: self.held(task, claim, lambda me, c: me.renew(c)),
                (LeaseLost,),
                **fields,
            )
            if outcome == OK:
                self.record(checker.RENEW, **fields)
                claim = got
        roll = self.rng.random()
        if roll < 0.07:
            outcome, _ = self.attempt(
                checker.FAIL,
                lambda: self.held(task, claim, lambda me, c: me.fail(c, "simulated")),
                (LeaseLost,),
                **fields,
            )
            if outcome == OK:
                self.record(checker.FAIL, **fields)
            return
        if roll < 0.10:
            outcome, _ = self.attempt(
                checker.RELEASE,
                lambda: self.held(task, claim, lambda me, c: me.release(c)),
                (LeaseLost,),
                **fields,
            )
            if outcome == OK:
                self.record(checker.RELEASE, **fields)
            return
        self.put(task, claim)

    def data(self, claim: Claim) -> tuple[bytes, dict[str, Any]]:
        s = self.sim.settings
        if self.sim.chunked < s.chunked_max and self.rng.random() < s.p_chunked:
            self.sim.chunked += 1
            size = 5 * MiB + self.rng.randint(1, 4096)
            return content(claim.file_id, claim.agent, claim.epoch, size), {
                "part_size": 5 * MiB,
                "threshold": 5 * MiB,
            }
        size = self.rng.randint(1, 3000)
        return content(claim.file_id, claim.agent, claim.epoch, size), {}

    def put(self, task: Task, claim: Claim) -> None:
        fields: dict[str, Any] = {
            "file_id": claim.file_id,
            "stage": claim.stage,
            "epoch": claim.epoch,
        }
        data, options = self.data(claim)
        for _ in range(3):
            outcome, got = self.attempt(
                checker.PUT,
                lambda: self.held(task, claim, lambda me, c: me.put(c, data, **options)),
                (LeaseLost,),
                **fields,
            )
            if outcome == OK:
                how = "chunked" if options else "single"
                self.record(checker.PUT, checksum=got.checksum, detail=how, **fields)
                return
            if outcome == REFUSED:
                return
        outcome, _ = self.attempt(
            checker.FAIL,
            lambda: self.held(task, claim, lambda me, c: me.fail(c, "could not put")),
            (LeaseLost,),
            **fields,
        )
        if outcome == OK:
            self.record(checker.FAIL, **fields)

    def put_many(self, task: Task, claims: list[Claim]) -> None:
        datas = [content(c.file_id, c.agent, c.epoch, self.rng.randint(1, 2000)) for c in claims]

        def put_many() -> Any:
            me, _ = self.holding(task, claims[0])
            held = [self.holding_with(me, c) for c in claims]
            return me.put_many(held, datas)

        outcome, got = self.attempt(checker.PUT, put_many)
        if outcome != OK:
            return
        for claim, result in zip(claims, got, strict=True):
            fields: dict[str, Any] = {
                "file_id": claim.file_id,
                "stage": claim.stage,
                "epoch": claim.epoch,
            }
            if isinstance(result, Entry):
                self.record(checker.PUT, checksum=result.checksum, detail="put_many", **fields)
            elif isinstance(result, LeaseLost):
                self.record(checker.PUT, REFUSED, detail="LeaseLost", **fields)
            elif isinstance(result, ObjManifestError):
                self.record(checker.PUT, UNKNOWN, detail=type(result).__name__, **fields)
            else:
                self.sim.escape(self.actor, result)

    def holding_with(self, me: Any, claim: Claim) -> Claim:
        """The claim ``me`` names in a batch: this agent's own."""
        return claim


class Shell(Producer):
    """A producer run as shell steps (``objmanifest claim``, then ``put``, ``renew``,
    ``fail``, ``release`` in later processes): each call from a process of its own (a
    ``Task`` opened for it: no cached version, no journal block known to be stored), each
    holder call on the claim rebuilt from the file id and epoch the claim printed
    (``Agent.resume``), as the CLI rebuilds it."""

    def opened(self) -> Task:
        return Task.open(self.sim.store_for(self.actor), "job")

    def step(self, task: Task) -> None:
        super().step(self.opened())

    def holding(self, task: Task, claim: Claim) -> tuple[Any, Claim]:
        me = self.opened().agent(self.actor.name)
        return me, me.resume(claim.file_id, claim.epoch)

    def holding_with(self, me: Any, claim: Claim) -> Claim:
        resumed: Claim = me.resume(claim.file_id, claim.epoch)
        return resumed


class Consumer(Agent):
    """Consumes ready entries it may take: queue entries (any agent) or those naming its
    role (``x1`` has role ``x``)."""

    def step(self, task: Task) -> None:
        role = self.actor.name.rstrip("0123456789")
        me = task.agent(self.actor.name, role=role)
        stage = self.rng.choice(STAGES)
        try:
            got = task.entries(stage)
        except ObjManifestError:
            self.sleep(0.2, 1)
            return
        mine = sorted(
            e.file_id
            for e in got
            if e.state is State.ready
            and (e.is_queue if role == "q" else role in e.consumers and role not in e.consumed_by)
        )
        if not mine:
            self.sleep(0.3, 1.5)
            return
        fid = self.rng.choice(mine)
        outcome, data = self.attempt(
            checker.CONSUME,
            lambda: me.consume(fid),
            CONSUME_REFUSALS,
            file_id=fid,
            stage=stage,
        )
        if outcome == OK:
            self.record(
                checker.CONSUME,
                file_id=fid,
                stage=stage,
                checksum=checksum.of_bytes(data),
                role=None if role == "q" else role,
            )


CONSUME_REFUSALS = (
    ChecksumMismatch,
    NotReady,
    AlreadyConsumed,
    DataRemoved,
    DataChanged,
    NotAConsumer,
    NotFound,
)
"""What a consume may be told instead of the bytes: nothing was consumed."""


class Janitor(Agent):
    def step(self, task: Task) -> None:
        self.sleep(2, 6)
        roll = self.rng.random()
        if roll < 0.5:
            outcome, got = self.attempt(checker.REAP, task.reap)
            if outcome == OK:
                for e in got:
                    self.record(checker.REAP, file_id=e.file_id, stage=e.stage, epoch=e.epoch)
        elif roll < 0.8:
            age = self.rng.choice((0.0, 5.0, 30.0))
            outcome, got = self.attempt(
                checker.ARCHIVE, lambda: task.archive(older_than=age, actor=self.actor.name)
            )
            if outcome == OK:
                for stage, ids in got.archived.items():
                    for fid in ids:
                        self.record(checker.ARCHIVE, file_id=fid, stage=stage)
        else:
            older = self.rng.choice((None, 5.0))
            outcome, got = self.attempt(checker.GC, lambda: task.gc(consumed_older_than=older))
            if outcome == OK:
                self.record(checker.GC, detail=f"{len(got.removed)} removed")


AGENTS: dict[str, Callable[[Actor], Agent]] = {
    "declarer": Declarer,
    "janitor": Janitor,
    "p": Producer,
    "s": Shell,
    "q": Consumer,
    "x": Consumer,
    "y": Consumer,
}


# -- deliberately broken variants of the library ---------------------------------------------

Setattr = Callable[[object, str, Any], None]
"""``monkeypatch.setattr`` in a test, plain ``setattr`` on the command line."""


def no_fencing(patch: Setattr) -> None:
    """A holder's change is applied whatever its epoch and name."""
    patch(changes, "_held", lambda shard, claim: changes._entry(shard, claim.file_id))


def local_clock(patch: Setattr) -> None:
    """A lease judged on the agent's own (skewed) clock instead of the store's."""
    expired = leases.expired
    patch(leases, "expired", lambda entry, now: expired(entry, local_now()))


def no_read_back(patch: Setattr) -> None:
    """A shard write whose answer was lost is not recognised by its commit id: the command
    is applied again on the version it made."""
    patch(codecs.ShardCodec, "commit_ids", lambda self, doc: ())


def no_checksum(patch: Setattr) -> None:
    """Downloaded bytes are not compared with the checksum recorded at ready."""
    patch(transfer, "_check", lambda *args, **kwargs: None)


BROKEN: dict[str, tuple[Callable[[Setattr], None], str]] = {
    "no-fencing": (no_fencing, checker.FENCED_CHANGE),
    "local-clock": (local_clock, checker.LEASE_STOLEN),
    "no-read-back": (no_read_back, checker.UNASKED_CHANGE),
    "no-checksum": (no_checksum, checker.BAD_BYTES),
}
"""Each planted bug, and the invariant that must catch it."""


# -- running seeds ----------------------------------------------------------------------------


def simulate(seed: int, settings: Settings | None = None) -> Result:
    return Sim(seed, settings).run()


def seeds_of(text: str) -> list[int]:
    """``0-99``, ``3,5,8-10``."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            out += range(int(low), int(high) + 1)
        elif part.strip():
            out.append(int(part))
    return out


@dataclass
class Totals:
    seeds: int = 0
    agents: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    puts: Counter[str] = field(default_factory=Counter)
    by_shells: Counter[str] = field(default_factory=Counter)
    states: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    escaped: int = 0
    steps: int = 0
    sim_seconds: float = 0.0
    unsettled: int = 0
    failing: list[int] = field(default_factory=list)

    def add(self, r: Result) -> None:
        self.seeds += 1
        self.agents += r.agents
        self.ops.update(r.ops)
        self.outcomes.update(r.outcomes)
        self.puts.update(r.puts)
        self.by_shells.update(r.by_shells)
        self.states.update(r.states)
        self.steps += r.steps
        self.sim_seconds += r.sim_seconds
        self.faults.update(r.faults)
        self.violations.update(v.invariant for v in r.violations)
        self.escaped += len(r.escaped)
        self.unsettled += not r.settled
        if r.failed:
            self.failing.append(r.seed)

    def lines(self) -> Iterator[str]:
        yield f"seeds: {self.seeds}"
        yield f"agents: {self.agents}"
        yield f"ops: {sum(self.ops.values())} ({_counts(self.ops)})"
        yield f"outcomes: {_counts(self.outcomes)}"
        yield f"puts acknowledged: {_counts(self.puts)}"
        yield f"shell agents' calls that succeeded: {_counts(self.by_shells)}"
        yield f"entries at the end: {_counts(self.states)}"
        yield f"scheduling steps: {self.steps}, simulated time: {self.sim_seconds:.0f} s"
        yield f"faults: {sum(self.faults.values())} ({_counts(self.faults)})"
        yield f"invariants checked: {', '.join(checker.INVARIANTS)}"
        yield f"violations: {sum(self.violations.values())} ({_counts(self.violations) or '-'})"
        yield f"escaped errors: {self.escaped}"
        yield f"runs that did not settle: {self.unsettled}"
        yield f"failing seeds: {self.failing or '-'}"


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.sim", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", default="0-19", help="seeds to run: 0-99, or 1,5,7-9")
    parser.add_argument(
        "--ops", type=int, default=Settings.chaos_ops, help="ops per seed under faults"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="a line per seed, and each violation"
    )
    parser.add_argument(
        "--logs", type=Path, help="write each seed's operation log to DIR/seed-N.jsonl"
    )
    parser.add_argument(
        "--files", type=int, default=Settings.files, help="files of the first stage per seed"
    )
    parser.add_argument(
        "--broken", choices=sorted(BROKEN), help="plant one of the deliberately broken variants"
    )
    args = parser.parse_args(argv)
    if args.broken:
        BROKEN[args.broken][0](setattr)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    logging.getLogger("objmanifest").setLevel(logging.CRITICAL)  # the faults are planned
    totals = Totals()
    started = time.monotonic()
    for seed in seeds_of(args.seeds):
        r = simulate(seed, Settings(chaos_ops=args.ops, files=args.files))
        totals.add(r)
        if args.logs is not None:
            r.log.save(args.logs / f"seed-{seed}.jsonl")
        if args.verbose or r.failed:
            print(r.line())
            for v in r.violations[:20]:
                print(f"  {v}")
            for e in r.escaped[:20]:
                print(f"  escaped: {e}")
            if not r.settled:
                print(f"  did not settle: {r.stuck[:10]}")
    for line in totals.lines():
        print(line)
    print(f"wall time: {time.monotonic() - started:.1f} s")
    return 1 if totals.failing else 0


if __name__ == "__main__":
    sys.exit(main())
