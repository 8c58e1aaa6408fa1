"""One agent of the chaos pipeline, in its own process (started by ``tests/chaos/harness.py``).

Run as ``python -m tests.chaos.agent --bucket B --prefix P --task T --name N --stage S
--oplog FILE --seed K`` with the ``AWS_*`` variables of the endpoint (the fault proxy) in
the environment. The agent works its stage until every entry of it is finished (or it is
killed): ``collect`` produces raw records, ``write`` consumes the raw records a draft
depends on and writes the draft (naming the digest of every input it read), ``check``
consumes a draft, checks it names its inputs, and writes a verdict.

Every operation is appended to the operation log (``OpLog``: one JSON line per write, so a
SIGKILL cuts no line but the last) as an intent before it is called and its outcome after;
the harness turns them into the checker's operations (``tests/chaos/judge.py``). An
exception that is not an ``om.ObjManifestError`` breaks the library's contract and is
logged as ``unexpected`` (the harness counts it as a violation).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import objmanifest as om
from objmanifest.core import checksum, leases
from tests.support import sim

STAGES = ("collect", "write", "check")


def local_clock(patch: sim.Setattr) -> None:
    """A lease judged on this process's own wall clock (skewed under libfaketime)."""
    expired = leases.expired
    patch(leases, "expired", lambda entry, now: expired(entry, datetime.now(timezone.utc)))


BROKEN: dict[str, Callable[[sim.Setattr], None]] = {
    "no-fencing": sim.no_fencing,
    "local-clock": local_clock,
    "no-read-back": sim.no_read_back,
    "no-checksum": sim.no_checksum,
}
"""Deliberately broken variants of the library an agent can run (``--broken``), the
simulator's (``tests/support/sim.py``) with the local clock a real one: a run must find them."""
ROLES = {"collect": "collector", "write": "writer", "check": "checker"}
"""The consumer role of each stage's agents: raw records are consumed by ``writer``, drafts
by ``checker`` (broadcast entries: every agent of the role may read them again)."""
PUBLISHER = "publisher"
"""The role that consumes verdicts, the pipeline's output: the check stage's agents, when
they have nothing to claim."""

FINISHED = frozenset({om.State.consumed, om.State.dead})


def settled(entries: list[om.Entry]) -> bool:
    """Whether the pipeline is over: every entry consumed or dead, or waiting on a dead one."""
    state = {e.file_id: e.state for e in entries}
    blocked: set[str] = {f for f, s in state.items() if s is om.State.dead}
    changed = True
    while changed:
        changed = False
        for e in entries:
            if e.file_id not in blocked and blocked.intersection(e.depends_on):
                blocked.add(e.file_id)
                changed = True
    return all(s in FINISHED or f in blocked for f, s in state.items())


BIG_EVERY = 12
"""Every twelfth raw record is big: a chunked entry (the task's threshold is ``BIG_SIZE``
- 1 MiB), the same bytes whoever produces it, so that the next holder adopts the parts a
killed one left."""
MiB = 1 << 20
BIG_SIZE = 6 * MiB


TRANSFER = om.TransferConfig(threshold=BIG_SIZE - MiB, part_size=5 * MiB, concurrency=2)
"""The pipeline's transfer settings (per ``Task`` object: every agent opens the task with
them): a big record goes up in two parts."""


def is_big(file_id: str) -> bool:
    return (
        file_id.startswith("raw/") and int(file_id.rsplit("/", 1)[1]) % BIG_EVERY == BIG_EVERY - 1
    )


def big_payload(file_id: str) -> bytes:
    """The bytes of a big raw record: a function of its file id only."""
    return random.Random(f"big:{file_id}").randbytes(BIG_SIZE)


def payload(file_id: str, agent: str, epoch: int, **fields: Any) -> bytes:
    """The bytes a holder writes: who wrote them at which epoch, and what they say."""
    return json.dumps(
        {"file_id": file_id, "agent": agent, "epoch": epoch, **fields}, sort_keys=True
    ).encode()


class ContentError(Exception):
    """Verified bytes that are not what their entry should hold (logged as ``unexpected``)."""


REFUSALS = (om.LeaseLost, om.NotClaimable)
"""Errors that promise nothing was written (``refused`` in the checker's terms)."""


class OpLog:
    """The operation log of one agent process: JSON lines, each written whole at once.

    Every operation is logged twice: its ``intent`` before it is called (what it will try,
    numbered), and its outcome after (``ok`` with what it returned, ``refused``, ``error``
    or ``unexpected``), naming the intent. An intent with no outcome is an operation the
    process was killed in, whose outcome it never learnt (the checker's ``unknown``).
    """

    def __init__(self, path: str, agent: str) -> None:
        self.agent = agent
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._n = 0

    def _write(self, line: dict[str, Any]) -> None:
        line = {"agent": self.agent, "pid": os.getpid(), **line}
        os.write(self._fd, (json.dumps(line, default=str) + "\n").encode())

    def intent(self, op: str, **fields: Any) -> int:
        self._n += 1
        self._write({"op": op, "intent": self._n, **fields})
        return self._n

    def outcome(self, n: int, op: str, outcome: str, **fields: Any) -> None:
        self._write({"op": op, "of": n, "outcome": outcome, **fields})

    def note(self, op: str, **fields: Any) -> None:
        self._write({"op": op, "note": True, **fields})


def _claims(claims: list[om.Claim]) -> list[dict[str, Any]]:
    return [{"file_id": c.file_id, "epoch": c.epoch} for c in claims]


class Worker:
    """The loop of one agent: claim, do the stage's work, finish; log every outcome."""

    def __init__(
        self,
        task: om.Task,
        name: str,
        stage: str,
        log: OpLog,
        seed: int,
        scratch: Path,
        opener: Callable[[], om.Task] | None = None,
    ) -> None:
        self.task = task
        self.name = name
        self.scratch = scratch
        self.stage = stage
        self.log = log
        self.rng = random.Random(f"{seed}:{name}:{os.getpid()}")
        self.opener = opener
        """A shell agent's: every call a process of its own (a new store and ``Task``: no
        cached version, no journal block known to be stored), each holder call on the
        claim rebuilt from its file id and epoch (``Agent.resume``), as the CLI runs."""

    def opened(self) -> om.Task:
        """The task as this call sees it."""
        return self.opener() if self.opener is not None else self.task

    @property
    def agent(self) -> om.Agent:
        return self.opened().agent(self.name, role=ROLES[self.stage])

    def held(self, claim: om.Claim, call: Callable[[om.Agent, om.Claim], Any]) -> Any:
        """``call(agent, claim)`` by this agent's holder: a shell agent's claim rebuilt."""
        agent = self.agent
        if self.opener is not None:
            claim = agent.resume(claim.file_id, claim.epoch)
        return call(agent, claim)

    def attempt(
        self,
        op: str,
        call: Callable[[], Any],
        result: Callable[[Any], dict[str, Any]] = lambda _: {},
        **intent: Any,
    ) -> Any:
        """``call()`` logged as an intent and its outcome (``result`` says what to log of
        what it returned); None after an exception."""
        n = self.log.intent(op, **intent)
        try:
            value = call()
        except Exception as e:
            if isinstance(e, REFUSALS):
                outcome = "refused"
            elif isinstance(e, om.ObjManifestError):
                outcome = "error"
            else:
                outcome = "unexpected"
            self.log.outcome(
                n,
                op,
                outcome,
                error=type(e).__name__,
                message=str(e)[:500],
                trace=traceback.format_exc()[-3000:] if outcome == "unexpected" else None,
            )
            return None
        self.log.outcome(n, op, "ok", **result(value))
        return value

    def pipeline_done(self) -> bool:
        """Every stage settled (not just this agent's: an input found damaged later is
        produced again by its stage's agents)."""
        entries = self.attempt("status", lambda: self.opened().entries())
        return entries is not None and settled(entries)

    def run(self, max_seconds: float) -> None:
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.0, 0.2))
            batch = self.stage == "collect" and self.rng.random() < 0.3
            if batch:
                claims = self.attempt(
                    "claim",
                    lambda: self.agent.claim_many(self.stage, limit=3),
                    lambda cs: {"claims": _claims(cs)},
                    stage=self.stage,
                )
                claims = claims or []
            else:
                one = self.attempt(
                    "claim",
                    lambda: self.agent.claim(stage=self.stage),
                    lambda c: {"claims": _claims([c] if c else [])},
                    stage=self.stage,
                )
                claims = [one] if one is not None else []
            if not claims:
                if self.stage == "check" and self.publish():
                    continue
                if self.pipeline_done():
                    return
                time.sleep(self.rng.uniform(0.2, 0.6))
                continue
            if batch:
                self.produce_many(claims)
            else:
                self.work(claims[0])

    def publish(self) -> bool:
        """Consume one ready verdict as the publisher (False if there is none)."""
        entries = self.attempt("status", lambda: self.opened().entries("check"))
        ready = [e for e in entries or [] if e.state is om.State.ready]
        if not ready:
            return False
        self.consume(PUBLISHER, self.rng.choice(ready).file_id)
        return True

    def consume(self, role: str, file_id: str) -> bytes | None:
        """Consume ``file_id`` in ``role`` (its bytes, verified)."""
        data: bytes | None = self.attempt(
            "consume",
            lambda: self.opened().agent(self.name, role=role).consume(file_id),
            lambda d: {"checksum": checksum.of_bytes(d), "size": len(d)},
            file_id=file_id,
            role=role,
        )
        return data

    def produce_many(self, claims: list[om.Claim]) -> None:
        datas = [self.raw(c) for c in claims]
        sums = [checksum.of_bytes(d) if isinstance(d, bytes) else None for d in datas]

        def results(rs: list[om.Entry | Exception]) -> dict[str, Any]:
            return {
                "results": [
                    {"checksum": r.checksum, "key": r.key}
                    if isinstance(r, om.Entry)
                    else {"error": type(r).__name__, "refused": isinstance(r, REFUSALS)}
                    for r in rs
                ]
            }

        self.attempt(
            "put_many",
            lambda: self.held_many(claims, lambda a, cs: a.put_many(cs, datas)),
            results,
            claims=_claims(claims),
            data_checksums=sums,
        )

    def held_many(
        self, claims: list[om.Claim], call: Callable[[om.Agent, list[om.Claim]], Any]
    ) -> Any:
        agent = self.agent
        if self.opener is not None:
            claims = agent.resume_many([(c.file_id, c.epoch) for c in claims])
        return call(agent, claims)

    def holder(self, op: str, claim: om.Claim, call: Callable[[], Any]) -> Any:
        """A holder's operation on ``claim``, logged with its file id and epoch."""

        def what(value: Any) -> dict[str, Any]:
            if isinstance(value, om.Entry):
                return {"checksum": value.checksum, "state": value.state.value}
            return {}

        return self.attempt(op, call, what, file_id=claim.file_id, epoch=claim.epoch)

    def raw(self, claim: om.Claim) -> bytes | str:
        """A raw record's data: bytes, or for a big one the path of its file (streamed as
        parts, adopted by the next holder)."""
        if is_big(claim.file_id):
            path = self.scratch / (claim.file_id.replace("/", "_") + ".bin")
            if not path.exists():  # written whole, then renamed: a killed writer leaves none
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_bytes(big_payload(claim.file_id))
                partial.rename(path)
            return str(path)
        size = self.rng.choice((64, 512, 4096, 32768))
        fill = self.rng.randbytes(size // 2).hex()
        return payload(claim.file_id, self.name, claim.epoch, fill=fill)

    def work(self, claim: om.Claim) -> None:
        """Produce the claim's data; now and then, as a producer that gives up, ``fail``."""
        if self.rng.random() < 0.05:
            self.holder(
                "fail", claim, lambda: self.held(claim, lambda a, c: a.fail(c, "chaos: gave up"))
            )
            return
        make = {"collect": self.raw, "write": self.draft, "check": self.verdict}[self.stage]
        data: bytes | str | None = self.attempt("work", lambda: make(claim), file_id=claim.file_id)
        if data is None:
            return
        if self.holder("renew", claim, lambda: self.held(claim, lambda a, c: a.renew(c))) is None:
            return
        self.holder("put", claim, lambda: self.held(claim, lambda a, c: a.put(c, data)))

    def read(self, claim: om.Claim, file_id: str) -> bytes | None:
        """Consume one input of the claim (its bytes, verified), or give the claim back."""
        data = self.consume(ROLES[self.stage], file_id)
        if data is None:
            # An input found damaged is produced again: give the claim back, unspent.
            self.holder("release", claim, lambda: self.held(claim, lambda a, c: a.release(c)))
        return data

    def draft(self, claim: om.Claim) -> bytes | None:
        entry = self.opened().entry(claim.file_id)
        inputs = {}
        for dep in entry.depends_on:
            data = self.read(claim, dep)
            if data is None:
                return None
            if is_big(dep):
                if data != big_payload(dep):
                    raise ContentError(f"{dep!r} does not hold its bytes")
            elif json.loads(data)["file_id"] != dep:
                raise ContentError(f"{dep!r} holds the record of another entry")
            inputs[dep] = checksum.of_bytes(data)
        return payload(claim.file_id, self.name, claim.epoch, inputs=inputs)

    def verdict(self, claim: om.Claim) -> bytes | None:
        entry = self.opened().entry(claim.file_id)
        (draft_id,) = entry.depends_on
        data = self.read(claim, draft_id)
        if data is None:
            return None
        record = json.loads(data)
        draft = self.opened().entry(draft_id)
        ok = record["file_id"] == draft_id and sorted(record["inputs"]) == sorted(draft.depends_on)
        return payload(claim.file_id, self.name, claim.epoch, draft=checksum.of_bytes(data), ok=ok)


def _stop(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--stage", required=True, choices=STAGES)
    parser.add_argument("--oplog", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--scratch", required=True, help="where big records' files go")
    parser.add_argument("--broken", choices=sorted(BROKEN), help="plant a broken variant")
    parser.add_argument(
        "--shell", action="store_true", help="every call from a new Task, as CLI steps make it"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    if args.broken:
        BROKEN[args.broken](setattr)
    log = OpLog(args.oplog, args.name)
    log.note("start", time=time.time(), stage=args.stage)
    store = om.connect(f"s3://{args.bucket}/{args.prefix}")
    task = None
    while task is None:  # the proxy may fail this too
        try:
            task = om.Task.open(store, args.task, transfer=TRANSFER)
        except om.ObjManifestError as e:
            log.note("open", error=type(e).__name__)
            time.sleep(0.2)
    url = f"s3://{args.bucket}/{args.prefix}"

    def opener() -> om.Task:
        return om.Task.open(om.connect(url), args.task, transfer=TRANSFER)

    worker = Worker(
        task,
        args.name,
        args.stage,
        log,
        args.seed,
        Path(args.scratch),
        opener if args.shell else None,
    )
    worker.run(args.max_seconds)
    log.note("exit", time=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
