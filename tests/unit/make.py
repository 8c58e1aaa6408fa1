"""Builders for the unit tests of the pure core: entries, shards and claims in memory."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from objmanifest.core.changes import Lookup, Rules
from objmanifest.core.model import Claim, Entry, Shard
from objmanifest.core.states import State

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
"""The store's time at the start of every test."""

STAGE = "s"
RULES = Rules(task_id="job", lease_seconds=30, max_retries=2)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def entry(file_id: str = "a", **fields: Any) -> Entry:
    fields.setdefault("stage", STAGE)
    fields.setdefault("declared_at", T0)
    fields.setdefault("updated_at", T0)
    return Entry(file_id=file_id, **fields)


def held(
    file_id: str = "a", owner: str = "bob", epoch: int = 3, lease: float = 30, **fields: Any
) -> Entry:
    """A ``writing`` entry held by ``owner`` at ``epoch``, its lease ending at ``at(lease)``."""
    return entry(
        file_id, state=State.writing, owner=owner, epoch=epoch, lease_expires_at=at(lease), **fields
    )


def ready(file_id: str = "a", key: str = "k", checksum: str = "c", **fields: Any) -> Entry:
    fields.setdefault("epoch", 3)
    fields.setdefault("owner", "bob")
    return entry(file_id, state=State.ready, key=key, checksum=checksum, size=5, **fields)


def shard(*entries: Entry) -> Shard:
    return Shard(task_id="job", stage=STAGE, entries={e.file_id: e for e in entries})


def lookup(*entries: Entry) -> Lookup:
    return {e.file_id: e for e in entries}.get


def nothing(file_id: str) -> Entry | None:
    """A lookup that finds no dependency at all."""
    return None


def claim_on(e: Entry, agent: str | None = None, epoch: int | None = None) -> Claim:
    """A claim on ``e``: its holder's by default, or a stale/foreign one."""
    return Claim(
        task_id="job",
        file_id=e.file_id,
        stage=e.stage,
        agent=agent if agent is not None else (e.owner or "bob"),
        epoch=epoch if epoch is not None else e.epoch,
        lease_expires_at=e.lease_expires_at or at(30),
    )


def exactly(message: str) -> str:
    """A ``match=`` pattern for this whole message and nothing else."""
    return "^" + re.escape(message) + "$"
