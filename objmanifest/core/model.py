"""The manifest's data: task header, shard, entry, claim. Pydantic models, no I/O.

Models keep fields they do not know (``extra="allow"``), so an object written by a newer
objmanifest of the same schema version loses nothing when this version rewrites it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import InvalidInput
from .commit_events import Change
from .names import check_agent, check_file_id, check_name
from .states import State

SCHEMA_VERSION = 2
"""The newest format this objmanifest writes: 2 journals every version of every manifest
object. A task stays at the version its header says (1 for tasks made before the journal)
until ``Task.migrate`` moves it, so agents of both releases can share it meanwhile."""
JOURNAL_SCHEMA = 2
"""The first schema version whose manifest objects carry their journal records."""
LAYOUT_SCHEMA = 3
"""The task header that adds the shard layout (``partitions``, ``layout``). A task with the
default layout (one shard per stage) keeps its header at its objects' schema, so 0.2.0
agents can share it; one with partitioned stages or one shard for the whole task has a
header at 3, which 0.2.0 refuses (it would look for each stage's own shard). Manifest
objects are at ``SCHEMA_VERSION`` in both."""
SPREAD_SCHEMA = 4
"""The header of a spread task (``spread``, up to ``MAX_SPREAD_PARTITIONS`` partitions a
stage), which 0.3.0 refuses: it would look for the shards at their flat keys."""
HEADER_SCHEMA = SPREAD_SCHEMA
"""The newest task header this objmanifest reads."""
READERS = {1: "0.1.0", 2: "0.2.0", 3: "0.3.0", 4: "0.4.0"}
"""The first objmanifest release that reads each schema version."""
BACKOFF_CAP_FACTOR = 64
"""Without ``retry_backoff_max``, a retry's backoff doubles up to this many times the first."""
MAX_PARTITIONS = 1024
"""The most shards one stage of a task that is not spread may be split into."""
MAX_SPREAD_PARTITIONS = 16384  # the most shards one stage of a spread task may have
TASK_SHARD = "_task"
"""The name of the one shard of a task created with ``layout="task"`` (never a stage name:
those start with a letter or digit)."""
COMMITS_KEPT = 64
"""How many commit ids a shard remembers: enough to tell a lost response from a lost race
even after dozens of others committed on top."""


M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def validated(model: type[M], what: str, **fields: Any) -> M:
    """Build a model from user input; a bad field raises the check's own clear error, not
    a pydantic report."""
    try:
        return model(**fields)
    except ValidationError as e:
        for err in e.errors():
            original = (err.get("ctx") or {}).get("error")
            if isinstance(original, Exception):
                raise original from None
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"invalid {what}: {where}: {first['msg']}") from None


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, use_enum_values=False)

    def replaced(self: M, **changes: Any) -> M:
        """``model_copy(update=changes)`` in one step (commits copy shards and entries often;
        pydantic's general copy costs twice as much); a name the model does not declare, or
        a model with private attributes, goes through ``model_copy``."""
        cls = type(self)
        known = changes.keys() <= cls.__pydantic_fields__.keys()
        if not known or getattr(self, "__pydantic_private__", None):
            return self.model_copy(update=changes)
        new, extra, given = cls.__new__(cls), self.__pydantic_extra__, self.__pydantic_fields_set__
        _set(new, "__dict__", {**self.__dict__, **changes})
        # A frozen model never changes these: no unknown fields, or the same fields given, are
        # shared with the copy rather than copied.
        _set(new, "__pydantic_extra__", extra and dict(extra))
        _set(
            new,
            "__pydantic_fields_set__",
            given if changes.keys() <= given else given | changes.keys(),
        )
        _set(new, "__pydantic_private__", None)
        return new


class JournalRecord(_Model):
    """One committed version of a manifest object: who changed it, how, when (the store's
    time the change was decided at), and what each changed item went through.

    Stored inside the object it describes until it is flushed to a journal block
    (``object_key`` is then implied); readers fill ``object_key`` in."""

    version: int
    commit_id: str
    command: str
    actor: str
    at: datetime
    transitions: tuple[Change, ...] = ()
    object_key: str | None = None
    lost_races: int | None = None
    """Conditional writes the commit lost (412, 409) before its own landed; None: none."""

    @classmethod
    def of_commit(
        cls,
        version: int,
        commit_id: str,
        command: str,
        actor: str,
        at: datetime,
        transitions: tuple[Change, ...],
        lost_races: int | None,
    ) -> JournalRecord:
        """The record of a commit the CAS loop just made, as ``JournalRecord(...)`` of these
        fields builds it, without validating them: they are the loop's own (a version and a
        count it counted, the command's names, the store's time, the changes its codec
        made), and every commit makes one."""
        made = cls.__new__(cls)
        _set(made, "__dict__", {
            "version": version,
            "commit_id": commit_id,
            "command": command,
            "actor": actor,
            "at": at,
            "transitions": transitions,
            "object_key": None,
            "lost_races": lost_races,
        })  # fmt: skip
        _set(made, "__pydantic_extra__", {})
        _set(made, "__pydantic_fields_set__", set(_RECORD_GIVEN))
        _set(made, "__pydantic_private__", None)
        return made


_RECORD_GIVEN = frozenset(
    ("version", "commit_id", "command", "actor", "at", "transitions", "lost_races")
)
"""The fields a record of a commit is given (``object_key`` only once it is read back)."""


class Journaled(_Model):
    """A manifest object whose newest journal records travel inside it.

    ``journal_id`` names this incarnation of the object (a deleted and re-created object
    starts a new one, so its versions never collide with older blocks); ``journal`` holds
    the records not yet known to be flushed, oldest first. Both stay None below
    ``JOURNAL_SCHEMA``."""

    schema_version: int = SCHEMA_VERSION
    version: int = 0
    commits: tuple[str, ...] = ()
    journal_id: str | None = None
    journal: tuple[JournalRecord, ...] | None = None


class JournalBlock(_Model):
    """Records ``first`` to ``last`` of one incarnation of a manifest object, written once
    at a key derived from exactly those (``layout.TaskLayout.journal_block``)."""

    schema_version: int = 1
    object_key: str
    journal_id: str
    first: int
    last: int
    records: tuple[JournalRecord, ...]


class DroppedRange(_Model):
    """Records ``first`` to ``last`` of one incarnation of a manifest object that journal
    retention dropped: how many, the newest one's store time, and when the last trim ran."""

    journal_id: str
    first: int
    last: int
    records: int
    newest_at: datetime | None = None
    trimmed_at: datetime


class LostRange(_Model):
    """Records ``first`` to ``last`` of one incarnation of a manifest object that were lost
    with a damaged or deleted journal block, as ``repair`` found them: where the damaged
    block's bytes were copied (None: it was gone), what was wrong, and when."""

    journal_id: str
    first: int
    last: int
    problem: str
    moved_to: str | None = None
    found_at: datetime


class RetentionMarker(_Model):
    """What journal retention dropped of one manifest object, written by the trimmer before
    it deletes a block, so no reader can take a trimmed journal for a complete one; and
    what ``repair`` found lost with a damaged block (``lost``), for the same reason."""

    schema_version: int = 1
    object_key: str
    dropped: tuple[DroppedRange, ...] = ()
    lost: tuple[LostRange, ...] = ()
    commit_id: str = ""


class Entry(_Model):
    """One file of the task: its stage, state, holder, lease, checksum and dependencies."""

    file_id: str
    stage: str
    state: State = State.pending
    owner: str | None = None
    epoch: int = 0
    lease_expires_at: datetime | None = None
    checksum: str | None = None
    size: int | None = None
    retry_count: int = 0
    depends_on: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    consumed_by: tuple[str, ...] = ()
    error: str | None = None
    key: str | None = None
    declared_at: datetime | None = None
    updated_at: datetime | None = None
    part_size: int | None = None
    """Set for a chunked entry: the size of every part but the last."""
    parts_key: str | None = None
    """Set for a chunked entry: the small object that lists its parts and their digests
    (kept out of the shard, which every agent of the stage rewrites)."""
    whole_checksum: str | None = None
    """Set for a chunked entry (from 0.3.0 on): the xxh3-128 of all its bytes in order, as
    ``xxhsum -H2`` prints it for the downloaded file (``checksum`` is the composite of the
    part digests). Verified on download together with every part."""
    data_removed_at: datetime | None = None
    """Set (by gc's ``drop-data`` command) on a consumed entry whose data was removed after
    its retention: reading it again raises ``DataRemoved``."""
    retry_at: datetime | None = None
    """Set on a failed entry of a task with a retry backoff: it may be claimed again only
    from this store time on."""
    claimed_at: datetime | None = None
    """When its current holder claimed it (store time); kept by renewals."""
    ready_at: datetime | None = None
    """When it last became ready (store time): a stage's deadline for being consumed counts
    from here."""

    @property
    def is_chunked(self) -> bool:
        """Its data is a multipart object, verified part by part."""
        return self.part_size is not None and self.parts_key is not None

    @property
    def is_queue(self) -> bool:
        """No named consumers: the first agent to consume it takes it."""
        return not self.consumers


# -- archiving ------------------------------------------------------------------------------


class Archived(_Model):
    """What a shard keeps of an entry it archived: enough for dependency checks and
    re-declarations to stay one read (its terminal state, a digest of its declaration) and
    the archive object that holds the whole entry."""

    state: State
    archive: str
    declared: str
    data_removed_at: datetime | None = None
    """When gc removed the data of this consumed entry (its archive object, written once,
    still says where the data was)."""


def declaration_digest(stage: str, depends_on: Iterable[str], consumers: Iterable[str]) -> str:
    """A short digest of what a declaration says, so an archived id declared again is
    compared without reading its archive object."""
    text = json.dumps([stage, sorted(depends_on), sorted(consumers)], separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class ArchiveObject(_Model):
    """``archive/SHARD/ARCHIVE_ID.json``: entries moved out of a live shard, written once
    before the shard commit that names it. Only the entries the shard's ``archived`` map
    points here are archived; the others (changed before that commit landed) are not."""

    schema_version: int = 1
    task_id: str
    shard: str
    archive_id: str
    created_at: datetime
    entries: dict[str, Entry]


class ArchiveReport(BaseModel):
    """What one ``archive()`` moved: file ids per stage, the archive objects it wrote and
    those left by an archiver that died before its shard commit, which it committed."""

    model_config = ConfigDict(frozen=True)

    archived: dict[str, list[str]] = Field(default_factory=dict)
    objects: list[str] = Field(default_factory=list)
    adopted: list[str] = Field(default_factory=list)


class Shard(Journaled):
    """All live entries of one stage, stored as ``shards/STAGE.json``; ``archived`` lists
    the ids archived out of it (None until the first archive, so it costs nothing before)."""

    task_id: str
    stage: str
    creation_id: str | None = None
    """The ``creation_id`` of the task whose shard this is (its header's): a process that
    opened a task since deleted and created again under its id finds another here, and is
    refused rather than change the new task (a claim of the old one finishing an entry of
    the new). None in a shard made before shards carried it, or for a task without one."""
    entries: dict[str, Entry] = Field(default_factory=dict)
    archived: dict[str, Archived] | None = None

    def with_entries(self, changed: dict[str, Entry]) -> Shard:
        """This shard with ``changed`` put in (replacing an entry of its id, else last);
        what it changed is remembered for ``entries_changed``."""
        entries = {**self.entries, **changed}
        _made.last = (self.entries, entries, tuple(changed))
        return self.replaced(entries=entries)


class _Made(threading.local):
    last: tuple[dict[str, Entry], dict[str, Entry], tuple[str, ...]] | None = None
    """The entries the last ``with_entries`` of this thread started from and made, and
    the ids it set."""


_made = _Made()


def entries_changed(old: dict[str, Entry], new: dict[str, Entry]) -> tuple[str, ...] | None:
    """The ids ``Shard.with_entries`` set when it made ``new`` from ``old``, if that was the
    last it did in this thread (None otherwise): ``new`` holds ``old``'s ids in order, those
    it added after them, and only these ids can hold another entry. So a commit's encoding
    and transitions look at what the command changed, not at every entry of the shard."""
    last = _made.last
    if last is None or last[0] is not old or last[1] is not new:
        return None
    return last[2]


class TaskHeader(_Model):
    """``task.json``: written once at create, read by everyone who opens the task."""

    schema_version: int = SCHEMA_VERSION
    task_id: str
    stages: tuple[str, ...]
    lease_seconds: float
    max_retries: int
    created_at: datetime
    creation_id: str = ""
    requires: str | None = None
    """The oldest objmanifest release that can work on the task (from schema 2 on), so an
    older one can say which to install."""
    journal_keep_seconds: float | None = None
    """Journal retention: records older than this (store time) may be dropped by a trim."""
    journal_keep_versions: int | None = None
    """Journal retention: only this many newest records of an object need be kept."""
    deleting_at: datetime | None = None
    """Set by ``task.delete()`` before it removes anything: the task is being deleted, and
    opening it is refused until ``delete`` runs again to finish."""
    layout: str | None = None
    """``"task"``: every entry in one shard (the baseline to compare against); None: one
    shard per stage, or ``partitions`` of it."""
    spread: bool | None = None
    """Each partition's shard and data under key prefixes of their own (header schema 4)."""
    partitions: dict[str, int] | None = None
    """Stages split into this many hash partitions, each a shard of its own (from header
    schema 3 on). Fixed for the life of the task."""
    retry_backoff: float | None = None
    """Seconds a failed entry waits before it may be claimed again, doubling per retry up
    to ``retry_backoff_max`` (from header schema 3 on); None: no wait."""
    retry_backoff_max: float | None = None
    """The longest retry backoff; None: 64 times ``retry_backoff``."""
    deadlines: dict[str, float] | None = None
    """Per stage, seconds an entry may stay writing (from its claim) or ready without being
    consumed (from ``ready_at``) before ``status`` lists it as late (header schema 3)."""

    @property
    def backoff_cap(self) -> float:
        """The longest backoff a retry waits, in seconds (0 without backoff)."""
        base = self.retry_backoff or 0.0
        if self.retry_backoff_max is not None:
            return self.retry_backoff_max
        return base * BACKOFF_CAP_FACTOR

    @property
    def objects_schema(self) -> int:
        """The schema of the task's manifest objects (the header may be newer)."""
        return min(self.schema_version, SCHEMA_VERSION)

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str | None) -> str | None:
        if v not in (None, "task"):
            raise InvalidInput(
                f"unknown layout {v!r}: use 'task' (one shard for the whole task) or leave it "
                "out (one shard per stage, split by partitions=)"
            )
        return v

    @field_validator("partitions", mode="before")
    @classmethod
    def _partition_counts(cls, v: Any) -> Any:
        for stage, count in (v or {}).items() if isinstance(v, dict) else ():
            if isinstance(count, bool) or not isinstance(count, int):
                raise InvalidInput(
                    f"the partition count of {stage!r} must be a whole number, not {count!r}"
                )
        return v

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, v: dict[str, int] | None, info: ValidationInfo) -> dict[str, int] | None:
        if v is None:
            return None
        stages = info.data.get("stages") or ()
        spread = bool(info.data.get("spread"))
        most = MAX_SPREAD_PARTITIONS if spread else MAX_PARTITIONS
        for stage, count in v.items():
            if stage not in stages:
                raise InvalidInput(
                    f"partitions name {stage!r}, which is not a stage of the task "
                    f"(its stages are {', '.join(stages)})"
                )
            if not 1 <= count <= most:
                beyond = (
                    ""
                    if spread or count < 1 or count > MAX_SPREAD_PARTITIONS
                    else f" (up to {MAX_SPREAD_PARTITIONS} in a spread task)"
                )
                raise InvalidInput(
                    f"stage {stage!r} cannot have {count} partitions: use 1 to {most}{beyond}"
                )
        if info.data.get("layout") == "task" and any(n > 1 for n in v.values()):
            raise InvalidInput(
                "a task with layout='task' keeps every entry in one shard, so it cannot also "
                "split stages into partitions: choose one"
            )
        return {stage: n for stage, n in v.items() if n > 1} or None

    @model_validator(mode="after")
    def _spread_schema(self) -> TaskHeader:
        """A spread header below schema 4 would be read with flat keys by 0.3.0: refused."""
        if self.spread and self.schema_version < SPREAD_SCHEMA:
            raise InvalidInput(
                f"a spread task's header is at schema {SPREAD_SCHEMA} or later, not "
                f"{self.schema_version}"
            )
        return self

    @field_validator("stages")
    @classmethod
    def _stages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            check_name("stage", s)
        if not v:
            raise InvalidInput("a task needs at least one stage")
        if len(set(v)) != len(v):
            raise InvalidInput(f"stages must be distinct: {list(v)}")
        return v


class Declaration(BaseModel):
    """What ``declare`` states about a file: where it belongs and what it waits for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file_id: str
    stage: str
    depends_on: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()

    @field_validator("file_id")
    @classmethod
    def _file_id(cls, v: str) -> str:
        return check_file_id(v)

    @field_validator("depends_on", "consumers", mode="before")
    @classmethod
    def _not_a_string(cls, v: Any, info: ValidationInfo) -> Any:
        """A lone string would be read as its characters: refuse it, ask for a list."""
        if isinstance(v, (str, bytes)):
            raise InvalidInput(f"{info.field_name} must be a list of strings, not the string {v!r}")
        if isinstance(v, dict):
            raise InvalidInput(f"{info.field_name} must be a list of strings, not a dict: {v!r}")
        return v

    @field_validator("depends_on")
    @classmethod
    def _deps(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted({check_file_id(d) for d in v}))

    @field_validator("consumers", mode="before")
    @classmethod
    def _roles(cls, v: Any) -> Any:
        """Each role is checked like an agent name, before pydantic's own type check."""
        if isinstance(v, (list, tuple, set, frozenset)):
            for role in v:
                check_agent("consumer role", role)
        return v

    @field_validator("consumers")
    @classmethod
    def _consumers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(v)))

    @classmethod
    def of(cls, value: Declaration | dict[str, Any] | tuple[Any, ...]) -> Declaration:
        """Accept a Declaration, a dict of its fields, or a (file_id, stage, ...) tuple."""
        if isinstance(value, Declaration):
            return value
        if isinstance(value, dict):
            fields = value
        elif not isinstance(value, (tuple, list)):
            raise InvalidInput(
                f"a declaration is a Declaration, a dict or a (file_id, stage, ...) tuple, not "
                f"{type(value).__name__} {value!r}"
            )
        else:
            fields = dict(zip(("file_id", "stage", "depends_on", "consumers"), value, strict=False))
        return validated(cls, f"declaration {value!r}", **fields)


@dataclass(frozen=True)
class Stored:
    """Where a holder's bytes landed and what they were (chunked: its part size and the
    object that lists its parts)."""

    key: str
    checksum: str
    size: int
    part_size: int | None = None
    parts_key: str | None = None
    whole_checksum: str | None = None


@dataclass(frozen=True)
class Claim:
    """Proof that an agent holds an entry: the epoch is its fencing token.

    ``shard`` names the shard the entry lives in (the stage's own shard unless the stage is
    split); every change the holder makes goes there.
    """

    task_id: str
    file_id: str
    stage: str
    agent: str
    epoch: int
    lease_expires_at: datetime
    shard: str = ""

    def __post_init__(self) -> None:
        if not self.shard:
            object.__setattr__(self, "shard", self.stage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "file_id": self.file_id,
            "stage": self.stage,
            "agent": self.agent,
            "epoch": self.epoch,
            "lease_expires_at": self.lease_expires_at.isoformat(),
        }
