"""Showing the demo while it runs: a live rich table on a terminal, plain lines elsewhere.

The orchestrator hands a ``Snapshot`` to ``update`` a few times a second and one-line
``note``s for things that happen (a kill, a takeover). On a terminal everything redraws in
place; in a log or a pipe a status line is printed every few seconds, and notes at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from objmanifest.local.styles import STATE_STYLES

from ..core.states import State

PLAIN_EVERY = 2.0


@dataclass
class AgentView:
    name: str
    stage: str
    status: str
    current: str = ""
    produced: int = 0


@dataclass
class Transfer:
    file_id: str
    done: int
    total: int | None
    how: str


@dataclass
class Snapshot:
    elapsed: float
    counts: dict[str, dict[str, int]]
    agents: list[AgentView] = field(default_factory=list)
    transfer: Transfer | None = None


class Display(Protocol):
    def update(self, snap: Snapshot) -> None: ...
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


def mib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1024 * 1024):.1f} MiB"


def stage_line(counts: dict[str, dict[str, int]]) -> str:
    """``collect 24 ready | write 3 writing, 6 pending | ...`` with empty states left out."""
    parts = []
    for stage, states in counts.items():
        shown = ", ".join(f"{n} {s}" for s, n in states.items() if n)
        parts.append(f"{stage} {shown or '-'}")
    return " | ".join(parts)


class PlainDisplay:
    """Periodic status lines, for logs, pipes and CI."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = 0.0
        self.last_line = ""

    def update(self, snap: Snapshot) -> None:
        line = stage_line(snap.counts)
        if snap.transfer is not None and snap.transfer.total:
            t = snap.transfer
            line += f" | {t.file_id} {mib(t.done)}/{mib(t.total)}"
        now = time.monotonic()
        if now - self.last >= PLAIN_EVERY and line != self.last_line:
            self.last, self.last_line = now, line
            self.write(f"[{snap.elapsed:5.1f}s] {line}")

    def note(self, text: str) -> None:
        self.write(f"  * {text}")

    def write(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class LiveDisplay:
    """A table redrawn in place: entries per stage and state, agents, the large upload."""

    def __init__(self, stream: TextIO) -> None:
        self.console = Console(file=stream)
        self.live = Live(Text("starting..."), console=self.console, refresh_per_second=8)
        self.live.start()

    def update(self, snap: Snapshot) -> None:
        self.live.update(render(snap))

    def note(self, text: str) -> None:
        self.live.console.print(Text(f"  * {text}", style="cyan"))

    def close(self) -> None:
        self.live.stop()


def render(snap: Snapshot) -> Group:
    return Group(_stage_table(snap), _agent_table(snap), *_transfer(snap))


def _stage_table(snap: Snapshot) -> Table:
    table = Table(title=f"objmanifest demo  {snap.elapsed:5.1f}s", title_justify="left")
    table.add_column("stage")
    for state in State:
        table.add_column(state.value, justify="right", style=STATE_STYLES[state])
    for stage, states in snap.counts.items():
        table.add_row(stage, *[str(states.get(s.value, 0) or "") for s in State])
    return table


def _agent_table(snap: Snapshot) -> Table:
    table = Table(show_edge=False, box=None, padding=(0, 1))
    for name in ("agent", "stage", "status", "made", "working on"):
        table.add_column(name, style="dim" if name == "stage" else None)
    for a in snap.agents:
        style = "bold red" if a.status == "killed" else "green" if a.status == "done" else ""
        table.add_row(a.name, a.stage, Text(a.status, style=style), str(a.produced), a.current)
    return table


def _transfer(snap: Snapshot) -> list[Table]:
    t = snap.transfer
    if t is None:
        return []
    table = Table(show_header=False, show_edge=False, box=None, padding=(0, 1))
    total = t.total or 0
    bar = ProgressBar(total=float(total or 1), completed=float(min(t.done, total or 1)), width=30)
    table.add_row(t.file_id, bar, f"{mib(t.done)} / {mib(t.total)}", t.how)
    return [table]


def make_display(stream: TextIO, live: bool) -> Display:
    return LiveDisplay(stream) if live else PlainDisplay(stream)
