"""What a status report says: counts per stage and state, and the entries, declarations
and objects that need attention. Pydantic models, no I/O."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .states import State


class EntryNote(BaseModel):
    """One entry that needs attention in a status report, and why."""

    model_config = ConfigDict(frozen=True)

    file_id: str
    stage: str
    state: State
    reason: str


class IndexNote(BaseModel):
    """A file id the index and the shards disagree about, and what to do about it."""

    model_config = ConfigDict(frozen=True)

    file_id: str
    stage: str
    reason: str


class DamageNote(BaseModel):
    """A manifest object that does not read back sound, and what to do about it."""

    model_config = ConfigDict(frozen=True)

    key: str
    kind: str
    """``shard``, ``index`` or ``upload state``."""
    problem: str
    address: str = ""
    """The object's full address (``s3://bucket/prefix/key``)."""
    fix: str = "run `objmanifest repair` (Task.repair())"


class TaskStatus(BaseModel):
    """Counts per stage and state, and the entries that are stuck."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    store_time: datetime
    stages: dict[str, dict[str, int]]
    blocked: list[EntryNote] = Field(default_factory=list)
    overdue: list[EntryNote] = Field(default_factory=list)
    dead: list[EntryNote] = Field(default_factory=list)
    late: list[EntryNote] = Field(default_factory=list)
    """Writing or ready for longer than their stage's deadline (``overdue`` is an expired
    lease)."""
    backing_off: list[EntryNote] = Field(default_factory=list)
    """Failed entries waiting out their retry backoff; the reason says until when."""
    unfinished: list[IndexNote] = Field(default_factory=list)
    """In the index, in no shard: a declaration that was interrupted (rerun it)."""
    unindexed: list[IndexNote] = Field(default_factory=list)
    """In a shard, not in the index: damage (``Task.repair_index()`` repairs it)."""
    archived: dict[str, int] = Field(default_factory=dict)
    """Per stage, how many entries are archived; ``stages`` counts them in their state
    (consumed or dead) too."""
    damaged: list[DamageNote] = Field(default_factory=list)
    """Shards, the index, and upload states of ready chunked entries that do not read back
    sound: the counts leave out what a damaged shard holds (``Task.repair()`` mends it)."""
    contention: dict[str, float] = Field(default_factory=dict)
    """Per stage with recent commits, the races they lost per commit (``core.contention``)."""
    contended: list[str] = Field(default_factory=list)
    """Stages losing races often: more agents than their shards take (more partitions)."""

    @property
    def totals(self) -> dict[str, int]:
        out = {s.value: 0 for s in State}
        for counts in self.stages.values():
            for state, n in counts.items():
                out[state] += n
        return out

    @property
    def finished(self) -> bool:
        """Every entry is ready or consumed and no declaration is unfinished: nothing is
        left to produce."""
        t = self.totals
        done = sum(t.values()) == t["ready"] + t["consumed"]
        return done and not self.unfinished and not self.damaged
