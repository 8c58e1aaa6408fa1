"""A task: the manifest of one job, and the agents that work on it.

``Task`` is the public face of ``manifest.Manifest`` (creating, opening, declaring, status,
reaping) that can also make its agents: ``task.agent(name, role)``.
"""

from __future__ import annotations

from .agent import Agent
from .cas.codecs import HeaderCodec
from .core.layout import TaskLayout
from .engine.attention import attention
from .engine.manifest import Manifest
from .errors import ObjManifestError
from .ops.deletion import task_ids
from .store import ObjectStore
from .store.errors import NoSuchObject


class Task(Manifest):
    """The manifest of one job. Safe to share between threads."""

    def agent(self, name: str, role: str | None = None) -> Agent:
        """An agent working on this task; ``role`` (for consumers) defaults to the name."""
        return Agent(self, name, role)

    # -- lifecycle verbs: list -------------------------------------------------

    @staticmethod
    def list(store: ObjectStore) -> list[str]:
        """The ids of the tasks under the store's prefix, sorted: one delimiter listing of
        the top level (no data objects listed), then each one's header. A prefix without a
        readable header, or a task being deleted, is left out."""
        found = []
        for task_id in task_ids(store):
            key = TaskLayout(task_id).header
            try:
                blob = store.get(key)
                assert blob is not None
                header = HeaderCodec(task_id).decode(key, blob.body)
            except (NoSuchObject, ObjManifestError):  # deleted since the listing, unreadable
                continue
            if header.deleting_at is None:
                found.append(task_id)
        return found


__all__ = ["Task", "attention"]
