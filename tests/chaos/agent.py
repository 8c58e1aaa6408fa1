"""One agent of the chaos pipeline, in its own process (started by ``tests/chaos/harness.py``).

Run as ``python -m tests.chaos.agent --bucket B --prefix P --task T --name N --stage S
--oplog FILE --seed K`` with the ``AWS_*`` variables of the endpoint (the fault proxy) in
the environment. The agent works its stage until every entry of it is finished (or it is
killed): ``collect`` produces raw records, ``write`` consumes the raw records a draft
depends on and writes the draft (naming the digest of every input it read), ``check``
consumes a draft, checks it names its inputs, and writes a verdict.

Every operation the agent believes succeeded is appended to the operation log the moment
it returns (one JSON line, written with one ``write``, so a SIGKILL loses at most the line
of an operation whose answer it never saw); failures are logged too, with ``ok`` false, for
the figures. An exception that is not an ``om.ObjManifestError`` breaks the library's
contract and is logged as ``unexpected`` (the harness counts it as a violation).
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
from types import FrameType
from typing import Any

import objmanifest as om
from objmanifest import checksum

STAGES = ("collect", "write", "check")
ROLES = {"collect": "collector", "write": "writer", "check": "checker"}
"""The consumer role of each stage's agents: raw records are consumed by ``writer``, drafts
by ``checker`` (broadcast entries: every agent of the role may read them again)."""

FINISHED = frozenset({om.State.ready, om.State.consumed, om.State.dead})


def settled(entries: list[om.Entry]) -> bool:
    """Whether the pipeline is over: every entry finished, or waiting on a dead one."""
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


def payload(file_id: str, agent: str, epoch: int, **fields: Any) -> bytes:
    """The bytes a holder writes: who wrote them at which epoch, and what they say."""
    return json.dumps(
        {"file_id": file_id, "agent": agent, "epoch": epoch, **fields}, sort_keys=True
    ).encode()


class ContentError(Exception):
    """Verified bytes that are not what their entry should hold (logged as ``unexpected``)."""


class OpLog:
    """The operation log of one agent process: JSON lines, each written whole at once."""

    def __init__(self, path: str, agent: str) -> None:
        self.agent = agent
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, op: str, ok: bool = True, **fields: Any) -> None:
        line = {"op": op, "ok": ok, "agent": self.agent, "pid": os.getpid(), **fields}
        os.write(self._fd, (json.dumps(line, default=str) + "\n").encode())


class Worker:
    """The loop of one agent: claim, do the stage's work, finish; log every outcome."""

    def __init__(self, task: om.Task, name: str, stage: str, log: OpLog, seed: int) -> None:
        self.task = task
        self.stage = stage
        self.agent = task.agent(name, role=ROLES[stage])
        self.log = log
        self.rng = random.Random(f"{seed}:{name}:{os.getpid()}")

    def claim_entry(self, claim: om.Claim) -> None:
        self.log.record(
            "claim",
            file_id=claim.file_id,
            stage=claim.stage,
            epoch=claim.epoch,
            lease_expires_at=claim.lease_expires_at.isoformat(),
        )

    def put_entry(self, claim: om.Claim, entry: om.Entry, data: bytes) -> None:
        self.log.record(
            "put",
            file_id=claim.file_id,
            stage=claim.stage,
            epoch=claim.epoch,
            checksum=entry.checksum,
            data_checksum=checksum.of_bytes(data),
            size=len(data),
            key=entry.key,
            state=entry.state.value,
        )

    def error(self, op: str, claim: om.Claim | None, e: BaseException) -> None:
        kind = "error" if isinstance(e, om.ObjManifestError) else "unexpected"
        self.log.record(
            op,
            ok=False,
            outcome=kind,
            error=type(e).__name__,
            message=str(e)[:500],
            file_id=claim.file_id if claim else None,
            epoch=claim.epoch if claim else None,
            trace=traceback.format_exc()[-2000:] if kind == "unexpected" else None,
        )

    def attempt(self, op: str, claim: om.Claim | None, call: Callable[[], Any]) -> Any:
        """``call()``, or None after logging its exception."""
        try:
            return call()
        except Exception as e:
            self.error(op, claim, e)
            return None

    def pipeline_done(self) -> bool:
        """Every stage settled (not just this agent's: an input found damaged later is
        produced again by its stage's agents)."""
        entries = self.attempt("status", None, lambda: self.task.entries())
        return entries is not None and settled(entries)

    def run(self, max_seconds: float) -> None:
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.0, 0.2))
            batch = self.stage == "collect" and self.rng.random() < 0.3
            if batch:
                claims = self.attempt(
                    "claim_many", None, lambda: self.agent.claim_many(self.stage, limit=3)
                )
                claims = claims or []
            else:
                one = self.attempt("claim", None, lambda: self.agent.claim(stage=self.stage))
                claims = [one] if one is not None else []
            if not claims:
                if self.pipeline_done():
                    return
                time.sleep(self.rng.uniform(0.2, 0.6))
                continue
            for claim in claims:
                self.claim_entry(claim)
            if batch:
                self.produce_many(claims)
            else:
                self.work(claims[0])

    def produce_many(self, claims: list[om.Claim]) -> None:
        datas = [self.raw(c) for c in claims]
        results = self.attempt("put_many", None, lambda: self.agent.put_many(claims, datas))
        for claim, data, result in zip(claims, datas, results or [], strict=False):
            if isinstance(result, om.Entry):
                self.put_entry(claim, result, data)
            else:
                self.log.record(
                    "put",
                    ok=False,
                    outcome="error",
                    error=type(result).__name__,
                    message=str(result)[:500],
                    file_id=claim.file_id,
                    epoch=claim.epoch,
                )

    def raw(self, claim: om.Claim) -> bytes:
        size = self.rng.choice((64, 512, 4096, 32768))
        fill = self.rng.randbytes(size // 2).hex()
        return payload(claim.file_id, self.agent.name, claim.epoch, fill=fill)

    def work(self, claim: om.Claim) -> None:
        """Produce the claim's data; on a producer's failure of its own, ``fail`` it."""
        if self.rng.random() < 0.05:  # a producer that gives up now and then
            entry = self.attempt("fail", claim, lambda: self.agent.fail(claim, "chaos: gave up"))
            if entry is not None:
                self.log.record(
                    "fail",
                    file_id=claim.file_id,
                    epoch=claim.epoch,
                    state=entry.state.value,
                    retry_count=entry.retry_count,
                )
            return
        make = {"collect": self.raw, "write": self.draft, "check": self.verdict}[self.stage]
        data: bytes | None = self.attempt("work", claim, lambda: make(claim))
        if data is None:
            return
        renewed = self.attempt("renew", claim, lambda: self.agent.renew(claim))
        if renewed is None:
            return
        self.log.record(
            "renew",
            file_id=claim.file_id,
            epoch=renewed.epoch,
            lease_expires_at=renewed.lease_expires_at.isoformat(),
        )
        entry = self.attempt("put", claim, lambda: self.agent.put(claim, data))
        if entry is not None:
            self.put_entry(claim, entry, data)

    def read(self, claim: om.Claim, file_id: str) -> bytes | None:
        """Consume one input of the claim (its bytes, verified), or give the claim back."""
        data: bytes | None = self.attempt("consume", claim, lambda: self.agent.consume(file_id))
        if data is None:
            # An input found damaged is produced again: give the claim back, unspent.
            self.attempt("release", claim, lambda: self.agent.release(claim))
            return None
        self.log.record(
            "consume",
            file_id=file_id,
            role=self.agent.role,
            checksum=checksum.of_bytes(data),
            size=len(data),
            by_claim=claim.file_id,
        )
        return data

    def draft(self, claim: om.Claim) -> bytes | None:
        entry = self.task.entry(claim.file_id)
        inputs = {}
        for dep in entry.depends_on:
            data = self.read(claim, dep)
            if data is None:
                return None
            record = json.loads(data)
            if record["file_id"] != dep:
                raise ContentError(f"{dep!r} holds the record of {record['file_id']!r}")
            inputs[dep] = checksum.of_bytes(data)
        return payload(claim.file_id, self.agent.name, claim.epoch, inputs=inputs)

    def verdict(self, claim: om.Claim) -> bytes | None:
        entry = self.task.entry(claim.file_id)
        (draft_id,) = entry.depends_on
        data = self.read(claim, draft_id)
        if data is None:
            return None
        record = json.loads(data)
        draft = self.task.entry(draft_id)
        ok = record["file_id"] == draft_id and sorted(record["inputs"]) == sorted(draft.depends_on)
        return payload(
            claim.file_id, self.agent.name, claim.epoch, draft=checksum.of_bytes(data), ok=ok
        )


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
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    log = OpLog(args.oplog, args.name)
    log.record("start", time=time.time(), stage=args.stage)
    store = om.connect(f"s3://{args.bucket}/{args.prefix}")
    task = None
    while task is None:  # the proxy may fail this too
        try:
            task = om.Task.open(store, args.task)
        except om.ObjManifestError as e:
            log.record("open", ok=False, outcome="error", error=type(e).__name__)
            time.sleep(0.2)
    worker = Worker(task, args.name, args.stage, log, args.seed)
    worker.run(args.max_seconds)
    log.record("exit", time=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
