"""The agent processes: who they are, starting them early, and hearing what they say.

Processes start before the server is ready, so their imports overlap with its start; each
waits for its spec on stdin and then reports JSON lines on stdout, read by one thread each
into a single queue.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import display as d
from . import plan as p
from .target import Settings
from .worker import WorkerSpec

VICTIM = "writer-victim"


@dataclass(frozen=True)
class Role:
    """Who an agent process is: decided before the server exists."""

    name: str
    role: str
    stage: str
    victim: bool = False


@dataclass
class Proc:
    """One agent process and what it has told us."""

    who: Role
    popen: subprocess.Popen[str]
    log_path: Path
    reader: threading.Thread
    spec: WorkerSpec | None = None
    status: str = "starting"
    current: str = ""
    produced: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    killed: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.who.name

    def view(self) -> d.AgentView:
        return d.AgentView(self.name, self.who.stage, self.status, self.current, self.produced)


class Pool:
    """The agent processes; their JSON lines arrive on one queue.

    Processes are started before the server is ready, so their imports overlap with its
    start; each waits for its spec on stdin.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def spawn(self, who: Role, env: dict[str, str]) -> Proc:
        log_path = self.log_dir / f"{who.name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "objmanifest.demo.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                bufsize=1,
            )
        reader = threading.Thread(
            target=self._read, args=(who.name, popen.stdout), name=f"read-{who.name}", daemon=True
        )
        proc = Proc(who, popen, log_path, reader)
        reader.start()
        self.procs.append(proc)
        return proc

    def assign(self, proc: Proc, spec: WorkerSpec) -> None:
        """Hand a waiting process its work: one JSON line, then end of input."""
        proc.spec = spec
        assert proc.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.popen.stdin.write(spec.to_json() + "\n")
            proc.popen.stdin.close()

    def _read(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "output", "line": line.rstrip()}
            self.events.put((name, event if isinstance(event, dict) else {"event": "output"}))

    def running(self) -> list[Proc]:
        return [pr for pr in self.procs if pr.popen.poll() is None]

    def stop_all(self) -> None:
        """Kill whatever still runs (a timeout, Ctrl-C) and reap every process."""
        for pr in self.procs:
            if pr.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    pr.popen.kill()
            if pr.popen.stdin is not None and not pr.popen.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    pr.popen.stdin.close()
        for pr in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pr.popen.wait(timeout=10)
            pr.reader.join(timeout=5)
            if pr.popen.stdout is not None:
                pr.popen.stdout.close()

    def log_tail(self, pr: Proc, lines: int = 8) -> str:
        try:
            text = pr.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def roster(s: Settings) -> list[Role]:
    """The agent processes of a run: the victim, then each stage's agents."""
    who = [Role(VICTIM, p.WRITER, "write", victim=True)]
    for stage, kind, role in (
        ("collect", "collector", "collector"),
        ("write", "writer", p.WRITER),
        ("check", "checker", p.CHECKER),
    ):
        who += [Role(f"{kind}-{n}", role, stage) for n in range(1, s.agents + 1)]
    return who
