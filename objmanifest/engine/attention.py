"""What needs a person's attention in an entry: dead, overdue, late for its stage's deadline,
blocked on a dead dependency, or backing off after a failure."""

from __future__ import annotations

from datetime import datetime

from ..core import changes, leases
from ..core.model import Entry
from ..core.states import State


def attention(entry: Entry, now: datetime, lookup: changes.Lookup) -> tuple[str, str] | None:
    """Whether a status report should name this entry: (dead|overdue|blocked, why)."""
    if entry.state is State.dead:
        return "dead", entry.error or "retries exhausted"
    if leases.expired(entry, now):
        expiry = entry.lease_expires_at.isoformat() if entry.lease_expires_at else "?"
        return "overdue", f"lease of {entry.owner} expired at {expiry}"
    if entry.state not in (State.pending, State.failed):
        return None
    waiting, dead = changes.blockers(entry, lookup)
    if dead:
        return "blocked", f"depends on dead entries: {', '.join(dead)}"
    if waiting:
        return "blocked", f"waiting for {', '.join(waiting)}"
    return None


def timing(entry: Entry, now: datetime, deadline: float | None) -> tuple[str, str] | None:
    """Whether a status report should name this entry for its timing: ("late", why) past
    its stage's deadline, ("backing_off", until when) waiting out a retry backoff."""
    if leases.late(entry, now, deadline):
        due = leases.due_at(entry, deadline)
        assert due is not None
        what = "ready" if entry.state is State.writing else "consumed"
        return (
            "late",
            f"{entry.state.value} past its stage's deadline: due {what} by {due.isoformat()}",
        )
    if leases.backing_off(entry, now):
        assert entry.retry_at is not None
        return "backing_off", f"may be retried from {entry.retry_at.isoformat()}"
    return None
