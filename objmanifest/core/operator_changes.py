"""Lifecycle verbs operators need: release, revive, undeclare, as pure changes and the
named commands that carry them (so each is journaled like every other commit).

* ``release``: the holder gives its claim back without spending a retry. Fenced like every
  holder change: a stale epoch or another agent gets ``LeaseLost`` and writes nothing. A
  chunked entry's upload state is left as it is, so the next holder adopts its parts.
* ``revive``: a dead entry becomes ``failed`` with ``retry_count`` 0, claimable again.
* ``undeclare``: a pending entry nobody depends on leaves its shard, then the index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import shard_index

from ..errors import HasDependents, WrongState
from .changes import _entry, _held, _update
from .commands import ByHolder
from .model import Claim, Entry, Shard
from .states import State, Verb, verb_state


def release(shard: Shard, claim: Claim, now: datetime) -> tuple[Shard, Entry]:
    """The holder gives the entry back: pending (failed if it failed before), same retry
    count, no holder. The epoch stays, so the next claim fences this holder out."""
    entry = _held(shard, claim)
    state = verb_state(entry.state, Verb.release, retry_count=entry.retry_count)
    released = _update(entry, now, state=state, owner=None, lease_expires_at=None)
    return shard.with_entries({claim.file_id: released}), released


def unarchived(shard: Shard, file_id: str, archived: Entry | None) -> Shard:
    """``shard`` with an archived entry back among its live entries (``archived``: the
    whole entry, read from its archive object); the shard as it is if the id is live or
    not archived here."""
    refs = shard.archived or {}
    if file_id in shard.entries or file_id not in refs or archived is None:
        return shard
    rest = {fid: ref for fid, ref in refs.items() if fid != file_id}
    return shard.model_copy(
        update={"entries": {**shard.entries, file_id: archived}, "archived": rest}
    )


def revive(
    shard: Shard, file_id: str, now: datetime, archived: Entry | None = None
) -> tuple[Shard, Entry]:
    """A dead entry back to ``failed`` with its retries reset; its last error is kept. A
    dead entry that was archived comes back into the live shard (``archived``: the entry
    as its archive object holds it)."""
    shard = unarchived(shard, file_id, archived)
    entry = _entry(shard, file_id)
    if entry.state is not State.dead:
        raise WrongState(
            f"{file_id!r} is {entry.state.value}, not dead: only a dead entry can be revived"
        )
    revived = _update(
        entry,
        now,
        state=verb_state(entry.state, Verb.revive),
        retry_count=0,
        owner=None,
        lease_expires_at=None,
    )
    return shard.with_entries({file_id: revived}), revived


def undeclare(shard: Shard, file_id: str) -> tuple[Shard | None, Entry | None]:
    """Remove a pending entry no entry of this shard depends on; None if it is gone
    already (an interrupted undeclare: the index half is still to do)."""
    entry = shard.entries.get(file_id)
    ref = (shard.archived or {}).get(file_id)
    if entry is None and ref is not None:
        raise WrongState(
            f"{file_id!r} is archived ({ref.state.value}), not pending: only an entry "
            "nobody has claimed yet can be undeclared"
        )
    if entry is None:
        return None, None
    if entry.state is not State.pending:
        raise WrongState(
            f"{file_id!r} is {entry.state.value}, not pending: only an entry nobody has "
            "claimed yet can be undeclared"
        )
    waiting = sorted(e.file_id for e in shard.entries.values() if file_id in e.depends_on)
    if waiting:
        raise dependents_error(file_id, waiting)
    rest = {fid: e for fid, e in shard.entries.items() if fid != file_id}
    return shard.model_copy(update={"entries": rest}), entry


def dependents_error(file_id: str, dependents: list[str]) -> HasDependents:
    shown = ", ".join(dependents[:20]) + (" ..." if len(dependents) > 20 else "")
    return HasDependents(
        f"{file_id!r} cannot be undeclared: {shown} "
        f"{'depends' if len(dependents) == 1 else 'depend'} on it; undeclare "
        f"{'that entry' if len(dependents) == 1 else 'them'} first",
        tuple(dependents),
    )


@dataclass(frozen=True)
class Release(ByHolder):
    """The holder gives its claim back; no retry is spent."""

    name: ClassVar[str] = "release"

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard, Entry]:
        return release(shard, self.claim, now)


@dataclass(frozen=True)
class Revive:
    """An operator gives a dead entry its retries back."""

    name: ClassVar[str] = "revive"
    file_id: str
    actor: str = ""
    archived: Entry | None = None
    """The entry as its archive object holds it, if it was archived."""

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard, Entry]:
        return revive(shard, self.file_id, now, self.archived)


@dataclass(frozen=True)
class Undeclare:
    """A pending entry nobody depends on leaves its shard."""

    name: ClassVar[str] = "undeclare"
    file_id: str
    actor: str = ""

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard | None, Entry | None]:
        return undeclare(shard, self.file_id)


@dataclass(frozen=True)
class UndeclareInIndex:
    """The index's half of an undeclare (after the shard's)."""

    name: ClassVar[str] = "undeclare"
    file_id: str
    actor: str = ""

    def apply(
        self, index: shard_index.ShardIndex, now: datetime
    ) -> tuple[shard_index.ShardIndex | None, bool]:
        try:
            new = index.remove(self.file_id)
        except shard_index.HasDependents as e:
            raise dependents_error(self.file_id, list(e.dependents)) from None
        return (None, False) if new is index else (new, True)


__all__ = [
    "Release",
    "Revive",
    "Undeclare",
    "UndeclareInIndex",
    "release",
    "revive",
    "undeclare",
]
