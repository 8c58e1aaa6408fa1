"""Deleting a task and listing the tasks of a store (lifecycle verbs).

A delete first marks the header (``deleting_at``, a named ``delete`` commit), so from then
on ``Task.open`` refuses the task and ``Task.list`` leaves it out: a half-deleted task never
looks like a healthy, empty one. Then it aborts every multipart upload under the task,
deletes every other object under it (shards, index, data, journal, upload states, archive)
and the header last. Running it again after a crash finishes it: the marked header is
still there, or, once the header is gone, whatever is left under the task's prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from ..core import leases
from ..core.layout import TaskLayout, task_of
from ..core.model import Shard, TaskHeader
from ..core.states import State
from ..errors import LeasesLive, NotFound
from ..store import ObjectStore, list_keys
from ..store.errors import NoSuchObject


@dataclass(frozen=True)
class Deleted:
    """What a delete removed."""

    task_id: str
    objects: int
    uploads_aborted: int


def live_holders(shards: Iterable[Shard], now: datetime) -> list[str]:
    """``FILE_ID (agent, epoch N, until T)`` for every entry writing under an unexpired
    lease on the store's clock."""
    return [
        f"{e.file_id} ({e.owner}, epoch {e.epoch}, until "
        f"{e.lease_expires_at.isoformat() if e.lease_expires_at else '?'})"
        for shard in shards
        for e in shard.entries.values()
        if e.state is State.writing and not leases.expired(e, now)
    ]


def refuse_live(task_id: str, holders: list[str]) -> None:
    if holders:
        shown = "; ".join(holders[:20]) + (" ..." if len(holders) > 20 else "")
        raise LeasesLive(
            f"task {task_id!r} has {len(holders)} live lease(s): {shown}. Wait for them to "
            "finish or expire, or delete with force=True (--force): their holders then fail",
            tuple(holders),
        )


@dataclass(frozen=True)
class MarkDeleting:
    """The header says the task is being deleted; a no-op once it says so."""

    name: ClassVar[str] = "delete"
    actor: ClassVar[str] = ""

    def apply(self, doc: TaskHeader, now: datetime) -> tuple[TaskHeader | None, TaskHeader]:
        if doc.deleting_at is not None:
            return None, doc
        marked = doc.model_copy(update={"deleting_at": now})
        return marked, marked


def remove_all(store: ObjectStore, layout: TaskLayout) -> Deleted:
    """Abort the uploads under the task, delete every object but the header, then the
    header. Deleting what is gone already is no error, so this can run again."""
    aborted = 0
    for key, upload_id in list(store.list_uploads(layout.root)):
        if store.abort_upload(key, upload_id):
            aborted += 1
    removed = 0
    for key in list(list_keys(store, layout.root)):
        if key != layout.header:
            store.delete(key)
            removed += 1
    try:
        store.head(layout.header)
    except NoSuchObject:
        pass
    else:
        store.delete(layout.header)
        removed += 1
    return Deleted(layout.task_id, removed, aborted)


def remove_leftovers(store: ObjectStore, layout: TaskLayout) -> Deleted:
    """A task whose header is gone: finish deleting what is under it; ``NotFound`` if
    nothing is."""
    if next(iter(store.list(layout.root)), None) is None and not list(
        store.list_uploads(layout.root)
    ):
        raise NotFound(f"task {layout.task_id!r} does not exist at {store.describe(layout.header)}")
    return remove_all(store, layout)


def task_ids(store: ObjectStore) -> list[str]:
    """The ids of the prefixes at the top of the store (one delimiter listing)."""
    found = []
    for row in store.list("", delimiter="/"):
        if row.is_prefix:
            task_id = task_of(row.key)
            if task_id is not None:
                found.append(task_id)
    return sorted(found)


__all__ = ["Deleted", "MarkDeleting", "live_holders", "refuse_live", "remove_all", "task_ids"]
