"""What each view of the status page shows, as JSON-able data, read through the public API.

A ``Site`` serves one store for the life of a process: the task it was started on (if
any), one ``Task`` per task id, opened on first use and reused, so every later read is a
conditional GET that the store answers 304 while nothing changes, and a snapshot of each
view shared by every client for ``interval`` seconds, so ten open pages cost what one does.

What an idle board costs the store per refresh: one conditional GET per shard and one of
the index (``Task.status``), and one of the task's header (``Task.is_current``: was the
task deleted or created anew since?), nothing else; the partition counts and the throughput are read
from the shards ``status`` just read (``Task.shards(cached=True)``, and the journal records
they carry through ``Task.stage_logs``). The first look at a board reads
the journal blocks of each shard once; later, a shard whose records moved to blocks between
two looks costs a listing and the new blocks only. An entry's page costs the GETs of the
shards its lineage lives in and of the index while none of its entries changes; it reads
its history and lineage again (the journal blocks of those shards) only when one did.

Every view carries ``store_time`` (the store's clock when it was read); the ``etag`` of a
view covers everything else, so a view that did not change keeps its ETag and a page that
polls with ``If-None-Match`` gets 304s.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import objmanifest as om

from ..core.model import Shard
from ..wire.shapes import entry_row, iso, note_row
from .graph import layered
from .rows import ATTENTION, Throughput, state_counts
from .security import shown_endpoint

MAX_LIMIT = 1000
MEMO_SIZE = 256


@dataclass(frozen=True)
class View:
    """One view's data and its ETag (of everything but ``store_time``)."""

    body: dict[str, Any]
    etag: str

    @staticmethod
    def of(body: dict[str, Any]) -> View:
        stable = {k: v for k, v in body.items() if k != "store_time"}
        text = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
        return View(body, '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"')


class _Memo:
    """Views by key, each rebuilt at most once per ``ttl`` seconds, whoever asks; a view
    being built is built once, its other askers wait for it."""

    def __init__(self, ttl: float, monotonic: Callable[[], float]) -> None:
        self.ttl = ttl
        self.monotonic = monotonic
        self._views: OrderedDict[tuple[Any, ...], tuple[float, View]] = OrderedDict()
        self._locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._guard = threading.Lock()

    def forget(self, which: Callable[[tuple[Any, ...]], bool]) -> None:
        """Drop the views whose keys ``which`` names: they are built again when asked."""
        with self._guard:
            for key in [k for k in self._views if which(k)]:
                del self._views[key]

    def get(self, key: tuple[Any, ...], build: Callable[[], dict[str, Any]]) -> View:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._guard:
                found = self._views.get(key)
            if found is not None and self.monotonic() - found[0] < self.ttl:
                return found[1]
            view = View.of(build())
            with self._guard:
                self._views[key] = (self.monotonic(), view)
                self._views.move_to_end(key)
                while len(self._views) > MEMO_SIZE:
                    old, _ = self._views.popitem(last=False)
                    self._locks.pop(old, None)
            return view


@dataclass
class _EntryCache:
    """What an entry's page last read, and the state of every entry it depends on."""

    fingerprint: tuple[Any, ...]
    ids: tuple[str, ...]
    body: dict[str, Any]


class Site:
    """The views of one store. Safe to share between threads."""

    def __init__(
        self,
        store: om.ObjectStore,
        task_id: str | None = None,
        *,
        interval: float = 2.0,
        policy: om.CasPolicy | None = None,
        monotonic: Callable[[], float] | None = None,
        bucket_seconds: float = 60.0,
        buckets: int = 10,
    ) -> None:
        self.store = store
        self.task_id = task_id
        self.interval = interval
        self.policy = policy
        self.bucket_seconds = bucket_seconds
        self.buckets = buckets
        clock = monotonic or store.runtime.monotonic
        self._clock = clock
        self._checked: dict[str, float] = {}
        """Task id -> when its ``Task`` was last found current (``task``)."""
        self._memo = _Memo(interval, clock)
        self._list_memo = _Memo(interval * 5, clock)
        self._tasks: dict[str, om.Task] = {}
        self._throughput: dict[str, Throughput] = {}
        self._entries: dict[tuple[str, str], _EntryCache] = {}
        self._metrics: dict[str, om.metrics.TaskMetrics] = {}
        self._lock = threading.Lock()

    # -- the store and its tasks -------------------------------------------------------

    def where(self) -> dict[str, Any]:
        """The store as pages show it: its URL and its endpoint's scheme, host and port."""
        client = getattr(self.store, "client", None)
        endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None)
        return {"url": self.store.url, "endpoint": shown_endpoint(endpoint)}

    def task(self, task_id: str) -> om.Task:
        """The task's one ``Task`` object in this process (``NotFound`` if it has none).

        Whether it is still the task under that id (not deleted, not created anew) is
        checked at most once per ``interval`` (``Task.is_current``: one conditional GET of
        its header); once it is not, everything kept of it here is dropped and it is opened
        again."""
        now = self._clock()
        with self._lock:
            found = self._tasks.get(task_id)
            due = now - self._checked.get(task_id, -math.inf) >= self.interval
            if found is not None and due:
                self._checked[task_id] = now
        if found is not None and (not due or found.is_current()):
            return found
        if found is not None:
            self._forget(task_id, found)
        opened = om.Task.open(self.store, task_id, policy=self.policy)
        with self._lock:
            self._checked[task_id] = now
            return self._tasks.setdefault(task_id, opened)

    def _forget(self, task_id: str, task: om.Task) -> None:
        """Drop what this site keeps of a task that is no longer there as it was."""
        with self._lock:
            if self._tasks.get(task_id) is task:
                del self._tasks[task_id]
            self._throughput.pop(task_id, None)
            self._metrics.pop(task_id, None)
            for key in [k for k in self._entries if k[0] == task_id]:
                del self._entries[key]
        self._memo.forget(lambda key: len(key) > 1 and key[1] == task_id)
        self._list_memo.forget(lambda key: True)

    def task_metrics(self, task_id: str) -> om.metrics.TaskMetrics:
        """The metrics of a task's one ``Task`` here (registered on first use): this
        process commits nothing, so its counters stay at zero; its gauges (entries per stage
        and state, attention) are read from the shards, at most once per ``interval``."""
        task = self.task(task_id)
        with self._lock:
            found = self._metrics.get(task_id)
            if found is None:
                found = self._metrics[task_id] = om.metrics.register(
                    task, cache_seconds=self.interval
                )
            return found

    def metrics(self) -> om.metrics.Combined:
        """The metrics of the tasks served, as one collector: the task the site was started
        on, else every task under the store's prefix (listed at most once per five
        intervals, like the list of tasks; a task that cannot be opened is left out, the
        list of tasks says why)."""

        def listed() -> dict[str, Any]:
            return {"task_ids": om.Task.list(self.store)}

        def served() -> Iterator[om.metrics.TaskMetrics]:
            if self.task_id is not None:
                yield self.task_metrics(self.task_id)
                return
            for task_id in self._list_memo.get(("task ids",), listed).body["task_ids"]:
                try:
                    metrics = self.task_metrics(task_id)
                except om.ObjManifestError:
                    continue
                yield metrics

        return om.metrics.Combined(served)

    def _tracker(self, task: om.Task) -> Throughput:
        with self._lock:
            return self._throughput.setdefault(
                task.task_id, Throughput(task, self.bucket_seconds, self.buckets)
            )

    # -- views ---------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "version": om.__version__,
            **self.where(),
            "task": self.task_id,
            "interval": self.interval,
        }

    def tasks(self) -> View:
        """The task ids under the store's prefix (one delimiter listing) with their totals."""
        return self._list_memo.get(("tasks",), self._build_tasks)

    def board(self, task_id: str) -> View:
        task = self.task(task_id)
        return self._memo.get(("board", task_id), lambda: self._build_board(task))

    def entries(
        self,
        task_id: str,
        stage: str,
        state: str | None = None,
        agent: str | None = None,
        limit: int = 200,
        offset: int = 0,
    ) -> View:
        task = self.task(task_id)
        task.shard_names(stage)  # NotFound, naming the stages, for a stage the task lacks
        if state is not None and state not in {s.value for s in om.State}:
            raise om.InvalidInput(
                f"state {state!r} is not an entry state; use one of "
                f"{', '.join(s.value for s in om.State)}"
            )
        if not 1 <= limit <= MAX_LIMIT or offset < 0:
            raise om.InvalidInput(f"limit is from 1 to {MAX_LIMIT} and offset 0 or more")
        key = ("entries", task_id, stage, state, agent, limit, offset)
        return self._memo.get(
            key, lambda: self._build_entries(task, stage, state, agent, limit, offset)
        )

    def entry(self, task_id: str, file_id: str) -> View:
        task = self.task(task_id)
        return self._memo.get(("entry", task_id, file_id), lambda: self._build_entry(task, file_id))

    # -- building them -------------------------------------------------------------------

    def _build_tasks(self) -> dict[str, Any]:
        rows = []
        for task_id in om.Task.list(self.store):
            row: dict[str, Any] = {"task_id": task_id}
            try:
                task = self.task(task_id)
                status = task.status()
                damage = len(status.damaged) + len(status.unindexed)
                row.update(
                    stages=list(task.stages),
                    totals=status.totals,
                    finished=status.finished,
                    damaged=damage,
                    attention=damage + sum(len(getattr(status, k, None) or ()) for k in ATTENTION),
                )
            except om.ObjManifestError as e:
                row["error"] = str(e)
            rows.append(row)
        return {**self.where(), "store_time": iso(self.store.now()), "tasks": rows}

    def _build_board(self, task: om.Task) -> dict[str, Any]:
        status = task.status()
        now = status.store_time
        # The shards as status() just read them: no request, but for a shard that does
        # not exist yet (a partition nothing was routed to), which costs one more GET.
        shards: dict[str, Shard] = {}
        for name in task.shard_names():
            try:
                shards.update(task.shards([name], cached=True))
            except om.CorruptShard:  # status names it under damage; it counts nothing
                continue
        tracker = self._tracker(task)
        tracker.update(now, shards)
        throughput = tracker.series(now)
        stages = []
        for stage in task.stages:
            names = task.shard_names(stage)
            partitions = []
            if len(names) > 1:
                for name in names:
                    doc = shards.get(name)
                    live = doc.entries.values() if doc is not None else ()
                    refs = [a.state for a in (doc.archived or {}).values()] if doc else []
                    counts = state_counts(live, refs)
                    partitions.append(
                        {"shard": name, "counts": counts, "total": sum(counts.values())}
                    )
            counts = status.stages[stage]
            stages.append(
                {
                    "stage": stage,
                    "counts": counts,
                    "total": sum(counts.values()),
                    "archived": status.archived.get(stage, 0),
                    "partitions": partitions,
                    "throughput": throughput["stages"][stage],
                    "lost_races_per_commit": status.contention.get(stage),
                    "contended": stage in status.contended,
                }
            )
        attention = {
            kind: [note_row(n) for n in getattr(status, kind)]
            for kind in ATTENTION
            if getattr(status, kind, None) is not None
        }
        header = task.header
        return {
            "task_id": task.task_id,
            "store_time": iso(now),
            "settings": {
                "stages": list(task.stages),
                "lease_seconds": header.lease_seconds,
                "max_retries": header.max_retries,
                "partitions": dict(header.partitions or {}),
                "layout": header.layout or "stage",
                "schema_version": header.objects_schema,
                "journal": header.objects_schema >= 2,
            },
            "totals": status.totals,
            "finished": status.finished,
            "stages": stages,
            "attention": attention,
            "damage": {
                "unfinished": [n.model_dump(mode="json") for n in status.unfinished],
                "unindexed": [n.model_dump(mode="json") for n in status.unindexed],
                "objects": [n.model_dump(mode="json") for n in status.damaged],
            },
            "throughput": {k: v for k, v in throughput.items() if k != "stages"},
        }

    def _build_entries(
        self,
        task: om.Task,
        stage: str,
        state: str | None,
        agent: str | None,
        limit: int,
        offset: int,
    ) -> dict[str, Any]:
        entries, archived, damaged = self._sound_part(task, stage)
        now = task.store.now()
        split = len(task.shard_names(stage)) > 1
        rows: list[dict[str, Any]] = [
            entry_row(e, task.shard_names(stage, e.file_id)[0] if split else None)
            for e in entries.values()
        ]
        if agent is None:  # archived entries have no holder to filter by
            rows += [
                {"file_id": fid, "stage": stage, "state": ref.state.value, "archived": True}
                for fid, ref in archived.items()
            ]
        agents = sorted({e.owner for e in entries.values() if e.owner})
        matched = [
            r
            for r in rows
            if (state is None or r["state"] == state)
            and (agent is None or r.get("holder") == agent)
        ]
        matched.sort(key=lambda r: r["file_id"])
        counts = state_counts(entries.values(), [a.state for a in archived.values()])
        return {
            "task_id": task.task_id,
            "stage": stage,
            "store_time": iso(now),
            "filter": {"state": state, "agent": agent, "limit": limit, "offset": offset},
            "counts": counts,
            "total": sum(counts.values()),
            "matched": len(matched),
            "agents": agents,
            "lease_seconds": task.lease_seconds,
            "max_retries": task.max_retries,
            "entries": matched[offset : offset + limit],
            "damaged": damaged,
        }

    @staticmethod
    def _sound_part(
        task: om.Task, stage: str
    ) -> tuple[dict[str, om.Entry], dict[str, Any], list[dict[str, str]]]:
        """The stage's entries and archived entries as its sound shards hold them, and each
        shard that does not parse (its key, full address and problem; ``objmanifest
        repair`` mends it): a damaged partition hides only its own entries."""
        try:
            whole = task.shard(stage)
            return dict(whole.entries), dict(whole.archived or {}), []
        except om.CorruptShard:
            pass
        entries: dict[str, om.Entry] = {}
        archived: dict[str, Any] = {}
        damaged: list[dict[str, str]] = []
        shared = {n for other in task.stages if other != stage for n in task.shard_names(other)}
        for name in task.shard_names(stage):
            try:
                doc = task.shards([name])[name]
            except om.CorruptShard as e:
                damaged.append(
                    {"shard": name, "key": e.key, "address": e.address, "problem": e.detail}
                )
                continue
            entries.update((f, x) for f, x in doc.entries.items() if x.stage == stage)
            if name not in shared:  # the task's one shard: whose archived ids, unsure
                archived.update(doc.archived or {})
        return entries, archived, damaged

    def _build_entry(self, task: om.Task, file_id: str) -> dict[str, Any]:
        key = (task.task_id, file_id)
        with self._lock:
            cached = self._entries.get(key)
        if cached is not None and self._fingerprint(task, cached.ids) == cached.fingerprint:
            return {**cached.body, "store_time": iso(task.store.now())}
        entry = task.entry(file_id)
        history = task.history(file_id)
        dropped = task.dropped(file_id)
        lineage = task.lineage(file_id).to_dict()
        ids = tuple(lineage["nodes"])
        fingerprint = self._fingerprint(task, ids)
        split = len(task.shard_names(entry.stage)) > 1
        body = {
            "task_id": task.task_id,
            "store_time": iso(task.store.now()),
            "entry": entry_row(entry, task.shard_names(entry.stage, file_id)[0] if split else None),
            "max_retries": task.max_retries,
            "history": [t.to_dict() for t in history],
            "dropped": [d.to_dict() for d in dropped],
            "journal": task.header.objects_schema >= 2,
            "lineage": lineage,
            "graph": layered(file_id, lineage["nodes"], lineage["edges"]),
        }
        with self._lock:
            self._entries[key] = _EntryCache(fingerprint, ids, body)
            while len(self._entries) > MEMO_SIZE:
                self._entries.pop(next(iter(self._entries)))
        return body

    def _fingerprint(self, task: om.Task, ids: Iterable[str]) -> tuple[Any, ...]:
        """The state of every entry of a lineage as the store has it now: one conditional
        GET of the index and of each shard they live in (304s while nothing changed)."""
        index = task.index()
        homes = {fid: index.stage_of(fid) for fid in ids}
        where = {
            fid: task.shard_names(stage, fid)[0]
            for fid, stage in homes.items()
            if stage is not None and stage in task.stages
        }
        docs = task.shards(sorted(set(where.values())))
        out: list[Any] = []
        for fid in sorted(homes):
            if fid not in where:
                out.append((fid, None))
                continue
            doc = docs[where[fid]]
            found = doc.entries.get(fid)
            ref = (doc.archived or {}).get(fid)
            out.append((fid, found.model_dump_json() if found else None, ref and ref.archive))
        return tuple(out)


__all__ = ["Site", "View"]
