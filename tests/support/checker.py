"""The invariants of a run, proved after it from the store and the agents' operation logs.

Shared by the deterministic simulation (``tests/support/sim.py``, agents as scheduled threads on
``MemoryStore``) and the chaos harness (agent processes against real servers). Each agent
appends to an ``OpLog`` every operation it believes succeeded (``ok``), whose outcome it
does not know (``unknown``: a lost answer, a store error after sending), and every refusal
it was given (``refused``: ``LeaseLost``, ``NotClaimable``), which promises that nothing
was written. The log is JSON lines, so processes can write it and the harness merge it.

``check(task, oplog)`` then reads the task's journal (every committed version of every
shard and the index, ``Task.journal``) and its shards, and returns every ``Violation``:

======================  ============================================================
``ready-twice``         an entry made ready twice in one epoch
``fenced-change``       a holder change (renew, finish, fail, release) landed for a holder
                        that was not the entry's current one (stale epoch or other owner),
                        or a ready entry points at data of another epoch than its own
``unasked-change``      a holder's claim, fail or release landed although its agent logged
                        no such operation, or was told it was refused
``lease-stolen``        a lease taken over or reaped before it ended (store time)
``ack-missing``         an operation an agent was told succeeded is not in the journal
``bad-bytes``           a consumer got bytes that match no checksum the entry was made
                        ready with
``not-settled``         at the end, an entry neither terminal (nor blocked behind a dead
                        dependency) nor legitimately leased
``journal-gap``         a shard's or the index's journal versions not contiguous 1..N, or
                        two commits recorded at one version
``lifecycle``           a recorded transition the lifecycle table (``states.py``) forbids
======================  ============================================================
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import objmanifest as om
from objmanifest.cas.policy import Codec
from objmanifest.core.commit_events import Change
from objmanifest.core.model import Entry, JournalRecord
from objmanifest.core.states import TABLE, VERBS, Event, State, Verb
from objmanifest.engine.manifest import Manifest
from objmanifest.errors import NotFound
from tests.support.internals import engine

# -- the operation log ----------------------------------------------------------------------

OK, UNKNOWN, REFUSED = "ok", "unknown", "refused"
OUTCOMES = (OK, UNKNOWN, REFUSED)

DECLARE = "declare"
CLAIM = "claim"  # one entry claimed: by claim(file_id), claim(stage=) or claim_many
CLAIM_MANY = "claim_many"  # only with an unknown outcome: which entries it took is unknown
RENEW = "renew"
PUT = "put"  # the entry made ready with ``checksum`` (entry.checksum as put() returned it)
FAIL = "fail"
RELEASE = "release"
CONSUME = "consume"  # ``checksum``: xxh3-128 of the bytes the consumer got
REAP = "reap"  # one entry the reaper released (``epoch``: the lease it ended)
ARCHIVE = "archive"  # one entry archive() reported moved
GC = "gc"
KINDS = (DECLARE, CLAIM, CLAIM_MANY, RENEW, PUT, FAIL, RELEASE, CONSUME, REAP, ARCHIVE, GC)


@dataclass(frozen=True)
class Op:
    """One operation of one agent, as the agent saw it.

    ``at`` is the agent's own notion of time (simulated seconds, or its wall clock): only
    for reading a log, never compared with the store's clock.
    """

    agent: str
    kind: str
    outcome: str = OK
    file_id: str | None = None
    stage: str | None = None
    epoch: int | None = None
    checksum: str | None = None
    at: float = 0.0
    detail: str = ""
    seq: int = 0
    role: str | None = None
    """A consumer's role, when it consumes an entry with named consumers: any agent of the
    role may have made the mark (a second one is told it consumed, and nothing is written)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown op kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}: use one of {OUTCOMES}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> Op:
        return Op(**json.loads(line))


class OpLog:
    """An append-only log of operations, safe to share between threads; JSON lines."""

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self._ops: list[Op] = list(ops)
        self._lock = threading.Lock()

    def append(self, op: Op) -> Op:
        with self._lock:
            numbered = replace(op, seq=len(self._ops))
            self._ops.append(numbered)
        return numbered

    def record(self, agent: str, kind: str, outcome: str = OK, **fields: Any) -> Op:
        """Append one operation (``fields``: file_id, stage, epoch, checksum, at, detail)."""
        return self.append(Op(agent, kind, outcome, **fields))

    def __iter__(self) -> Iterator[Op]:
        with self._lock:
            return iter(list(self._ops))

    def __len__(self) -> int:
        return len(self._ops)

    def lines(self) -> list[str]:
        return [op.to_json() for op in self]

    def write(self, out: IO[str]) -> None:
        for line in self.lines():
            out.write(line + "\n")

    def save(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as out:
            self.write(out)

    @staticmethod
    def from_lines(lines: Iterable[str]) -> OpLog:
        return OpLog(Op.from_json(line) for line in lines if line.strip())

    @staticmethod
    def load(*paths: str | Path) -> OpLog:
        """The logs of several processes, merged (each keeps its order)."""
        ops: list[Op] = []
        for path in paths:
            with open(path, encoding="utf-8") as f:
                ops += OpLog.from_lines(f)
        return OpLog(ops)


# -- violations -------------------------------------------------------------------------------

READY_TWICE = "ready-twice"
FENCED_CHANGE = "fenced-change"
UNASKED_CHANGE = "unasked-change"
LEASE_STOLEN = "lease-stolen"
ACK_MISSING = "ack-missing"
BAD_BYTES = "bad-bytes"
NOT_SETTLED = "not-settled"
JOURNAL_GAP = "journal-gap"
LIFECYCLE = "lifecycle"
INVARIANTS = (
    READY_TWICE,
    FENCED_CHANGE,
    UNASKED_CHANGE,
    LEASE_STOLEN,
    ACK_MISSING,
    BAD_BYTES,
    NOT_SETTLED,
    JOURNAL_GAP,
    LIFECYCLE,
)


@dataclass(frozen=True)
class Violation:
    invariant: str
    message: str
    file_id: str | None = None

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


# -- the journal, replayed ------------------------------------------------------------------

HOLDER_COMMANDS = frozenset({"renew", "finish", "finish_many", "fail", "release"})
CLAIM_COMMANDS = frozenset({"claim", "claim_many"})
EVENTS: dict[str, Event | Verb] = {
    "renew": Event.renew,
    "finish": Event.finish,
    "finish_many": Event.finish,
    "fail": Event.fail,
    "reap": Event.expire,
    "consume": Event.consume,
    "mismatch": Event.mismatch,
    "release": Verb.release,
    "revive": Verb.revive,
}
REMOVED = "removed"
TERMINAL = frozenset({State.consumed.value, State.dead.value})


@dataclass(frozen=True)
class Step:
    """One change of one entry, with the record that made it."""

    record: JournalRecord
    change: Change

    @property
    def command(self) -> str:
        return self.record.command


@dataclass
class _Holder:
    """What the journal says about an entry's current claim, replayed in version order."""

    epoch: int = 0
    owner: str | None = None
    lease_from: datetime | None = None
    readied: dict[int, int] = field(default_factory=dict)


def _allowed(step: Step) -> bool:
    """Is this recorded transition one the lifecycle table allows?"""
    before, after, command = step.change.before, step.change.after, step.command
    if before is None:
        return command != "declare" or after == State.pending.value
    if after == REMOVED:
        return command != "archive" or before in TERMINAL
    if command in CLAIM_COMMANDS:
        event: Event | Verb = Event.takeover if before == State.writing.value else Event.claim
    elif command in EVENTS:
        event = EVENTS[command]
    else:
        return True  # repair, migrate, drop-data ...: not an event of the table
    state = State(before)
    targets = TABLE.get((state, event)) if isinstance(event, Event) else VERBS.get((state, event))
    return targets is not None and State(after) in targets


@dataclass
class Journal:
    """Every shard's steps, per entry, in version order; and every gap found."""

    steps: dict[str, list[Step]] = field(default_factory=dict)
    gaps: list[Violation] = field(default_factory=list)

    def of(self, file_id: str) -> list[Step]:
        return self.steps.get(file_id, [])


def read_journal(task: Manifest) -> Journal:
    """The journal of every shard and of the index, checked for gaps on the way."""
    journal = Journal()
    objects: list[tuple[str, Codec[Any]]] = [
        (task.layout.shard(s), task.codec(s)) for s in task.layout.all_shards(task.stages)
    ]
    objects.append((task.layout.index, task.index_codec))
    for key, codec in objects:
        try:
            doc = task.docs.read(key, codec)
        except NotFound:
            continue
        newest = codec.version(doc) or 0
        records = task.journal.records(key, codec)
        versions = [r.version for r in records]
        if versions != list(range(1, newest + 1)):
            missing = sorted(set(range(1, newest + 1)) - set(versions))
            twice = sorted({v for v in versions if versions.count(v) > 1})
            journal.gaps.append(
                Violation(
                    JOURNAL_GAP,
                    f"{key} is at version {newest} but its journal has {len(versions)} "
                    f"records (missing {missing[:10]}, twice {twice[:10]})",
                )
            )
        if key == task.layout.index:
            continue
        for record in records:
            for change in record.transitions:
                journal.steps.setdefault(change.item, []).append(Step(record, change))
    return journal


# -- the checks -----------------------------------------------------------------------------


def _replay(task: Manifest, journal: Journal) -> list[Violation]:
    """Fencing, leases, the lifecycle and ready-once, from each entry's steps in order."""
    out: list[Violation] = []
    lease = timedelta(seconds=task.header.lease_seconds)
    for fid, steps in journal.steps.items():
        held = _Holder()
        for step in steps:
            c, at, actor = step.change, step.record.at, step.record.actor
            where = f"{fid!r} at version {step.record.version} ({step.command} by {actor!r})"
            if not _allowed(step):
                out.append(Violation(LIFECYCLE, f"{where}: {c.before} -> {c.after}", fid))
            took = step.command in CLAIM_COMMANDS and c.before != State.writing.value
            stole = step.command in CLAIM_COMMANDS and c.before == State.writing.value
            ended = (stole or step.command == "reap") and c.before == State.writing.value
            if ended and held.lease_from is not None and at < held.lease_from + lease:
                out.append(
                    Violation(
                        LEASE_STOLEN,
                        f"{where}: the lease of {held.owner!r} (epoch {held.epoch}) "
                        f"renewed at {held.lease_from.isoformat()} ran until "
                        f"{(held.lease_from + lease).isoformat()} at least",
                        fid,
                    )
                )
            if (took or stole) and c.after == State.writing.value:
                if c.epoch is not None and c.epoch != held.epoch + 1:
                    out.append(
                        Violation(
                            FENCED_CHANGE,
                            f"{where}: claimed at epoch {c.epoch} after epoch {held.epoch}",
                            fid,
                        )
                    )
                held = _Holder(c.epoch or held.epoch + 1, actor, at, held.readied)
                continue
            if step.command in HOLDER_COMMANDS:
                if actor != held.owner or c.epoch != held.epoch or c.before != "writing":
                    out.append(
                        Violation(
                            FENCED_CHANGE,
                            f"{where}: a holder change for epoch {c.epoch}, but the entry "
                            f"was {c.before} at epoch {held.epoch} held by {held.owner!r}",
                            fid,
                        )
                    )
                if step.command == "renew":
                    held.lease_from = at
            if c.after == State.ready.value and c.before != State.ready.value:
                epoch = c.epoch or 0
                held.readied[epoch] = held.readied.get(epoch, 0) + 1
                if held.readied[epoch] > 1:
                    out.append(
                        Violation(READY_TWICE, f"{where}: ready again at epoch {epoch}", fid)
                    )
                chunked = c.parts_key is not None
                if c.key is not None and not _of_epoch(task, c.key, fid, epoch, chunked):
                    out.append(
                        Violation(
                            FENCED_CHANGE, f"{where}: ready at epoch {epoch} with {c.key}", fid
                        )
                    )
            if c.after != State.writing.value:
                held.owner, held.lease_from = None, None
    return out


def _of_epoch(task: Manifest, key: str, file_id: str, epoch: int, chunked: bool = False) -> bool:
    """Is ``key`` the data key of this epoch's holder (or one beside it)? A chunked entry
    may also point at the upload of an earlier holder it adopted (its parts verified
    against the adopter's own bytes, ``uploads/engine.py``): the key of an earlier epoch."""
    stage = task.stage_of(file_id)
    for e in range(1, epoch + 1) if chunked else (epoch,):
        base = task.layout.data(stage, file_id, e)
        if key == base or key.startswith(base + "~"):
            return True
    return False


def _made(s: Step, op: Op) -> bool:
    """Is ``s`` the commit ``op`` says it made?"""
    c, mine = s.change, s.record.actor == op.agent
    epoch = op.epoch is None or c.epoch == op.epoch
    readied = c.before == State.writing.value and c.after == State.ready.value
    made = {
        DECLARE: c.before is None,
        CLAIM: mine and epoch and s.command in CLAIM_COMMANDS and c.after == "writing",
        RENEW: mine and epoch and s.command == "renew",
        PUT: epoch and readied and (op.checksum is None or op.checksum == c.checksum),
        FAIL: mine and epoch and s.command == "fail",
        RELEASE: mine and epoch and s.command == "release",
        CONSUME: s.command == "consume" and (mine or op.role in (c.consumed_by or ())),
        REAP: epoch and s.command == "reap",
        ARCHIVE: s.command == "archive" and c.after == REMOVED,
    }
    return made.get(op.kind, True)


def _landed(steps: list[Step], op: Op) -> bool:
    """Is the commit ``op`` says it made in ``steps``?"""
    return any(_made(s, op) for s in steps)


def _acknowledged(journal: Journal, oplog: OpLog) -> list[Violation]:
    out: list[Violation] = []
    for op in oplog:
        if op.outcome != OK or op.file_id is None or op.kind == GC:
            continue
        if not _landed(journal.of(op.file_id), op):
            out.append(
                Violation(
                    ACK_MISSING,
                    f"{op.agent!r} was told its {op.kind} of {op.file_id!r} (epoch {op.epoch}, "
                    f"op {op.seq}) succeeded, but the journal has no such commit",
                    op.file_id,
                )
            )
    return out


def _asked(task: Manifest, journal: Journal, oplog: OpLog) -> list[Violation]:
    """Every claim, fail and release in the journal was asked for by its agent, and not
    answered with a refusal (which promises nothing was written)."""
    exact: set[tuple[str, str, str, int]] = set()
    loose: set[tuple[str, str, str]] = set()  # ops of unknown outcome that knew no epoch
    blind: set[tuple[str, str]] = set()  # (agent, stage): a claim_many of unknown outcome
    for op in oplog:
        if op.outcome == REFUSED:
            continue
        if op.kind == CLAIM_MANY:
            blind.add((op.agent, op.stage or ""))
        elif op.file_id is not None and op.epoch is not None:
            exact.add((op.agent, op.kind, op.file_id, op.epoch))
        elif op.file_id is not None:
            loose.add((op.agent, op.kind, op.file_id))
    out: list[Violation] = []
    for fid, steps in journal.steps.items():
        for s in steps:
            c, actor = s.change, s.record.actor
            if s.command in CLAIM_COMMANDS and c.after == State.writing.value:
                kind = CLAIM
            elif s.command in ("fail", "release"):
                kind = s.command
            else:
                continue
            if (actor, kind, fid, c.epoch) in exact or (actor, kind, fid) in loose:
                continue
            if kind == CLAIM and (actor, task.stage_of(fid)) in blind:
                continue
            out.append(
                Violation(
                    UNASKED_CHANGE,
                    f"{fid!r}: a {s.command} by {actor!r} at epoch {c.epoch} landed (version "
                    f"{s.record.version} of {s.record.object_key}) though {actor!r} logged "
                    "no such operation, or was told it was refused",
                    fid,
                )
            )
    return out


def _bytes(journal: Journal, oplog: OpLog) -> list[Violation]:
    out: list[Violation] = []
    for op in oplog:
        if op.kind != CONSUME or op.outcome != OK or op.file_id is None or op.checksum is None:
            continue
        made: set[str] = set()
        for s in journal.of(op.file_id):
            if s.change.after == State.ready.value and s.change.before == State.writing.value:
                made |= {d for d in (s.change.checksum, s.change.whole_checksum) if d}
        if op.checksum not in made:
            out.append(
                Violation(
                    BAD_BYTES,
                    f"{op.agent!r} consumed {op.file_id!r} (op {op.seq}) and got bytes of "
                    f"{op.checksum}, which it was never made ready with ({sorted(map(str, made))})",
                    op.file_id,
                )
            )
    return out


def _settled(task: Manifest, live_agents: frozenset[str], settled: bool) -> list[Violation]:
    """At the end: every entry terminal, or held under an unexpired lease by a live agent.
    An entry blocked for good behind a dead dependency (pending or failed, never claimable
    again: ``status`` lists it as blocked) counts as terminal."""
    out: list[Violation] = []
    now = task.store.now()
    states: dict[str, State] = {}
    live: list[Entry] = []
    for shard in task.layout.all_shards(task.stages):
        doc = task.read_shard(shard)
        states.update({fid: ref.state for fid, ref in (doc.archived or {}).items()})
        states.update({fid: e.state for fid, e in doc.entries.items()})
        live += doc.entries.values()
    for e in live:
        if e.state.value in TERMINAL:
            continue
        leased = e.lease_expires_at is not None and e.lease_expires_at >= now
        if e.state is State.writing and leased and (e.owner in live_agents or not settled):
            continue
        if not settled and e.state is not State.writing:
            continue
        blocked = any(states.get(d) is State.dead for d in e.depends_on)
        if blocked and e.state in (State.pending, State.failed):
            continue
        out.append(
            Violation(
                NOT_SETTLED,
                f"{e.file_id!r} ended {e.state.value} (owner {e.owner!r}, lease until "
                f"{e.lease_expires_at.isoformat() if e.lease_expires_at else None}, store "
                f"time {now.isoformat()})",
                e.file_id,
            )
        )
    return out


def check(
    task: om.Task | Manifest,
    oplog: OpLog,
    *,
    live_agents: Iterable[str] = (),
    settled: bool = True,
) -> list[Violation]:
    """Every invariant of the module's table, on ``task`` as the store holds it now.

    ``settled``: the run drained (no faults, every agent done), so every entry must be
    consumed or dead, or writing under an unexpired lease of one of ``live_agents``;
    without it only leases that expired with nobody to take them over are reported.
    """
    if isinstance(task, om.Task):
        task = engine(task)
    journal = read_journal(task)
    return [
        *journal.gaps,
        *_replay(task, journal),
        *_acknowledged(journal, oplog),
        *_asked(task, journal, oplog),
        *_bytes(journal, oplog),
        *_settled(task, frozenset(live_agents), settled),
    ]


def summary(violations: Iterable[Violation]) -> dict[str, int]:
    """How many violations of each invariant (every invariant named, 0 for none)."""
    counts = dict.fromkeys(INVARIANTS, 0)
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts
