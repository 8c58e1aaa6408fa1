"""What the upload code needs of a task, and nothing more."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...cas.loop import Documents
from ...core.layout import TaskLayout
from ...core.model import SCHEMA_VERSION, Claim, Entry
from ...errors import NotFound
from ...store import ObjectStore


@dataclass(frozen=True)
class Scope:
    """The store, the CAS loop and the keys of one task, and two questions about its
    entries. Uploads are built on these, never on ``Task``.

    * ``held(claim)``: the entry, read fresh, if ``claim`` still holds it; else
      ``LeaseLost``. The upload engine asks before it starts anew and before completing.
    * ``entry(stage, file_id)``: the entry as the store has it now, or None.
    """

    store: ObjectStore
    docs: Documents
    layout: TaskLayout
    stages: tuple[str, ...]
    held: Callable[[Claim], Entry]
    entry: Callable[[str, str], Entry | None]
    schema: int = SCHEMA_VERSION
    """The task's schema version: new upload states are created at it."""

    def stage_of(self, file_id: str) -> str:
        """The stage of the entry ``file_id``, from its shard (``NotFound`` if none has it)."""
        for stage in self.stages:
            found = self.entry(stage, file_id)
            if found is not None:
                return found.stage
        raise NotFound(f"{file_id!r} is in no shard of task {self.layout.task_id!r}")
