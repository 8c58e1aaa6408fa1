"""A task's status and waiting on it: every shard read once, damaged objects named rather
than failing the read, why a stage has nothing claimable, and polling until entries are
ready."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import shard_index

from ..core import changes, commands, leases, states
from ..core.model import (
    DamageNote,
    Entry,
    EntryNote,
    IndexNote,
    Shard,
    State,
    TaskStatus,
)
from ..data.chunked.rebuild import needs_parts
from ..errors import (
    CorruptShard,
    DeadWaitedFor,
    InvalidInput,
    UnsupportedSchema,
    WaitTimeout,
)
from ..ops.gc import Collector, GcReport
from ..store import list_keys
from ..store.errors import NoSuchObject
from .attention import attention, timing
from .settings import PARALLEL_READS, some_ids

if TYPE_CHECKING:
    from .manifest import Manifest

WAIT_FIRST_DELAY, WAIT_GROWTH, WAIT_MAX_DELAY = 0.2, 1.5, 2.0
"""``wait`` polls 0.2 s apart at first, each delay 1.5 times the last, up to 2 s (as the
command line's ``--wait``)."""


def _sound_shards(self: Manifest, damaged: list[DamageNote]) -> dict[str, Shard]:

    def read(name: str) -> Shard | CorruptShard:
        try:
            return self.read_shard(name)
        except CorruptShard as e:
            return e

    names = self.layout.all_shards(self.stages)
    with self.store.runtime.pool(min(len(names), PARALLEL_READS), "read-shards") as pool:
        got = dict(zip(names, pool.map(read, names), strict=True))
    docs: dict[str, Shard] = {}
    for name, doc in got.items():
        if isinstance(doc, CorruptShard):
            damaged.append(self._damage(self.layout.shard(name), "shard", doc.detail))
            doc = self.codec(name).empty()
        docs[name] = doc
    return docs


def _parts_damage(self: Manifest, entries: Iterable[Entry]) -> list[DamageNote]:
    wanted = [e for e in entries if needs_parts(e)]
    if not wanted:
        return []
    present = set(list_keys(self.store, self.layout.uploads_prefix))

    def problem(entry: Entry) -> str | None:
        key = entry.parts_key
        assert key is not None
        if key not in present:
            return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
        if (key, entry.checksum) in self._sound_parts:
            return None
        codec = self._upload_codec(key)
        try:
            blob = self.store.get(key)
            assert blob is not None and codec is not None
            codec.decode(key, blob.body)
        except NoSuchObject:
            return f"it is missing: {entry.file_id!r} ({entry.state.value}) needs its part list"
        except CorruptShard as e:
            return e.detail
        except UnsupportedSchema:
            return None  # a newer release's: not damage
        self._sound_parts.add((key, entry.checksum))
        return None

    with self.store.runtime.pool(min(len(wanted), PARALLEL_READS), "read-parts") as pool:
        problems = list(pool.map(problem, wanted))
    return [
        self._damage(e.parts_key or "", "upload state", p)
        for e, p in zip(wanted, problems, strict=True)
        if p is not None
    ]


def unclaimable(self: Manifest, stage: str) -> str:
    entries = list(self.shard(stage).entries.values())
    if not entries:
        return "it has no entries: declare some first"
    now = self.store.now()
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


def status(self: Manifest) -> TaskStatus:
    damaged: list[DamageNote] = []
    docs = self._sound_shards(damaged)
    index: shard_index.ShardIndex | None
    try:
        index = self.index()  # after the shards: see declare_many
    except CorruptShard as e:
        damaged.append(self._damage(self.layout.index, "index", e.detail))
        index = None
    shards = {s: self._view(s, docs, lambda: index) for s in self.stages}
    everything = {fid: e for sh in shards.values() for fid, e in sh.entries.items()}
    for sh in shards.values():  # archiving: archived entries count in their state
        for fid, ref in (sh.archived or {}).items():
            everything.setdefault(fid, changes.archived_stub(fid, sh.stage, ref))
    now = self.store.now()
    counts: dict[str, dict[str, int]] = {}
    archived: dict[str, int] = {}
    notes: dict[str, list[EntryNote]] = {
        "blocked": [],
        "overdue": [],
        "dead": [],
        "late": [],
        "backing_off": [],
    }
    deadlines = self.header.deadlines or {}
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
        key = self.layout.shard(self.layout.shard_of(stage, file_id))
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
    return TaskStatus(
        task_id=self.task_id,
        store_time=now,
        stages=counts,
        unfinished=unfinished,
        unindexed=unindexed,
        archived=archived,
        damaged=damaged + self._parts_damage(everything.values()),
        **notes,
    )


@dataclass(frozen=True)
class WaitPlan:
    """What a wait waits for, its arguments checked (no I/O): ``Task.wait`` and
    ``AsyncTask.wait`` (which sleeps on its event loop) share it."""

    stages: tuple[str, ...]
    until: str
    timeout: float | None

    @classmethod
    def of(
        cls, task: Manifest, stages: Iterable[str] | None, until: str, timeout: float | None
    ) -> WaitPlan:
        if isinstance(stages, str):
            raise InvalidInput(f"stages must be a list of stage names, not the string {stages!r}")
        wanted = tuple(task.stages if stages is None else dict.fromkeys(stages))
        for stage in wanted:
            task.check_stage(stage)
        if until not in states.UNTIL:
            raise InvalidInput(f"until must be 'ready' or 'consumed', not {until!r}")
        if timeout is not None and not (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout >= 0
        ):
            raise InvalidInput(
                f"timeout must be a finite number of seconds from 0, or None to wait for "
                f"ever, not {timeout!r}"
            )
        return cls(wanted, until, timeout)

    def timed_out(self, waiting: list[str]) -> WaitTimeout:
        return WaitTimeout(
            f"timed out after {self.timeout:g}s waiting for {len(waiting)} entries of "
            f"{', '.join(self.stages)} to be {self.until}: {some_ids(waiting)}",
            tuple(waiting),
        )


def wait(
    self: Manifest,
    stages: Iterable[str] | None = None,
    until: str = "ready",
    timeout: float | None = None,
    *,
    on_wait: Callable[[list[str]], None] | None = None,
) -> dict[str, State]:
    plan = WaitPlan.of(self, stages, until, timeout)
    runtime = self.store.runtime
    start = runtime.monotonic()
    delay = WAIT_FIRST_DELAY
    while True:
        found, waiting = look(self, plan)
        if not waiting:
            return found
        remaining = math.inf if timeout is None else start + timeout - runtime.monotonic()
        if remaining <= 0:
            raise plan.timed_out(waiting)
        if on_wait is not None:
            on_wait(waiting)
            on_wait = None
        runtime.sleep(min(delay, remaining))
        delay = min(delay * WAIT_GROWTH, WAIT_MAX_DELAY)


def outstanding(
    self: Manifest, stages: Iterable[str] | None, until: str
) -> tuple[dict[str, State], list[str]]:
    return look(self, WaitPlan.of(self, stages, until, None))


def look(self: Manifest, plan: WaitPlan) -> tuple[dict[str, State], list[str]]:
    """One look at the stages of ``plan``: every entry's state, and the ids not there yet;
    ``DeadWaitedFor`` if one of them is dead."""
    found: dict[str, State] = {}
    for stage in plan.stages:
        shard = self.shard(stage)
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


def reap(self: Manifest) -> list[Entry]:
    released: list[Entry] = []
    for shard in self.layout.all_shards(self.stages):
        released += self.docs.commit(
            self.layout.shard(shard), self.codec(shard), commands.Reap(self.rules)
        )
    return released


def gc(self: Manifest, dry_run: bool = False, consumed_older_than: float | None = None) -> GcReport:
    if consumed_older_than is not None and not (
        isinstance(consumed_older_than, (int, float))
        and not isinstance(consumed_older_than, bool)
        and math.isfinite(consumed_older_than)
        and consumed_older_than >= 0
    ):
        raise InvalidInput(
            f"consumed_older_than must be a number of seconds >= 0, not {consumed_older_than!r}"
        )
    collector = Collector(
        self.store,
        self.docs,
        self.layout,
        self.stages,
        self.uploads,
        self.codec,
        self.store.now,
        self.archives,
    )
    return collector.run(dry_run, consumed_older_than)
