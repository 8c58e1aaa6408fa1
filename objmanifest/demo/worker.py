"""One demo agent in its own OS process: ``python -m objmanifest.demo.worker [SPEC_JSON]``.

The orchestrator starts several per stage. Each claims entries of its stage through the
manifest, reads its inputs as a named consumer, writes its output and makes the entry
ready, until the stage is finished. It reports what it does as JSON lines on stdout (one
object per line with an ``event``), ending with ``done`` and its commit statistics.

The designated victim claims one entry, starts on it and then waits, never renewing its
lease, until the orchestrator kills it with SIGKILL: a crash at the worst moment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import objmanifest as om
from objmanifest.core.leases import Renewer

from ..core.states import State
from . import plan as p

POLL_SECONDS = 0.25
PART_SIZE = 8 * p.MiB
"""Part size of chunked uploads, and the size above which an upload is chunked."""
PROGRESS_EVERY = 0.2
"""Seconds between progress events of one transfer."""
DONE_STATES = (State.ready, State.consumed, State.dead)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs, passed as one JSON argument."""

    name: str
    role: str
    stage: str
    url: str
    """The store's URL."""
    task_id: str
    files: int
    big_mib: int
    endpoint_url: str | None = None
    work_seconds: float = 0.2
    deadline_seconds: float = 600.0
    parent_pid: int = 0
    victim_of: str | None = None
    """Claim this entry, start on it, then wait to be killed."""
    wait_for_claim_of: str | None = None
    """Claim nothing before this entry has been claimed once (so the victim gets it)."""
    work_dir: str = ""
    """Directory for temporary files (the orchestrator removes it at the end)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))


def emit(event: str, **fields: Any) -> None:
    """One JSON line for the orchestrator."""
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


class Throttled:
    """A progress callback that reports a transfer at most every PROGRESS_EVERY seconds."""

    def __init__(self, file_id: str, direction: str) -> None:
        self.file_id = file_id
        self.direction = direction
        self.last = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY or done == total:
            self.last = now
            emit("progress", file_id=self.file_id, direction=self.direction, done=done, total=total)


class Worker:
    """The loop of one agent: claim, read inputs, produce, put; until the stage is done."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.plan = p.Plan(spec.files, spec.big_mib)
        store = om.connect(spec.url, endpoint_url=spec.endpoint_url)
        self.task = om.Task.open(store, spec.task_id)
        self.agent = self.task.agent(spec.name, spec.role)
        self.deadline = time.monotonic() + spec.deadline_seconds
        # Inside the orchestrator's temporary directory, so it goes even if we are killed.
        base = spec.work_dir or None
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=base))
        self.produced = 0
        self.bytes_up = 0
        self.bytes_down = 0

    # -- the loops -------------------------------------------------------------------

    def run(self) -> int:
        emit("start", pid=os.getpid(), stage=self.spec.stage)
        try:
            if self.spec.victim_of:
                self.die_holding(self.spec.victim_of)
            if self.spec.wait_for_claim_of:
                self.wait_claimed(self.spec.wait_for_claim_of)
            self.work()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        emit(
            "done",
            produced=self.produced,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            stats=self.stats(),
        )
        return 0

    def work(self) -> None:
        while True:
            self.check_alive()
            try:
                claim = self.agent.claim(stage=self.spec.stage)
            except om.ObjManifestError as e:
                emit("error", error=type(e).__name__, message=str(e))
                self.pause()
                continue
            if claim is not None:
                self.handle(claim)
            elif self.stage_done():
                return
            else:
                self.pause()

    def die_holding(self, file_id: str) -> NoReturn:
        """Claim ``file_id``, read its inputs, then wait, renewing nothing, to be killed."""
        while True:
            self.check_alive()
            try:
                claim = self.agent.claim(file_id)
            except om.NotClaimable:
                self.pause(0.1)
                continue
            if claim is not None:
                break
        emit("claimed", file_id=file_id, epoch=claim.epoch, takeover=False, victim=True)
        for dep in self.plan.depends_on(file_id):
            self.bytes_down += len(self.agent.consume(dep))
        emit(
            "working",
            file_id=file_id,
            epoch=claim.epoch,
            stats=self.stats(),
            bytes_down=self.bytes_down,
        )
        while True:
            self.check_alive()
            time.sleep(0.1)

    def wait_claimed(self, file_id: str) -> None:
        while True:
            self.check_alive()
            entry = self.task.shard(self.spec.stage).entries.get(file_id)
            if entry is not None and entry.epoch >= 1:
                return
            self.pause()

    # -- one entry -------------------------------------------------------------------

    def handle(self, claim: om.Claim) -> None:
        entry = self.task.shard(claim.stage).entries[claim.file_id]
        takeover = entry.retry_count > 0 and "expired" in (entry.error or "")
        emit(
            "claimed",
            file_id=claim.file_id,
            epoch=claim.epoch,
            takeover=takeover,
            retry_count=entry.retry_count,
            previous=entry.error if takeover else None,
        )
        out = self.tmp / "output"
        try:
            renew_every = self.task.lease_seconds / 3
            with Renewer(lambda: self.agent.renew(claim), renew_every, claim.file_id) as renewer:
                self.prepare(claim, out)
            if renewer.lost is not None:
                raise renewer.lost
            self.put(claim, out)
        except om.LeaseLost as e:
            emit("lease_lost", file_id=claim.file_id, epoch=claim.epoch, message=str(e))
        except om.ObjManifestError as e:
            emit("error", file_id=claim.file_id, error=type(e).__name__, message=str(e))
            self.give_up(claim, e)
        finally:
            out.unlink(missing_ok=True)

    def give_up(self, claim: om.Claim, error: Exception) -> None:
        try:
            self.agent.fail(claim, f"{type(error).__name__}: {error}")
        except om.ObjManifestError as e:
            emit("error", file_id=claim.file_id, error=type(e).__name__, message=str(e))

    def put(self, claim: om.Claim, path: Path) -> None:
        size = path.stat().st_size
        emit("uploading", file_id=claim.file_id, total=size)
        start = time.monotonic()
        entry = self.agent.put(
            claim,
            path,
            part_size=PART_SIZE,
            threshold=PART_SIZE,
            progress=Throttled(claim.file_id, "up"),
        )
        self.produced += 1
        self.bytes_up += size
        emit(
            "put",
            file_id=claim.file_id,
            epoch=claim.epoch,
            size=size,
            seconds=round(time.monotonic() - start, 3),
            checksum=entry.checksum,
            chunked=entry.is_chunked,
        )

    def prepare(self, claim: om.Claim, out: Path) -> None:
        """Make the claim's output in ``out``: the stage's real work."""
        fid = claim.file_id
        if self.spec.stage == "collect":
            out.write_bytes(p.part_bytes(fid))
        elif self.spec.stage == "write":
            inputs = {dep: self.read(dep) for dep in self.plan.depends_on(fid)}
            if fid == p.ARCHIVE:
                body = p.archive_body_size(self.spec.big_mib * p.MiB)
                p.write_archive(out, self.agent.name, claim.epoch, inputs, body)
            else:
                p.write_batch(out, fid, self.agent.name, claim.epoch, inputs)
        else:
            self.check(claim, out)
        self.simulate_work()

    def check(self, claim: om.Claim, out: Path) -> None:
        """Read the output this verdict is about and verify it from scratch."""
        checked = p.checked_by(claim.file_id)
        local = self.tmp / "input"
        try:
            self.agent.consume(checked, local, progress=Throttled(checked, "down"))
            self.bytes_down += local.stat().st_size
            read = p.inspect_file(local)
        finally:
            local.unlink(missing_ok=True)
        entry = self.task.entry(checked)
        big = p.archive_body_size(self.spec.big_mib * p.MiB) if checked == p.ARCHIVE else None
        problems = p.check_output(checked, entry.depends_on, read, (entry.owner, entry.epoch), big)
        p.write_verdict(
            out, claim.file_id, self.agent.name, claim.epoch, checked, read, problems, entry.epoch
        )

    def read(self, file_id: str) -> bytes:
        data = self.agent.consume(file_id)
        self.bytes_down += len(data)
        return data

    # -- helpers ---------------------------------------------------------------------

    def simulate_work(self) -> None:
        """Stand-in for real processing time, so the stages visibly overlap."""
        if self.spec.work_seconds > 0:
            time.sleep(self.spec.work_seconds * random.uniform(0.5, 1.5))

    def stage_done(self) -> bool:
        entries = self.task.shard(self.spec.stage).entries.values()
        return all(e.state in DONE_STATES for e in entries)

    def pause(self, seconds: float = POLL_SECONDS) -> None:
        time.sleep(seconds * random.uniform(0.7, 1.3))

    def check_alive(self) -> None:
        """Stop when the demo is over: past the deadline, or the orchestrator is gone."""
        if self.spec.parent_pid and os.getppid() != self.spec.parent_pid:
            emit("error", error="Orphaned", message="the orchestrator is gone; stopping")
            sys.exit(4)
        if time.monotonic() > self.deadline:
            emit(
                "error",
                error="Timeout",
                message=f"still working after {self.spec.deadline_seconds:.0f}s; stopping",
            )
            sys.exit(3)

    def stats(self) -> dict[str, int]:
        return self.task.request_counts()


def main(argv: list[str] | None = None) -> int:
    """Run one worker: its spec is the argument, or the first line of stdin.

    The demo starts workers before its server is ready and sends the spec when it is;
    end of input without a spec means the demo stopped first.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print(
            "usage: python -m objmanifest.demo.worker [SPEC_JSON] (started by the demo)",
            file=sys.stderr,
        )
        return 2
    text = args[0] if args else sys.stdin.readline()
    if not text.strip():
        return 0
    try:
        return Worker(WorkerSpec.from_json(text)).run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
