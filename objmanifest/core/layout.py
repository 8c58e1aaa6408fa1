"""Where every object of a task lives: the one module that builds and parses keys.

Under the store's prefix::

    TASK_ID/task.json                      header, written once
    TASK_ID/index.json                     cross-shard dependency index
    TASK_ID/shards/SHARD.json              a shard: STAGE (the stage's own), STAGE~NN
                                           (partition NN of a split stage, chosen by a
                                           hash of the file id), or _task (the one shard
                                           of a task with layout "task")
    TASK_ID/shards/STAGE~NN/shard.json     a partition's shard in a spread task
    TASK_ID/data/STAGE/FILE_ID@EPOCH       an entry's bytes, written once per holder
    TASK_ID/data/STAGE/FILE_ID@EPOCH~X     the same holder's other bytes, or a later upload
    TASK_ID/data/STAGE~NN/FILE_ID@EPOCH    the same, of an entry of partition NN of a split
                                           stage in a spread task
    TASK_ID/uploads/STAGE/FILE_ID.json     a chunked entry's upload state
    TASK_ID/journal/OBJECT/JID/FIRST-LAST.json
                                           journal records FIRST..LAST of one manifest
                                           object (OBJECT is its key without ".json",
                                           e.g. shards/collect), incarnation JID; written
                                           once
    TASK_ID/journal/OBJECT/retention.json  what journal retention dropped of OBJECT
    TASK_ID/archive/SHARD/ARCHIVE_ID.json  entries archived out of one shard by one
                                           archive commit; written once, before the shard
                                           commit that names ARCHIVE_ID
    TASK_ID/damaged/OBJECT@TIME            a corrupt manifest object's bytes, copied aside
                                           by a repair before it was replaced (OBJECT is
                                           its key within the task, TIME the store's time);
                                           written once, never deleted by objmanifest

A **spread** task (header schema 4) keeps each partition of a split stage under key
prefixes of its own: its shard in ``shards/STAGE~NN/``, its entries' data in
``data/STAGE~NN/``. S3 serves a rate of requests per key prefix (the key up to its last
``/``: 3,500 writes and 5,500 reads a second), so the shards of a task, or the data of a
stage, under one prefix would cap a stage at what one prefix serves, however many
partitions it had. Spread, a stage's requests go to as many prefixes as it has partitions.
Tasks made before keep their flat keys, and are read as they are.

Nobody else writes a key as a string or takes one apart, nor routes a file id to its
shard: callers ask ``shard_of``/``shards_of`` and pass shard names around (``claim.shard``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import xxhash

from ..errors import InvalidInput
from .model import MAX_PARTITIONS, MAX_SPREAD_PARTITIONS, TASK_SHARD, TaskHeader
from .names import check_file_id, check_name

HEADER = "task.json"
INDEX = "index.json"
SHARDS = "shards/"
DATA = "data/"
UPLOADS = "uploads/"
JOURNAL = "journal/"
ARCHIVE = "archive/"
RETENTION = "retention.json"
DAMAGED = "damaged/"
SPREAD_SHARD = "shard.json"
"""The name of a partition's shard object within its own prefix, in a spread task."""

Kind = Literal[
    "header", "index", "shard", "data", "upload", "journal", "archive", "damaged", "other"
]


@dataclass(frozen=True)
class Parsed:
    """What a key of a task is: its kind, and the stage, shard, file id and epoch it names
    (those that apply)."""

    kind: Kind
    task_id: str
    stage: str | None = None
    shard: str | None = None
    file_id: str | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class BlockRef:
    """A journal block's key taken apart: whose records (the manifest object's key), which
    incarnation of it, and the versions it covers."""

    object_key: str
    journal_id: str
    first: int
    last: int


_VERSION_DIGITS = 12
SPREAD_FROM = 64
"""A task with a stage of this many partitions or more is spread unless told otherwise:
its shards' writes and reads (conflicts answered included) could otherwise pass what one
S3 prefix serves (3,500 writes a second), each shard taking up to 15."""
AUTO = "auto"
"""A stage's partition count chosen from the number of agents expected (``auto_partitions``)."""
AUTO_PER_AGENT = 2
PARTITION = "~"
"""Between a stage and its partition number in a shard name (never in a stage name)."""


def auto_partitions(agents: int, most: int) -> int:
    """The partitions of a stage for ``agents`` expected agents: about ``AUTO_PER_AGENT``
    each (a power of two), at most ``most``. A shard yields half its object's rate of
    conditional writes (two per entry) and an agent makes about one entry per three round
    trips, on every cloud about the same ratio: with two partitions per agent, agents that
    lose a race find a partition of their own within a few claims."""
    want = max(1, AUTO_PER_AGENT * agents)
    return min(most, 1 << (want - 1).bit_length())


def resolve_partitions(
    partitions: Mapping[str, int | str] | None, agents: int | None, spread: bool | None
) -> dict[str, int] | None:
    """The partition counts, ``"auto"`` ones chosen from ``agents`` (about two per agent, a
    power of two; up to the spread task's cap unless ``spread=False``)."""
    if partitions is None:
        return None
    if agents is not None and (
        isinstance(agents, bool) or not isinstance(agents, int) or agents < 1
    ):
        raise InvalidInput(f"agents must be a whole number of at least 1, not {agents!r}")
    counts: dict[str, int] = {}
    for stage, count in partitions.items():
        if isinstance(count, str) and count == AUTO:
            if agents is None:
                raise InvalidInput(
                    f"partitions of {stage!r} are 'auto': say how many agents you expect "
                    "(agents=N, --agents N), so the count can be chosen from it"
                )
            most = MAX_PARTITIONS if spread is False else MAX_SPREAD_PARTITIONS
            counts[stage] = auto_partitions(agents, most)
        elif isinstance(count, str):
            raise InvalidInput(
                f"the partition count of {stage!r} must be a whole number or 'auto', not {count!r}"
            )
        else:
            counts[stage] = count
    return counts


def spread_by_default(partitions: Mapping[str, int]) -> bool:
    """Whether a task of these partitions is spread unless told otherwise (``SPREAD_FROM``)."""
    return any(n >= SPREAD_FROM for n in partitions.values())


def partition_of(file_id: str, count: int) -> int:
    """Which of ``count`` partitions ``file_id`` lives in: a stable hash (xxh3-64 of its
    UTF-8 bytes), the same on every machine and release."""
    return xxhash.xxh3_64_intdigest(file_id.encode("utf-8", "surrogatepass")) % count


def _partition_name(stage: str, n: int, count: int) -> str:
    return f"{stage}{PARTITION}{n:0{len(str(count - 1))}d}"


@functools.lru_cache(maxsize=64)
def _partition_names(stage: str, count: int) -> tuple[str, ...]:
    """The names of ``stage``'s ``count`` partitions, made once per process."""
    return tuple(_partition_name(stage, n, count) for n in range(count))


@dataclass(frozen=True)
class TaskLayout:
    """The keys of one task, relative to the store's prefix, and which shard holds what.

    ``partitions`` (stage -> count), ``single`` (one shard for the task) and ``spread``
    (each partition under prefixes of its own) come from the task header (``of``); a layout
    made from a task id alone knows the default only, which is enough for the header and
    the prefixes."""

    task_id: str
    partitions: Mapping[str, int] = field(default_factory=dict)
    single: bool = False
    spread: bool = False

    def __post_init__(self) -> None:
        check_name("task id", self.task_id)

    @classmethod
    def of(cls, header: TaskHeader) -> TaskLayout:
        return cls(
            header.task_id,
            dict(header.partitions or {}),
            header.layout == "task",
            bool(header.spread),
        )

    @property
    def root(self) -> str:
        return f"{self.task_id}/"

    # -- manifest objects -----------------------------------------------------------------

    @property
    def header(self) -> str:
        return f"{self.task_id}/{HEADER}"

    @property
    def index(self) -> str:
        return f"{self.task_id}/{INDEX}"

    def shard_of(self, stage: str, file_id: str) -> str:
        """The shard the entry ``file_id`` of ``stage`` lives in (its name)."""
        if self.single:
            return TASK_SHARD
        count = self.partitions.get(stage, 1)
        if count == 1:
            return stage
        return self._partition(stage, partition_of(file_id, count), count)

    def shards_of(self, stage: str) -> list[str]:
        """Every shard that holds entries of ``stage`` (in partition order)."""
        return list(self.stage_shards(stage))

    def stage_shards(self, stage: str) -> tuple[str, ...]:
        """``shards_of`` as a tuple every layout of the same partitions shares (no copy: a
        claim by stage asks for it every time, and a process may hold thousands of tasks of
        thousands of partitions)."""
        if self.single:
            return (TASK_SHARD,)
        count = self.partitions.get(stage, 1)
        if count == 1:
            return (stage,)
        return _partition_names(stage, count)

    def partition_number(self, stage: str, shard: str) -> int | None:
        """Which of ``stage``'s ``stage_shards`` ``shard`` is (its place in them), without
        searching them; None if it is none of them."""
        if self.single:
            return 0 if shard == TASK_SHARD else None
        if self.partitions.get(stage, 1) == 1:
            return 0 if shard == stage else None
        if not self.is_shard(shard, (stage,)):
            return None
        return int(shard.rpartition(PARTITION)[2])

    def is_shard(self, shard: str, stages: tuple[str, ...]) -> bool:
        """Whether ``shard`` is the name of a shard of a task of ``stages`` (without
        listing them: a stage may have thousands)."""
        if self.single:
            return shard == TASK_SHARD
        stage, split, number = shard.partition(PARTITION)
        if stage not in stages:
            return False
        count = self.partitions.get(stage, 1)
        if count == 1 or not split:
            return count == 1 and not split
        return (
            number.isdigit()
            and int(number) < count
            and self._partition(stage, int(number), count) == shard
        )

    def all_shards(self, stages: tuple[str, ...]) -> list[str]:
        """Every shard of a task of ``stages``, each once."""
        return list(dict.fromkeys(s for stage in stages for s in self.shards_of(stage)))

    @staticmethod
    def _partition(stage: str, n: int, count: int) -> str:
        return _partition_name(stage, n, count)

    def stage_of_shard(self, shard: str) -> str | None:
        """The stage whose entries ``shard`` holds; None for the task's one shard."""
        if shard == TASK_SHARD:
            return None
        return shard.partition(PARTITION)[0]

    def shard(self, shard: str) -> str:
        if self.spread and PARTITION in shard:
            return f"{self.task_id}/{SHARDS}{shard}/{SPREAD_SHARD}"
        return f"{self.task_id}/{SHARDS}{shard}.json"

    def _spread(self, stage: str) -> bool:
        """Whether ``stage``'s partitions keep their objects under prefixes of their own."""
        return self.spread and not self.single and self.partitions.get(stage, 1) > 1

    def upload_state(self, stage: str, file_id: str) -> str:
        return f"{self.task_id}/{UPLOADS}{stage}/{file_id}.json"

    @property
    def uploads_prefix(self) -> str:
        return f"{self.task_id}/{UPLOADS}"

    @property
    def journal_prefix(self) -> str:
        return f"{self.task_id}/{JOURNAL}"

    def journal_of(self, object_key: str) -> str:
        """The prefix of every journal block of the manifest object ``object_key``."""
        rest = object_key[len(self.root) :] if object_key.startswith(self.root) else object_key
        return f"{self.task_id}/{JOURNAL}{rest.removesuffix('.json')}/"

    def journal_block(self, object_key: str, journal_id: str, first: int, last: int) -> str:
        """Where records ``first``..``last`` of ``object_key`` (incarnation ``journal_id``)
        are written once: two writers of the same records pick the same key."""
        return (
            f"{self.journal_of(object_key)}{journal_id}/"
            f"{first:0{_VERSION_DIGITS}d}-{last:0{_VERSION_DIGITS}d}.json"
        )

    def journal_retention(self, object_key: str) -> str:
        """The retention marker of ``object_key``: what a trim dropped of its journal. Not a
        block (its name has no version range), beside the object's incarnations."""
        return f"{self.journal_of(object_key)}{RETENTION}"

    def parse_block(self, key: str) -> BlockRef | None:
        """The block ``key`` names, or None if it is not a journal block of this task."""
        prefix = f"{self.task_id}/{JOURNAL}"
        if not key.startswith(prefix) or not key.endswith(".json"):
            return None
        rest, _, name = key[len(prefix) : -len(".json")].rpartition("/")
        obj, _, journal_id = rest.rpartition("/")
        first, dash, last = name.partition("-")
        if not (obj and journal_id and dash and first.isdigit() and last.isdigit()):
            return None
        return BlockRef(f"{self.task_id}/{obj}.json", journal_id, int(first), int(last))

    def manifest_objects(self, stages: tuple[str, ...]) -> list[str]:
        """The keys of the shards and the index (upload states are found by listing)."""
        return [*(self.shard(s) for s in self.all_shards(stages)), self.index]

    @property
    def archive_prefix(self) -> str:
        return f"{self.task_id}/{ARCHIVE}"

    # -- repair ----------------------------------------------------------------------------

    def damaged(self, object_key: str, at: datetime) -> str:
        """Where a repair copies a corrupt manifest object's bytes before replacing it: one
        key per object and store time (to the microsecond), so no copy overwrites another."""
        rest = object_key[len(self.root) :] if object_key.startswith(self.root) else object_key
        return f"{self.task_id}/{DAMAGED}{rest}@{at.strftime('%Y%m%dT%H%M%S.%fZ')}"

    @property
    def damaged_prefix(self) -> str:
        return f"{self.task_id}/{DAMAGED}"

    def data_of(self, stage: str) -> str:
        """The prefix of every data object of ``stage`` (parse each key with ``parse``):
        of a spread stage, the prefix its partitions' prefixes share."""
        if self._spread(stage):
            return f"{self.task_id}/{DATA}{stage}{PARTITION}"
        return f"{self.task_id}/{DATA}{stage}/"

    def archive_of(self, shard: str) -> str:
        """The prefix of every archive object of ``shard``."""
        return f"{self.task_id}/{ARCHIVE}{shard}/"

    def archive_object(self, shard: str, archive_id: str) -> str:
        """Where one archive commit of ``shard`` writes its entries, once."""
        return f"{self.archive_of(shard)}{archive_id}.json"

    def parse_archive(self, key: str, shard: str) -> str | None:
        """The archive id ``key`` names, or None if it is not an archive object of ``shard``."""
        prefix = self.archive_of(shard)
        if not key.startswith(prefix) or not key.endswith(".json"):
            return None
        archive_id = key[len(prefix) : -len(".json")]
        return archive_id if archive_id and "/" not in archive_id else None

    # -- data ------------------------------------------------------------------------------

    def data(self, stage: str, file_id: str, epoch: int) -> str:
        """Where the holder of ``epoch`` writes: one key per epoch, so holders never share
        (of a spread stage, under the prefix of the entry's partition)."""
        if self._spread(stage):
            return f"{self.task_id}/{DATA}{self.shard_of(stage, file_id)}/{file_id}@{epoch}"
        return f"{self.task_id}/{DATA}{stage}/{file_id}@{epoch}"

    @staticmethod
    def beside(key: str, tag: str) -> str:
        """Another key of the same holder: ``KEY~TAG`` (other bytes, or a later upload)."""
        return f"{key}~{tag}"

    @staticmethod
    def attempt_of(key: str, base: str) -> int | None:
        """Which upload of one epoch ``key`` is: 1 for ``base``, N for ``base~N``; None if it
        is not ``base`` or one of its numbered attempts."""
        if key == base:
            return 1
        if not key.startswith(base + "~"):
            return None
        tag = key[len(base) + 1 :]
        return int(tag) if tag.isdigit() else None

    @property
    def data_prefix(self) -> str:
        return f"{self.task_id}/{DATA}"

    # -- parsing ---------------------------------------------------------------------------

    def parse(self, key: str) -> Parsed:
        """What ``key`` is within this task (``other`` if nothing this module builds)."""
        other = Parsed("other", self.task_id)
        if not key.startswith(self.root):
            return other
        rest = key[len(self.root) :]
        if rest == HEADER:
            return Parsed("header", self.task_id)
        if rest == INDEX:
            return Parsed("index", self.task_id)
        if rest.startswith(SHARDS) and rest.endswith(".json"):
            shard = rest[len(SHARDS) : -len(".json")]
            if self.spread and shard.endswith("/" + SPREAD_SHARD.removesuffix(".json")):
                shard = shard.rpartition("/")[0]
            return Parsed("shard", self.task_id, self.stage_of_shard(shard), shard)
        prefixed: tuple[tuple[str, Kind], ...] = (
            (JOURNAL, "journal"),
            (ARCHIVE, "archive"),
            (DAMAGED, "damaged"),
        )
        for prefix, kind in prefixed:
            if rest.startswith(prefix):
                return Parsed(kind, self.task_id)
        if rest.startswith(UPLOADS) and rest.endswith(".json"):
            stage, _, file_id = rest[len(UPLOADS) : -len(".json")].partition("/")
            if not file_id:
                return other
            return Parsed("upload", self.task_id, stage, self.shard_of(stage, file_id), file_id)
        if rest.startswith(DATA):
            where, _, name = rest[len(DATA) :].partition("/")
            stage, split, _ = where.partition(PARTITION)
            file_id, at, tail = name.rpartition("@")
            epoch = tail.partition("~")[0]
            if not (stage and at and file_id and epoch.isdigit()):
                return other
            shard = self.shard_of(stage, file_id)
            if split and not (self._spread(stage) and shard == where):
                return other  # a partition's prefix this layout would not put it under
            return Parsed("data", self.task_id, stage, shard, file_id, int(epoch))
        return other


def task_of(key: str) -> str | None:
    """The task id a key belongs to (its first segment), if it is a valid one."""
    first, sep, _ = key.partition("/")
    if not sep:
        return None
    try:
        return check_name("task id", first)
    except ValueError:
        return None


__all__ = ["BlockRef", "Parsed", "TaskLayout", "check_file_id", "task_of"]
