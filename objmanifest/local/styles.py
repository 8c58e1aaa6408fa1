"""How each entry state looks on a terminal: one table for the CLI and the demo."""

from __future__ import annotations

from ..core.states import State

STATE_STYLES: dict[State, str] = {
    State.pending: "dim",
    State.writing: "yellow",
    State.ready: "green",
    State.consumed: "blue",
    State.failed: "red",
    State.dead: "bold red",
}
"""A rich style per state."""

ATTENTION_STYLES = {
    "dead": "bold red",
    "overdue": "bold yellow",
    "blocked": "cyan",
    "late": "yellow",
    "backing off": "dim red",
    "damaged": "bold magenta",
    "unfinished": "magenta",
}
"""A rich style per kind of entry a status report names."""
