"""A task's status and waiting on it: every shard read once, damaged objects named rather
than failing the read, why a stage has nothing claimable, and polling until entries are
ready."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

import shard_index

from ..core import changes, commands, contention, leases, states
from ..core.ages import check_age
from ..core.model import Entry, Shard
from ..core.pacing import Pace
from ..core.report import DamageNote, EntryNote, IndexNote, TaskStatus
from ..core.states import State
from ..core.waiting import WaitPlan, some_ids
from ..data.chunked.rebuild import needs_parts
from ..errors import (
    CorruptShard,
    DeadWaitedFor,
    NotFound,
    UnsupportedSchema,
)
from ..journal.retention import MarkerCodec
from ..ops.gc import Collector, GcReport
from ..store import list_keys
from ..store.errors import NoSuchObject
from . import reads
from .attention import attention, timing
from .manifest import PARALLEL_READS, Manifest


def sound_shards(m: Manifest, damaged: list[DamageNote]) -> dict[str, Shard]:
    """Every shard of the task read fresh; a corrupt one is noted in ``damaged`` and reads
    as empty (a newer schema is still refused: ``UnsupportedSchema``)."""

    def read(name: str) -> Shard | CorruptShard:
        try:
            return m.read_shard(name)
        except CorruptShard as e:
            return e

    names = m.layout.all_shards(m.stages)
    with m.store.runtime.pool(min(len(names), PARALLEL_READS), "read-shards") as pool:
        got = dict(zip(names, pool.map(read, names), strict=True))
    docs: dict[str, Shard] = {}
    for name, doc in got.items():
        if isinstance(doc, CorruptShard):
            damaged.append(m.damage(m.layout.shard(name), "shard", doc.detail))
            doc = m.codec(name).empty()
        docs[name] = doc
    return docs


def parts_damage(m: Manifest, entries: Iterable[Entry]) -> list[DamageNote]:
    """The upload states that ready (and consumed) chunked entries need and that are
    missing or do not decode. One listing finds those missing; a state is read (once for
    each entry and checksum: a ready entry's part list never changes) to find it sound."""
    wanted = [e for e in entries if needs_parts(e)]
    if not wanted:
        return []
    present = set(list_keys(m.store, m.layout.uploads_prefix))

    def problem(entry: Entry) -> str | None:
        key = entry.parts_key
        assert key is not None
        if key not in present:
            return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
        if (key, entry.checksum) in m.sound_parts:
            return None
        codec = m.upload_codec(key)
        try:
            blob = m.store.get(key)
            assert blob is not None and codec is not None
            codec.decode(key, blob.body)
        except NoSuchObject:
            return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
        except CorruptShard as e:
            return e.detail
        except UnsupportedSchema:
            return None  # a newer release's: not damage
        m.sound_parts.add((key, entry.checksum))
        return None

    with m.store.runtime.pool(min(len(wanted), PARALLEL_READS), "read-parts") as pool:
        problems = list(pool.map(problem, wanted))
    return [
        m.damage(e.parts_key or "", "upload state", p)
        for e, p in zip(wanted, problems, strict=True)
        if p is not None
    ]


def unclaimable(m: Manifest, stage: str) -> str:
    """Why no entry of ``stage`` is claimable now, in words."""
    entries = list(reads.shard(m, stage).entries.values())
    if not entries:
        return "it has no entries: declare some first"
    now = m.store.now()
    waiting = sorted(
        (e.retry_at, e.file_id)
        for e in entries
        if leases.backing_off(e, now) and e.retry_at is not None
    )
    rest = "taken, done, or waiting for dependencies (see `objmanifest status`)"
    if not waiting:
        return f"all are {rest}"
    n = len(waiting)
    first_at, first = waiting[0]
    return (
        f"{n} failed entr{'y waits' if n == 1 else 'ies wait'} out a retry backoff "
        f"({first!r} is claimable again at {first_at.isoformat()}); the others are {rest}"
    )


def marker_damage(m: Manifest) -> list[DamageNote]:
    """The retention markers of the shards and the index that do not decode (every reader
    of their journal stops at one): a conditional GET each."""
    keys = [m.layout.shard(n) for n in m.shard_names()]
    keys.append(m.layout.index)

    def problem(key: str) -> DamageNote | None:
        marker = m.layout.journal_retention(key)
        try:
            m.docs.read(marker, MarkerCodec(key))
        except CorruptShard as e:
            return m.damage(marker, "retention marker", e.detail)
        except UnsupportedSchema:
            return None  # a newer release's: not damage
        return None

    with m.store.runtime.pool(min(len(keys), PARALLEL_READS), "read-markers") as pool:
        return [n for n in pool.map(problem, keys) if n is not None]


def archive_damage(m: Manifest, docs: dict[str, Shard]) -> list[DamageNote]:
    """The archive objects the shards' ``archived`` maps name that do not read back (each
    read once by this process: written once, they never change)."""
    named = sorted(
        {(name, ref.archive) for name, doc in docs.items() for ref in (doc.archived or {}).values()}
    )
    if not named:
        return []

    def problem(pair: tuple[str, str]) -> DamageNote | None:
        shard, archive_id = pair
        key = m.layout.archive_object(shard, archive_id)
        try:
            m.archives.read(shard, archive_id)
        except CorruptShard as e:
            return m.damage(key, "archive object", e.detail)
        except NotFound:
            return m.damage(key, "archive object", "it does not exist")
        return None

    with m.store.runtime.pool(min(len(named), PARALLEL_READS), "read-archives") as pool:
        return [n for n in pool.map(problem, named) if n is not None]


def status(m: Manifest) -> TaskStatus:
    """Every shard read once (damage named, not raised), then the index and the upload
    states ready chunked entries need."""
    damaged: list[DamageNote] = []
    docs = sound_shards(m, damaged)
    index: shard_index.ShardIndex | None
    try:
        index = m.index()  # after the shards: see declare_many
    except CorruptShard as e:
        damaged.append(m.damage(m.layout.index, "index", e.detail))
        index = None
    if index is not None:
        noted = {n.key for n in damaged}
        for name, doc in docs.items():
            lost = reads.lost_shard(m, name, doc, index)
            if lost is not None and lost.key not in noted:
                damaged.append(m.damage(lost.key, "shard", lost.detail))
    shards = {s: reads.view(m, s, docs, lambda: index) for s in m.stages}
    everything = {fid: e for sh in shards.values() for fid, e in sh.entries.items()}
    for sh in shards.values():  # archiving: archived entries count in their state
        for fid, ref in (sh.archived or {}).items():
            everything.setdefault(fid, changes.archived_stub(fid, sh.stage, ref))
    now = m.store.now()
    counts: dict[str, dict[str, int]] = {}
    archived: dict[str, int] = {}
    notes: dict[str, list[EntryNote]] = {
        "blocked": [],
        "overdue": [],
        "dead": [],
        "late": [],
        "backing_off": [],
    }
    deadlines = m.header.deadlines or {}
    unindexed: list[IndexNote] = []
    for stage, shard in shards.items():
        counts[stage] = {s.value: 0 for s in State}
        archived[stage] = len(shard.archived or {})
        for ref in (shard.archived or {}).values():
            counts[stage][ref.state.value] += 1
        for entry in shard.entries.values():
            counts[stage][entry.state.value] += 1
            found = [attention(entry, now, everything.get)]
            found.append(timing(entry, now, deadlines.get(entry.stage)))
            for kind, reason in filter(None, found):
                notes[kind].append(
                    EntryNote(file_id=entry.file_id, stage=stage, state=entry.state, reason=reason)
                )
            indexed = index.stage_of(entry.file_id) if index is not None else stage
            if indexed != stage:
                where = "not in the index" if indexed is None else f"indexed in {indexed}"
                unindexed.append(
                    IndexNote(
                        file_id=entry.file_id,
                        stage=stage,
                        reason=f"in this stage's shard but {where} (damaged): run "
                        "`objmanifest repair`",
                    )
                )
    broken = {n.key for n in damaged if n.kind == "shard"}

    def why(stage: str, file_id: str) -> str:
        key = m.layout.shard(m.layout.shard_of(stage, file_id))
        if key in broken:
            return f"its shard {key} is damaged: run `objmanifest repair`"
        return "declared, not yet in its shard: rerun the declare"

    unfinished = [
        IndexNote(file_id=file_id, stage=stage, reason=why(stage, file_id))
        for file_id in sorted(index.file_ids() if index is not None else ())
        if index is not None
        and (stage := index.stage_of(file_id) or "") in shards
        and file_id not in shards[stage].entries
        and file_id not in (shards[stage].archived or {})
    ]
    collisions = stage_contention(m, docs, now)
    return TaskStatus(
        task_id=m.task_id,
        store_time=now,
        stages=counts,
        unfinished=unfinished,
        unindexed=unindexed,
        archived=archived,
        damaged=[
            *damaged,
            *parts_damage(m, everything.values()),
            *marker_damage(m),
            *archive_damage(m, docs),
        ],
        contention={
            s: round(c.per_commit, 3)
            for s, c in collisions.items()
            if c.commits >= contention.MIN_COMMITS
        },
        contended=[s for s, c in collisions.items() if c.contended],
        **notes,
    )


def stage_contention(
    m: Manifest, docs: Mapping[str, Shard], now: datetime
) -> dict[str, contention.Contention]:
    """Per stage, its recent commits and the races they lost, from the records its shards
    carry (the task's one shard counts for every stage)."""
    found: dict[str, contention.Contention] = {}
    for name, doc in docs.items():
        seen = contention.of_records(doc.journal or (), now)
        stage = m.layout.stage_of_shard(name)
        for s in (stage,) if stage is not None else m.stages:
            found[s] = found.get(s, contention.Contention()) + seen
    return {s: found[s] for s in m.stages if s in found}


def wait(
    m: Manifest,
    stages: Iterable[str] | None = None,
    until: str = "ready",
    timeout: float | None = None,
    *,
    on_wait: Callable[[list[str]], None] | None = None,
) -> dict[str, State]:
    """Look, then sleep as the plan says, until nothing is outstanding or the timeout."""
    plan = WaitPlan.of(m.stages, m.check_stage, stages, until, timeout)
    runtime = m.store.runtime
    start = runtime.monotonic()
    pace, seen = Pace(), None
    while True:
        found, waiting = look(m, plan)
        if not waiting:
            return found
        remaining = math.inf if timeout is None else start + timeout - runtime.monotonic()
        if remaining <= 0:
            raise plan.timed_out(waiting)
        if on_wait is not None:
            on_wait(waiting)
            on_wait = None
        runtime.sleep(min(plan.pause(pace, found, seen, waiting), remaining))
        seen = found


def outstanding(
    m: Manifest, stages: Iterable[str] | None, until: str
) -> tuple[dict[str, State], list[str]]:
    """One look, the arguments checked as ``wait`` checks them."""
    return look(m, WaitPlan.of(m.stages, m.check_stage, stages, until, None))


def look(m: Manifest, plan: WaitPlan) -> tuple[dict[str, State], list[str]]:
    """One look at the stages of ``plan``: every entry's state, and the ids not there yet;
    ``DeadWaitedFor`` if one of them is dead."""
    found: dict[str, State] = {}
    for stage in plan.stages:
        shard = reads.shard(m, stage)
        found.update({fid: ref.state for fid, ref in (shard.archived or {}).items()})
        found.update({fid: e.state for fid, e in shard.entries.items()})
    waiting, dead = states.outstanding(found, plan.until)
    if dead:
        raise DeadWaitedFor(
            f"{some_ids(dead)} of {', '.join(plan.stages)} {'is' if len(dead) == 1 else 'are'} "
            f"dead, so waiting for them to be {plan.until} would never end: revive "
            "(`objmanifest revive`) or undeclare them, or stop waiting for them",
            tuple(dead),
        )
    return found, waiting


def reap(m: Manifest) -> list[Entry]:
    """One ``Reap`` commit per shard."""
    released: list[Entry] = []
    for shard in m.layout.all_shards(m.stages):
        released += m.docs.commit(m.layout.shard(shard), m.codec(shard), commands.Reap(m.rules))
    return released


def gc(m: Manifest, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
    """The collector run over this task (see ``ops.gc``)."""
    if consumed_older_than is not None:
        consumed_older_than = check_age("consumed_older_than", consumed_older_than)
    collector = Collector(
        m.store,
        m.docs,
        m.layout,
        m.stages,
        m.uploads,
        m.codec,
        m.store.now,
        m.archives,
    )
    return collector.run(dry_run, consumed_older_than)
