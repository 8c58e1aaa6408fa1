"""The demo's orchestrator: a server, a task, agent processes, a kill, then the audit.

It starts an embedded S3 server (or uses ``--endpoint-url``), creates a task with three
stages, starts several agent processes per stage plus one designated victim, kills the
victim with SIGKILL once the manifest shows it holding a claim, waits for the others to
finish everything (one of them takes the victim's entry over when its lease expires), then
reads everything back and checks that it is all consistent.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import objmanifest as om
from objmanifest.store import without_credentials

from ..core.states import State
from ..local.errors import SetupError, Stopped
from . import display as d
from . import plan as p
from . import verify as v
from .agents import VICTIM, Pool, Proc, Role, roster
from .summary import build_summary, print_summary
from .target import Settings, Target, child_env, cleanup, open_target
from .worker import WorkerSpec

POLL_SECONDS = 0.5
TICK_SECONDS = 0.1
KILL_GRACE_SECONDS = 1.5
"""How long the victim may hold its claim before it is killed if it never says it is busy."""
MAX_RETRIES = 3
EXIT_OK, EXIT_INCONSISTENT, EXIT_SETUP = 0, 1, 2


class Demo:
    """One run of the demo against one target."""

    def __init__(self, s: Settings, target: Target, pool: Pool, show: d.Display) -> None:
        self.s = s
        self.target = target
        self.show = show
        self.plan = p.Plan(s.files, s.big_mib)
        self.task_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.pool = pool
        self.start = time.monotonic()
        self.kill: v.Kill | None = None
        self.claim_seen_at: float | None = None
        self.takeovers: list[dict[str, Any]] = []
        self.transfer: d.Transfer | None = None
        self.counts: dict[str, dict[str, int]] = {}
        self.problems: list[str] = []
        self.timed_out = False

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def create_task(self) -> om.Task:
        try:
            task = om.Task.create(
                self.target.store,
                self.task_id,
                p.STAGES,
                lease_seconds=self.s.lease,
                max_retries=MAX_RETRIES,
            )
        except om.ObjManifestError as e:
            raise SetupError(str(e)) from None
        task.declare_many(self.plan.declarations())
        return task

    def spec(self, who: Role) -> WorkerSpec:
        store = self.target.store
        target = self.plan.victim_target
        return WorkerSpec(
            name=who.name,
            role=who.role,
            stage=who.stage,
            url=store.url,
            task_id=self.task_id,
            files=self.s.files,
            big_mib=self.s.big_mib,
            endpoint_url=self.target.endpoint_url,
            work_seconds=self.s.work_ms / 1000,
            deadline_seconds=self.s.timeout + 30,
            parent_pid=os.getpid(),
            victim_of=target if who.victim else None,
            wait_for_claim_of=target if who.stage == "write" and not who.victim else None,
            work_dir=str(self.pool.log_dir),
        )

    def start_agents(self) -> None:
        """Give every waiting process its work; the victim first, so it is sure to be the
        one holding its entry when it dies (the other writers wait until it has)."""
        for proc in self.pool.procs:
            self.pool.assign(proc, self.spec(proc.who))

    # -- watching ------------------------------------------------------------------------

    def watch(self, task: om.Task) -> None:
        """Follow events and the manifest until every agent has exited (or time is up)."""
        deadline = self.start + self.s.timeout
        last_poll = 0.0
        while True:
            self.drain()
            if time.monotonic() - last_poll >= POLL_SECONDS:
                last_poll = time.monotonic()
                self.poll(task)
            self.show.update(self.snapshot())
            if not self.pool.running():
                break
            if time.monotonic() > deadline:
                self.timed_out = True
                self.problems.append(f"the pipeline did not finish within {self.s.timeout:.0f}s")
                break
            time.sleep(TICK_SECONDS)
        self.pool.stop_all()
        self.drain()
        self.poll(task)
        self.show.update(self.snapshot())

    def poll(self, task: om.Task) -> None:
        try:
            shards = {stage: task.shard(stage) for stage in task.stages}
        except om.ObjManifestError as e:
            self.show.note(f"could not read the manifest: {e}")
            return
        self.counts = {
            stage: {s.value: sum(1 for e in sh.entries.values() if e.state is s) for s in State}
            for stage, sh in shards.items()
        }
        self.maybe_kill(shards["write"].entries.get(self.plan.victim_target))

    def maybe_kill(self, entry: om.Entry | None) -> None:
        """SIGKILL the victim once the manifest shows it holding its claim, mid-work."""
        victim = next((pr for pr in self.pool.procs if pr.name == VICTIM), None)
        if victim is None or victim.killed or victim.popen.poll() is not None or entry is None:
            return
        if entry.state is not State.writing or entry.owner != VICTIM:
            return
        now = time.monotonic()
        self.claim_seen_at = self.claim_seen_at or now
        if victim.status != "working" and now - self.claim_seen_at < KILL_GRACE_SECONDS:
            return
        victim.popen.send_signal(signal.SIGKILL)
        victim.killed, victim.status = True, "killed"
        self.kill = v.Kill(VICTIM, entry.file_id, entry.epoch, round(self.elapsed(), 2))
        self.show.note(
            f"SIGKILL {VICTIM} (pid {victim.popen.pid}) while it holds {entry.file_id} at "
            f"epoch {entry.epoch}; its lease ({self.s.lease:g}s) is left to expire"
        )

    def drain(self) -> None:
        procs = {pr.name: pr for pr in self.pool.procs}
        while True:
            try:
                name, event = self.pool.events.get_nowait()
            except queue.Empty:
                return
            self.on_event(procs[name], event)

    def on_event(self, pr: Proc, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        fid = str(ev.get("file_id", ""))
        if kind == "start":
            pr.status = "idle"
        elif kind == "claimed":
            pr.status, pr.current = "working", fid
            if ev.get("takeover"):
                self.on_takeover(pr, ev)
        elif kind == "working":
            pr.status, pr.current = "working", fid
            pr.stats = dict(ev.get("stats") or {})
            pr.bytes_down = int(ev.get("bytes_down") or 0)
        elif kind == "uploading":
            if ev.get("total", 0) >= 2 * p.MiB:
                self.transfer = d.Transfer(fid, 0, ev.get("total"), "uploading")
        elif kind == "progress":
            self.on_progress(ev)
        elif kind == "put":
            pr.produced += 1
            pr.status, pr.current = "idle", ""
            if self.transfer is not None and self.transfer.file_id == fid:
                size = int(ev.get("size") or 0)
                how = "chunked" if ev.get("chunked") else "single PUT"
                self.transfer = d.Transfer(fid, size, size, f"stored ({how})")
        elif kind in ("lease_lost", "error"):
            pr.errors.append(f"{ev.get('error', kind)}: {ev.get('message')}")
            self.show.note(f"{pr.name}: {kind} {fid} {ev.get('message', '')}"[:200])
        elif kind == "done":
            pr.status, pr.current = "done", ""
            pr.stats = dict(ev.get("stats") or {})
            pr.bytes_up = int(ev.get("bytes_up") or 0)
            pr.bytes_down = int(ev.get("bytes_down") or 0)

    def on_takeover(self, pr: Proc, ev: dict[str, Any]) -> None:
        record = {
            "file_id": ev.get("file_id"),
            "agent": pr.name,
            "epoch": ev.get("epoch"),
            "previous": ev.get("previous"),
            "at_seconds": round(self.elapsed(), 2),
        }
        self.takeovers.append(record)
        self.show.note(
            f"{pr.name} took over {record['file_id']} at epoch {record['epoch']} "
            f"({record['previous']})"
        )

    def on_progress(self, ev: dict[str, Any]) -> None:
        fid = str(ev.get("file_id"))
        total = ev.get("total")
        if total is None or int(total) >= 2 * p.MiB:
            how = "chunked upload" if ev.get("direction") == "up" else "download"
            self.transfer = d.Transfer(fid, int(ev.get("done") or 0), total, how)

    def snapshot(self) -> d.Snapshot:
        return d.Snapshot(
            self.elapsed(), self.counts, [pr.view() for pr in self.pool.procs], self.transfer
        )

    # -- judging -------------------------------------------------------------------------

    def agent_problems(self) -> list[str]:
        problems = []
        for pr in self.pool.procs:
            code = pr.popen.returncode
            if pr.name == VICTIM:
                if not pr.killed:
                    problems.append(f"{VICTIM} was never killed (exit code {code})")
                continue
            if code != 0:
                tail = self.pool.log_tail(pr)
                problems.append(
                    f"{pr.name} exited with code {code}"
                    + (f"; last lines of its log:\n{tail}" if tail else "")
                )
            problems += [f"{pr.name}: {e}" for e in pr.errors if "LeaseLost" in e]
        return problems


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception, so the cleanup code runs."""

    def handler(signum: int, frame: object) -> None:
        raise Stopped(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {sig: signal.signal(sig, handler) for sig in wanted}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(s: Settings, out: TextIO, err: TextIO) -> int:
    """Run the whole demo; the exit code says whether everything was consistent."""
    stream = err if s.json else out
    started = time.monotonic()
    show = d.make_display(stream, live=stream.isatty())
    try:
        with stop_on_signals(), tempfile.TemporaryDirectory(prefix="objmanifest-demo-") as tmp:
            pool = Pool(Path(tmp))
            try:
                typed = s.url or s.endpoint_url  # shown before it is checked: no credential
                where = (
                    without_credentials(typed) if typed else f"an embedded {s.backend} S3 server"
                )
                show.note(f"starting {where} and {len(roster(s))} agent processes...")
                env = child_env(s)
                for who in roster(s):
                    pool.spawn(who, env)
                with open_target(s) as target:
                    summary = _run_on(s, target, pool, show, started)
            finally:
                pool.stop_all()
                show.close()
    except SetupError as e:
        print(f"objmanifest demo: {e}", file=err)
        return EXIT_SETUP
    except (KeyboardInterrupt, Stopped) as e:
        why = f" by {e}" if isinstance(e, Stopped) else ""
        print(f"objmanifest demo: interrupted{why}; agents and server stopped", file=err)
        return 130
    if s.json:
        print(json.dumps(summary, indent=2), file=out)
    else:
        print_summary(summary, out)
    return EXIT_OK if summary["ok"] else EXIT_INCONSISTENT


def _run_on(
    s: Settings, target: Target, pool: Pool, show: d.Display, started: float
) -> dict[str, Any]:
    server_seconds = time.monotonic() - started
    demo = Demo(s, target, pool, show)
    show.note(f"{target.where} ready in {server_seconds:.1f}s; task {demo.task_id}")
    task = demo.create_task()
    demo.start_agents()
    try:
        demo.watch(task)
    finally:
        pool.stop_all()
        show.close()
    pipeline_seconds = demo.elapsed()
    before = v.snapshot(task)
    demo.problems += demo.agent_problems()
    demo.problems += v.check_manifest(before, demo.plan, demo.kill)
    verify_start = time.monotonic()
    result = v.audit(task, demo.plan, p.archive_body_size(s.big_mib * p.MiB))
    demo.problems += result.problems
    after = v.snapshot(task)
    if not result.problems:
        demo.problems += v.check_all_consumed(after)
    phases = {
        "server": server_seconds,
        "pipeline": pipeline_seconds,
        "verify": time.monotonic() - verify_start,
    }
    summary = build_summary(demo, task, before, after, result, phases)
    summary["elapsed_seconds"] = round(time.monotonic() - started, 2)
    if s.keep:
        where = target.store.describe(f"{demo.task_id}/")
        summary["kept"] = (
            f"{where} (server data in {target.data_dir})" if target.data_dir else where
        )
    elif not target.embedded:
        cleanup(target, demo.task_id)
    return summary
