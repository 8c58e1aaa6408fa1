"""The task's journal as the engine offers it: history, log (whole, or what was committed
since a reader last looked), lineage, retention and migration to the current schema."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ..cas.codecs import HeaderCodec
from ..cas.policy import Codec
from ..core.model import READERS, SCHEMA_VERSION, Entry, JournalRecord, Shard
from ..core.names import check_file_id
from ..core.settings import check_retention
from ..core.states import State
from ..errors import CorruptShard, NotFound
from ..journal import history as journal_history
from ..journal.history import Dropped, Lineage, Transition, transitions_of
from ..journal.retention import Trimmer
from .commands import Migrate, MigrateHeader
from .manifest import Manifest


def history(m: Manifest, file_id: str, after: dict[str, int] | None = None) -> list[Transition]:
    """The transitions of one entry in its shard; with ``after``, only those committed since."""
    stage = m.stage_of(file_id)
    shard = m.layout.shard_of(stage, file_id)
    key, codec = m.layout.shard(shard), m.codec(shard)
    if after is None:
        return m.journal.history(file_id, key, codec)
    return transitions_of(file_id, m.journal.newer(after, [(key, codec)]))


def objects_of(m: Manifest, stage: str | None) -> list[tuple[str, Codec[Any]]]:
    """The journaled objects whose records may concern ``stage`` (all, for None)."""
    if stage is not None:
        m.check_stage(stage)
    return m.journal.of_stage(m.journaled_objects(), stage)


def log(
    m: Manifest,
    since: datetime | None = None,
    stage: str | None = None,
    agent: str | None = None,
    after: dict[str, int] | None = None,
) -> list[JournalRecord]:
    """The task's records (with ``after``: those committed since), filtered as asked."""
    if after is None:
        if stage is not None:
            m.check_stage(stage)
        return m.journal.log(since=since, stage=stage, agent=agent, stage_of=stage_namer(m))
    objects = objects_of(m, stage)
    records = m.journal.narrowed(m.journal.newer(after, objects), stage, stage_namer(m))
    return [
        r
        for r in records
        if (since is None or r.at >= since) and (agent is None or r.actor == agent)
    ]


def stage_namer(m: Manifest) -> Callable[[str], str | None] | None:
    """What names an entry's stage for the journal's readers: the index, on a task that
    keeps every stage in one shard (read again for an id it does not know yet: one declared
    since); None otherwise (each shard is of one stage)."""
    if not m.layout.single:
        return None
    index = m.index()

    def stage_of(file_id: str) -> str | None:
        nonlocal index
        found = index.stage_of(file_id)
        if found is None:
            index = m.index()
            found = index.stage_of(file_id)
        return found

    return stage_of


def stage_logs(
    m: Manifest,
    shards: Mapping[str, Shard],
    seen: dict[str, tuple[str | None, int]],
    since: datetime | None = None,
    skip_damaged: bool = False,
) -> dict[str, list[JournalRecord]]:
    """Per stage, the records of ``shards`` (as read already) committed since ``seen``."""
    out: dict[str, list[JournalRecord]] = {stage: [] for stage in m.stages}
    index = None
    for name, doc in shards.items():
        try:
            found = _new_records(m, name, doc, seen, since)
        except CorruptShard:  # a damaged journal block: `repair` mends it
            if not skip_damaged:
                raise
            continue
        own = m.layout.stage_of_shard(name)
        if own is not None:
            out[own] += found
            continue
        if not found:
            continue
        if index is None:
            try:
                index = m.index(cached=True)
            except CorruptShard:  # status names it under damage
                if not skip_damaged:
                    raise
                continue
        for record in found:
            for stage in m.stages:
                mine = tuple(c for c in record.transitions if index.stage_of(c.item) == stage)
                if mine:
                    out[stage].append(record.model_copy(update={"transitions": mine}))
    return out


def _new_records(
    m: Manifest,
    name: str,
    doc: Shard,
    seen: dict[str, tuple[str | None, int]],
    since: datetime | None,
) -> list[JournalRecord]:
    """The records of shard ``name`` (``doc``: as read already) newer than ``seen`` says,
    oldest first: those ``doc`` carries, or, when it no longer carries all of them (the
    first look, a new incarnation, records moved to blocks in between), also the blocks
    after the last version seen, and no older one."""
    key, codec = m.layout.shard(name), m.codec(name)
    journal = codec.journal(doc)
    if journal is None:
        return []  # a task at schema 1 keeps no journal
    journal_id, live = journal
    last = seen.get(name)
    if not live:
        return []
    newest = live[-1].version
    if last is not None and last[0] == journal_id and live[0].version <= last[1] + 1:
        found = [r for r in live if r.version > last[1]]
    else:
        after = last[1] if last is not None and last[0] == journal_id else 0
        found = [r for r in m.journal.records(key, codec, after=after) if r.version > after]
    seen[name] = (journal_id, max(newest, last[1] if last else 0))
    found = [r for r in found if since is None or r.at >= since]
    return sorted(found, key=lambda r: r.version)


def lineage(m: Manifest, file_id: str) -> Lineage:
    """The upstream graph of ``file_id``, each shard read once, each journal at most once."""
    check_file_id(file_id)
    index = m.index()
    if file_id not in index:
        raise NotFound(f"{file_id!r} is not declared in task {m.task_id!r}")
    shards: dict[str, Shard] = {}

    def entry(fid: str) -> Entry | None:
        stage = index.stage_of(fid)
        if stage is None or stage not in m.stages:
            return None
        shard = m.layout.shard_of(stage, fid)
        if shard not in shards:
            shards[shard] = m.read_shard(shard)
        found = shards[shard].entries.get(fid)
        return found if found is not None else m.archives.entry(shards[shard], fid)

    journals: dict[str, list[JournalRecord]] = {}

    def ready_at(found: Entry) -> datetime | None:
        shard = m.layout.shard_of(found.stage, found.file_id)
        if shard not in journals:
            key = m.layout.shard(shard)
            journals[shard] = m.journal.records(key, m.codec(shard))
        made = [
            t.at
            for t in transitions_of(found.file_id, journals[shard])
            if t.to_state == State.ready.value and t.epoch == found.epoch
        ]
        return made[-1] if made else None

    return journal_history.lineage(file_id, index, entry, ready_at)


def trim_journal(
    m: Manifest,
    keep_seconds: float | None = None,
    keep_versions: int | None = None,
    *,
    dry_run: bool = False,
) -> list[Dropped]:
    """Drop whole journal blocks beyond the retention (the header's, unless given)."""
    if keep_seconds is None and keep_versions is None:
        keep_seconds = m.header.journal_keep_seconds
        keep_versions = m.header.journal_keep_versions
    seconds, versions = check_retention(keep_seconds, keep_versions)
    trimmer = Trimmer(m.store, m.docs.detached(), m.layout, seconds, versions)
    return trimmer.trim(m.journaled_objects(), dry_run=dry_run)


def dropped(m: Manifest, file_id: str | None = None, stage: str | None = None) -> list[Dropped]:
    """What retention dropped: of every journaled object, of a stage's, or of one entry's
    shard."""
    if file_id is not None:
        stage_of = m.stage_of(file_id)
        keys = [m.layout.shard(m.layout.shard_of(stage_of, file_id))]
    else:
        keys = [key for key, _ in objects_of(m, stage)]
    return [d for key in keys for d in m.journal.dropped(key)]


def migrate(m: Manifest) -> list[str]:
    """The header first, then every journaled object, each by a commit."""
    target = SCHEMA_VERSION
    moved: list[str] = []
    header_codec = HeaderCodec(m.task_id)
    header = m.docs.read(m.layout.header, header_codec)
    if header.schema_version < target:
        header = m.docs.commit(
            m.layout.header, header_codec, MigrateHeader(target, READERS[target])
        )
        moved.append(m.layout.header)
    m.configure(header)
    for key, codec in m.journaled_objects():
        try:
            if m.docs.commit(key, codec, Migrate(codec, target)):
                moved.append(key)
        except NotFound:
            continue
    return moved
