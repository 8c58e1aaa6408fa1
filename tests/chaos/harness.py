"""The chaos harness: a three-stage pipeline of agent processes through a fault-injecting
proxy in front of a real S3 server, while the harness kills agents, stops others past their
lease (zombies) and runs some on a skewed clock; then the end state is judged.

A run: start the server (``servers.start``) and a ``FaultProxy`` with a seeded ``Chaos``
schedule in front of it; create the task and declare the pipeline directly on the server;
start the agents (``tests/chaos/agent.py``) through the proxy, some under libfaketime; for
``duration`` seconds SIGKILL agents (each restarted under its name) and SIGSTOP others for
longer than a lease (then SIGCONT: they come back as zombies holding fenced claims); then
calm (no more faults, every agent running) until the pipeline finishes; then judge the
store's end state against the agents' operation logs (``tests/chaos/judge.py``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3.session
from botocore.config import Config

import objmanifest as om
from objmanifest.local import servers
from tests.chaos import judge
from tests.chaos.agent import PUBLISHER, ROLES, STAGES, TRANSFER, settled
from tests.support.faults import CHAOS_KINDS, Chaos, FaultProxy

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "objmanifest-chaos"
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's package `faketime`
SKEWS_MINUTES = (-9, -5, -2, 3, 6, 10)
"""Clock skews of agents under libfaketime: a few minutes either way, under the 15 minutes
past which SeaweedFS and AWS refuse a signed request (RequestTimeTooSkewed)."""


@dataclass
class Settings:
    """What one run does (the command line's options)."""

    seed: int
    backend: str
    duration: float = 60.0
    entries: int = 0
    """Raw records of the collect stage (0: five per two seconds of duration); a third as many
    drafts, each of three raw records, and one verdict per draft."""
    agents: int = 8
    lease_seconds: float = 4.0
    max_retries: int = 40
    calm_timeout: float = 180.0
    skewed: int = 2
    """Agents run under libfaketime (0: none)."""
    shells: int = 2
    """Agents that make every call from a new ``Task``, as CLI steps do (``agent --shell``):
    the last agent of collect, then of write, then of check."""
    intensity: float = 1.0
    """Every fault's probability times this (``Chaos.scaled``)."""
    broken: str | None = None
    """A deliberately broken variant every agent runs (``agent.BROKEN``): the run must
    find violations."""
    work_dir: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """A running S3 server: its URL and the ``AWS_*`` environment its clients need."""

    url: str
    env: dict[str, str]


@dataclass
class Proc:
    """One agent: its name, stage, clock skew, and the process running it now."""

    name: str
    stage: str
    skew: str | None
    shell: bool = False
    popen: subprocess.Popen[bytes] | None = None
    stopped_until: float | None = None
    restart_at: float | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    oplog: Path | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def working(self) -> bool:
        """Running, not stopped, and past its start (it has logged an operation): worth
        killing or stopping."""
        if not self.running or self.stopped_until is not None or self.oplog is None:
            return False
        return self.oplog.exists() and self.oplog.stat().st_size > 200


@dataclass
class Report:
    """The figures of a run."""

    seed: int
    backend: str
    duration: float
    intensity: float = 1.0
    broken: str | None = None
    entries: int = 0
    chunked: int = 0
    agents: int = 0
    skewed: list[str] = field(default_factory=list)
    shells: list[str] = field(default_factory=list)
    starts: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    failed_operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    zombies: int = 0
    chaos_seconds: float = 0.0
    calm_seconds: float = 0.0
    finished: bool = False
    invariants: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "backend": self.backend,
            "duration": self.duration,
            "intensity": self.intensity,
            "broken": self.broken,
            "entries": self.entries,
            "chunked_entries": self.chunked,
            "agents": self.agents,
            "skewed": self.skewed,
            "shells": self.shells,
            "agent_starts": self.starts,
            "operations": sum(self.operations.values()),
            "operations_by_kind": dict(sorted(self.operations.items())),
            "failed_operations": dict(sorted(self.failed_operations.items())),
            "requests": self.faults.get("requests", 0),
            "faults": {k: self.faults.get(k, 0) for k in CHAOS_KINDS},
            "kills": self.kills,
            "zombies": self.zombies,
            "chaos_seconds": round(self.chaos_seconds, 1),
            "calm_seconds": round(self.calm_seconds, 1),
            "finished": self.finished,
            "states": dict(sorted(self.states.items())),
            "invariants": self.invariants,
            "violations": self.violations,
        }

    def lines(self) -> list[str]:
        faults = ", ".join(f"{k} {self.faults.get(k, 0)}" for k in CHAOS_KINDS)
        ops = ", ".join(f"{k} {n}" for k, n in sorted(self.operations.items()))
        failed = ", ".join(f"{k} {n}" for k, n in sorted(self.failed_operations.items()))
        out = [
            f"chaos run: seed {self.seed}, backend {self.backend}, intensity {self.intensity:g}, "
            f"{self.chaos_seconds:.0f} s of chaos, {self.calm_seconds:.0f} s calm"
            + (f", agents running the broken variant {self.broken}" if self.broken else ""),
            f"entries: {self.entries}, {self.chunked} chunked "
            f"({', '.join(f'{k} {n}' for k, n in self.states.items())})",
            f"agents: {self.agents} ({self.starts} processes started; "
            f"skewed: {', '.join(self.skewed) or 'none'}; "
            f"one call per process: {', '.join(self.shells) or 'none'})",
            f"operations: {sum(self.operations.values())} succeeded ({ops}); "
            f"{sum(self.failed_operations.values())} failed ({failed or 'none'})",
            f"requests: {self.faults.get('requests', 0)}; faults: {faults}",
            f"kills: {self.kills}",
            f"zombies: {self.zombies}",
            f"invariants checked: {len(self.invariants)}",
        ]
        out += [f"  - {name}" for name in self.invariants]
        out.append(f"violations: {len(self.violations)}")
        out += [f"  ! {v}" for v in self.violations]
        return out


def pipeline(entries: int) -> list[dict[str, Any]]:
    """The declarations: raw records, drafts of three records each (and one more from
    anywhere, so dependencies cross), one verdict per draft, consumed by the publisher."""
    raws = [f"raw/{i:04d}" for i in range(entries)]
    decls: list[dict[str, Any]] = [
        {"file_id": r, "stage": "collect", "consumers": [ROLES["write"]]} for r in raws
    ]
    drafts = max(1, -(-entries // 3))  # every raw record is an input of some draft
    for j in range(drafts):
        deps = {raws[(3 * j + k) % entries] for k in range(3)} | {raws[(7 * j + 5) % entries]}
        decls.append(
            {
                "file_id": f"draft/{j:04d}",
                "stage": "write",
                "depends_on": sorted(deps),
                "consumers": [ROLES["check"]],
            }
        )
    for j in range(drafts):
        decls.append(
            {
                "file_id": f"verdict/{j:04d}",
                "stage": "check",
                "depends_on": [f"draft/{j:04d}"],
                "consumers": [PUBLISHER],
            }
        )
    return decls


class Harness:
    """One run (see the module's docstring)."""

    def __init__(self, settings: Settings, out: Any = sys.stdout) -> None:
        self.s = settings
        self.out = out
        self.rng = random.Random(f"harness:{settings.seed}")
        self.work = Path(settings.work_dir or tempfile.mkdtemp(prefix="objmanifest-chaos-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.prefix = f"chaos-{settings.seed}-{uuid.uuid4().hex[:8]}"
        self.task_id = "pipeline"
        self.report = Report(
            settings.seed,
            settings.backend,
            settings.duration,
            intensity=settings.intensity,
            broken=settings.broken,
        )
        self.procs: list[Proc] = []
        self.env: dict[str, str] = {}

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # -- the run ---------------------------------------------------------------------

    def run(self, endpoint: Endpoint | None = None) -> Report:
        """One run against ``endpoint`` (a server already running), or a server of the
        backend started for the run and stopped after it."""
        # moto's server logs a line per request, and a traceback for a body it cannot
        # parse (one the proxy damaged): the run judges what was stored instead.
        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        if endpoint is not None:
            self._serve(endpoint)
            return self.report
        local = servers.start(self.s.backend)
        try:
            self._serve(Endpoint(local.endpoint_url, local.env()))
        finally:
            local.stop()
        return self.report

    def _serve(self, endpoint: Endpoint) -> None:
        # The moto server stores a damaged body as it arrived (docs/chunked.md, "Integrity in
        # transit"): there only data objects are damaged, which every read verifies.
        damage = ("/data/",) if self.s.backend == "moto" else ()
        with FaultProxy(endpoint.url) as proxy:
            chaos = Chaos(self.s.seed, damage_paths=damage).scaled(self.s.intensity)
            self._run(endpoint, proxy, chaos)

    def _run(self, endpoint: Endpoint, proxy: FaultProxy, chaos: Chaos) -> None:
        env = endpoint.env
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint.url,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env.get("AWS_DEFAULT_REGION", servers.LOCAL_REGION),
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)
        direct = om.connect(f"s3://{BUCKET}/{self.prefix}", client=client)
        task = om.Task.create(
            direct,
            self.task_id,
            stages=list(STAGES),
            lease_seconds=self.s.lease_seconds,
            max_retries=self.s.max_retries,
            transfer=TRANSFER,
        )
        entries = self.s.entries or max(6, int(self.s.duration * 2.5))
        task.declare_many(pipeline(entries))
        self.report.entries = len(task.entries())
        self.env = {
            **os.environ,
            **endpoint.env,
            "AWS_ENDPOINT_URL": proxy.endpoint_url,
            "PYTHONPATH": str(ROOT),
        }
        self.env.pop("AWS_ENDPOINT_URL_S3", None)
        self._make_procs()
        proxy.chaos = chaos
        self.say(
            f"chaos: seed {self.s.seed}, {self.s.backend} at {endpoint.url}, proxy "
            f"{proxy.endpoint_url}, task s3://{BUCKET}/{self.prefix}/{self.task_id}, "
            f"{self.report.entries} entries, {len(self.procs)} agents, logs in {self.work}"
        )
        for proc in self.procs:
            self._start(proc)
        start = time.monotonic()
        self._chaos(start + self.s.duration, task)
        self.report.chaos_seconds = time.monotonic() - start
        proxy.chaos = None
        self.report.faults = Counter(proxy.faults)
        calm = time.monotonic()
        self.report.finished = self._calm(calm + self.s.calm_timeout)
        self.report.calm_seconds = time.monotonic() - calm
        self._stop_all()
        self.report.starts = sum(p.starts for p in self.procs)
        self._judge(task)
        self.report.chunked = sum(e.is_chunked for e in task.entries())
        (self.work / "report.json").write_text(json.dumps(self.report.to_dict(), indent=2))

    def _make_procs(self) -> None:
        counts = {"collect": 0, "write": 0, "check": 0}
        for i in range(self.s.agents):
            counts[STAGES[i % 3]] += 1
        names = [f"{stage}-{n}" for stage in STAGES for n in range(counts[stage])]
        skewed = set(self.rng.sample(names, min(self.s.skewed, len(names))))
        lasts = [f"{stage}-{counts[stage] - 1}" for stage in STAGES if counts[stage]]
        shells = set(lasts[: self.s.shells])
        for name in names:
            skew = None
            if name in skewed:
                skew = f"{self.rng.choice(SKEWS_MINUTES):+d}m"
                self.report.skewed.append(f"{name} {skew}")
            if name in shells:
                self.report.shells.append(name)
            self.procs.append(Proc(name, name.rsplit("-", 1)[0], skew, shell=name in shells))
        self.report.agents = len(self.procs)

    def _start(self, proc: Proc) -> None:
        env = dict(self.env)
        if proc.skew is not None:
            found = sorted(glob.glob(FAKETIME_GLOB))
            if not found:
                raise RuntimeError(
                    f"libfaketime is not installed (no {FAKETIME_GLOB}): "
                    "install the `faketime` package, or run with --skewed 0"
                )
            env.update({"LD_PRELOAD": found[0], "FAKETIME": proc.skew})
        proc.starts += 1
        proc.oplog = self.work / f"{proc.name}.{proc.starts}.jsonl"
        scratch = self.work / "scratch" / proc.name  # each agent its own copy of the sources
        scratch.mkdir(parents=True, exist_ok=True)
        log = open(self.work / f"{proc.name}.log", "ab")  # noqa: SIM115 (the child's own)
        with log:
            proc.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.chaos.agent",
                    "--bucket",
                    BUCKET,
                    "--prefix",
                    self.prefix,
                    "--task",
                    self.task_id,
                    "--name",
                    proc.name,
                    "--stage",
                    proc.stage,
                    "--oplog",
                    str(proc.oplog),
                    "--seed",
                    str(self.s.seed),
                    "--scratch",
                    str(scratch),
                    "--max-seconds",
                    str(self.s.duration + self.s.calm_timeout + 60),
                    *(["--broken", self.s.broken] if self.s.broken else []),
                    *(["--shell"] if proc.shell else []),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc.restart_at = None

    def _tick(self, now: float) -> None:
        """Resume the stopped agents that are due, restart the killed ones."""
        for proc in self.procs:
            if proc.stopped_until is not None and now >= proc.stopped_until:
                self._resume(proc)
            if proc.restart_at is not None and now >= proc.restart_at:
                self._start(proc)
            if proc.popen is not None and proc.popen.poll() is not None and proc.restart_at is None:
                code = proc.popen.returncode
                if code != -signal.SIGKILL:
                    proc.exits.append(code)
                proc.popen = None

    def _resume(self, proc: Proc) -> None:
        if proc.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGCONT)
        proc.stopped_until = None

    def _chaos(self, until: float, task: om.Task) -> None:
        next_check = 0.0
        while (now := time.monotonic()) < until:
            self._tick(now)
            if now >= next_check:
                next_check = now + 3.0
                with contextlib.suppress(om.ObjManifestError):
                    if settled(task.entries()):
                        return
            live = [p for p in self.procs if p.working]
            stopped = sum(p.stopped_until is not None for p in self.procs)
            action = self.rng.choices(("kill", "stop", "none"), (3, 2, 3))[0]
            if live and not self.report.zombies:  # every run has a zombie and a kill
                action = "stop"
            elif live and not self.report.kills:
                action = "kill"
            if action == "kill" and live:
                proc = self.rng.choice(live)
                assert proc.popen is not None
                proc.popen.kill()
                proc.popen.wait()
                proc.restart_at = now + self.rng.uniform(0.5, 2.0)
                self.report.kills += 1
            elif action == "stop" and live and stopped < max(1, len(self.procs) // 3):
                proc = self.rng.choice(live)
                assert proc.popen is not None
                proc.popen.send_signal(signal.SIGSTOP)
                # Past the lease and its 2 s margin: whatever it holds may be taken over.
                proc.stopped_until = now + self.s.lease_seconds + 2 + self.rng.uniform(1, 4)
                self.report.zombies += 1
            time.sleep(self.rng.uniform(0.5, 2.0))

    def _calm(self, until: float) -> bool:
        """No faults; every agent running: wait until every agent is done."""
        for proc in self.procs:
            self._resume(proc)
            if proc.restart_at is not None:
                self._start(proc)
        while time.monotonic() < until:
            self._tick(time.monotonic())
            if all(p.popen is None for p in self.procs):
                return True
            time.sleep(0.3)
        return False

    def _stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen is not None and proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in self.procs:
            if proc.popen is not None:
                try:
                    proc.popen.wait(10)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
                proc.exits.append(proc.popen.returncode)
                proc.popen = None

    # -- the judgement ---------------------------------------------------------------

    def _judge(self, task: om.Task) -> None:
        lines = []
        for path in sorted(self.work.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
                    lines.append(json.loads(line))
        fresh = om.Task.open(task.store, self.task_id)
        verdict, counts = judge.judge(fresh, lines, self.procs_exits(), self.report.finished)
        for what, n in counts.items():
            op, outcome = what.split(" ", 1)
            if op in ("status", "work"):
                continue
            (self.report.operations if outcome == "ok" else self.report.failed_operations)[
                what if outcome != "ok" else op
            ] += n
        self.report.states = Counter(e.state.value for e in fresh.entries())
        self.report.invariants = verdict.invariants
        self.report.violations = verdict.violations

    def procs_exits(self) -> dict[str, list[int]]:
        return {p.name: p.exits for p in self.procs}
