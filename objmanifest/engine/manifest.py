"""The manifest engine of one task: its header, its shards and its dependency index in one
store, and the reads every other module of the engine starts from.

A shard or the index that does not exist yet reads as empty, and its first commit creates
it with ``If-None-Match: *``: creating a task writes one object, and a crash in the middle
of anything leaves nothing half-made that a rerun cannot finish. Keys come from
``layout.TaskLayout``; every change is a named command committed through ``cas.Documents``,
whose events the task's observers receive, side effects included (``data.transition_effects``).

``Manifest`` holds the state; the modules beside it (``reads``, ``declaring``, ``status``,
``journaling``, ``operations``, ``opening``, ``producing``, ``consuming``) are functions
that take it. ``Task`` and ``Agent`` hold one and offer the documented calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import shard_index

from ..cas.codecs import IndexCodec, ShardCodec, ShardCodecs
from ..cas.loop import Documents
from ..cas.policy import CasPolicy
from ..core import changes
from ..core.commit_events import Observers
from ..core.layout import TaskLayout
from ..core.model import Claim, Entry, Shard, TaskHeader
from ..core.names import check_file_id
from ..core.report import DamageNote
from ..core.states import State
from ..data.chunked import Scope
from ..data.chunked.state import UploadCodec
from ..data.transfer import TransferConfig
from ..data.transition_effects import TransitionEffects
from ..errors import InvalidInput, LeaseLost, NotFound
from ..journal.history import History
from ..ops.archive import Archives
from ..store import ObjectStore
from .commands import Migratable

PARALLEL_READS = 16
"""The most shards (or upload states) read at once."""


class Manifest:
    """The engine of one task: its store and header, the CAS loop's documents, the codec of
    every manifest object, the uploads' scope, the journal and the archives, and the reads
    the rest of the engine starts from. Safe to share between threads."""

    index_codec: IndexCodec
    _codecs: Mapping[str, ShardCodec]
    uploads: Scope

    def __init__(
        self,
        store: ObjectStore,
        header: TaskHeader,
        policy: CasPolicy | None = None,
        *,
        transfer: TransferConfig | None = None,
        header_etag: str | None = None,
    ) -> None:
        self.store = store
        self.header = header
        self.header_etag = header_etag
        """The ETag the header had when it was read (``is_current`` compares it)."""
        self.layout = TaskLayout.of(header)
        self.observers = Observers()
        self.docs = Documents(
            store,
            policy or CasPolicy(),
            observers=self.observers,
            block_key=self.layout.journal_block,
        )
        self.rules = changes.Rules(
            header.task_id,
            header.lease_seconds,
            header.max_retries,
            header.retry_backoff or 0.0,
            header.backoff_cap,
        )
        self.transfer = transfer or TransferConfig()
        """How data moves: ``transfer=`` given to ``create``/``open``, else the defaults."""
        self.sound_parts: set[tuple[str, str | None]] = set()
        """(upload state key, entry checksum) of the part lists ``status`` read sound."""
        self._codecs: dict[str, ShardCodec] = {}
        self.configure(header)
        self.journal = History(store, self.docs, self.layout, self.journaled_objects)
        self.archives = Archives(store, self.layout)
        self.observers.subscribe(TransitionEffects(self.uploads))

    def configure(self, header: TaskHeader) -> None:
        """The codecs and the upload scope for the schema version of ``header``."""
        self.header = header
        self.task_id: str = header.task_id
        self.stages: tuple[str, ...] = header.stages
        self.index_codec = IndexCodec(header.objects_schema)
        self._codecs = ShardCodecs(
            self.layout, header.stages, header.objects_schema, header.creation_id
        )
        self.uploads = Scope(
            store=self.store,
            docs=self.docs,
            layout=self.layout,
            stages=header.stages,
            held=self.held,
            entry=self.entry_now,
            schema=header.objects_schema,
        )

    # -- settings and keys ---------------------------------------------------------------

    @staticmethod
    def header_key(task_id: str) -> str:
        return TaskLayout(task_id).header

    @property
    def schema_version(self) -> int:
        """The format of the task's objects: 1 (no journal) or 2 (every version journaled)."""
        return self.header.objects_schema

    @property
    def index_key(self) -> str:
        return self.layout.index

    def check_stage(self, stage: str) -> None:
        """``NotFound``, naming the task's stages, unless ``stage`` is one of them."""
        if stage not in self.stages:
            raise NotFound(
                f"{stage!r} is not a stage of task {self.task_id!r}; "
                f"its stages are {', '.join(self.stages)}"
            )

    def shard_names(self, stage: str | None = None, file_id: str | None = None) -> list[str]:
        """The shards of the task, of ``stage``, or the one of ``stage`` that holds
        ``file_id`` (names, no I/O)."""
        if stage is None:
            return self.layout.all_shards(self.stages)
        self.check_stage(stage)
        if file_id is not None:
            return [self.layout.shard_of(stage, file_id)]
        return self.layout.shards_of(stage)

    def shard_key(self, stage: str, file_id: str | None = None) -> str:
        """The key of ``stage``'s shard; of a split stage, the key of the partition that
        holds ``file_id``."""
        shards = self.shard_names(stage, file_id)
        if len(shards) > 1:
            raise InvalidInput(
                f"stage {stage!r} is split into {len(shards)} partitions, each a shard: "
                "name the file id whose shard you want"
            )
        return self.layout.shard(shards[0])

    def codec(self, shard: str) -> ShardCodec:
        """The codec of a shard (``claim.shard``, or a stage's own shard)."""
        try:
            return self._codecs[shard]
        except KeyError:
            shards = list(self._codecs)
            more = f" and {len(shards) - 10} more" if len(shards) > 10 else ""
            raise NotFound(
                f"{shard!r} is not a shard of task {self.task_id!r}; its shards are "
                f"{', '.join(shards[:10])}{more}"
            ) from None

    def shard_codecs(self) -> dict[str, ShardCodec]:
        """Every shard of the task, by name, with its codec."""
        return dict(self._codecs)

    def upload_codec(self, key: str) -> UploadCodec | None:
        """The codec of the upload state at ``key`` (None: not an upload state's key)."""
        parsed = self.layout.parse(key)
        if parsed.kind != "upload" or parsed.stage is None or parsed.file_id is None:
            return None
        return UploadCodec(self.task_id, parsed.stage, parsed.file_id, self.schema_version)

    def journaled_objects(self) -> list[tuple[str, Migratable[Any]]]:
        """Every manifest object of the task that keeps a journal, with its codec."""
        objects: list[tuple[str, Migratable[Any]]] = [
            (self.layout.shard(shard), codec) for shard, codec in self._codecs.items()
        ]
        objects.append((self.layout.index, self.index_codec))
        for row in self.store.list(self.layout.uploads_prefix):
            codec = self.upload_codec(row.key)
            if codec is not None:
                objects.append((row.key, codec))
        return objects

    def damage(self, key: str, kind: str, problem: str) -> DamageNote:
        """A damaged manifest object as ``status`` names it."""
        return DamageNote(key=key, kind=kind, problem=problem, address=self.store.describe(key))

    def request_counts(self) -> dict[str, int]:
        stats = self.docs.stats
        return {**dataclasses.asdict(stats), "writes": stats.writes}

    # -- reads ---------------------------------------------------------------------------

    def read_shard(self, shard: str) -> Shard:
        """A fresh read of one shard (a 304 when nothing changed)."""
        return self.docs.read(self.layout.shard(shard), self.codec(shard))

    def cached_shard(self, shard: str) -> Shard:
        """One shard as this object last read or wrote it (read if it never did)."""
        return self.docs.cached(self.layout.shard(shard), self.codec(shard))

    def read_shards(self, shards: Iterable[str], *, cached: bool = False) -> dict[str, Shard]:
        """Fresh reads of several shards, in parallel (304s when nothing changed); with
        ``cached``, each as this object last read or wrote it."""
        names = list(dict.fromkeys(shards))
        if cached or len(names) <= 1:
            read = self.cached_shard if cached else self.read_shard
            return {name: read(name) for name in names}
        with self.store.runtime.pool(min(len(names), PARALLEL_READS), "read-shards") as pool:
            return dict(zip(names, pool.map(self.read_shard, names), strict=True))

    def all_shards(self, read: dict[str, Shard] | None = None) -> dict[str, Shard]:
        """Every shard of the task, read fresh (those in ``read`` are taken as they are)."""
        shards = dict(read or {})
        for shard in self.layout.all_shards(self.stages):
            if shard not in shards:
                shards[shard] = self.read_shard(shard)
        return shards

    def index(self, *, cached: bool = False) -> shard_index.ShardIndex:
        """The dependency index, read fresh (or as this object last read it)."""
        read = self.docs.cached if cached else self.docs.read
        return read(self.layout.index, self.index_codec)

    def stage_of(self, file_id: str) -> str:
        check_file_id(file_id)
        stage = self.index().stage_of(file_id)
        if stage is None:
            raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
        return stage

    def claim_base(self, shard: str) -> Shard:
        """The version of ``shard`` a claim chooses from: the cached one while it is likely
        current (``Documents.likely_current``: the claim's write is conditional on it, so a
        stale one costs a 412 and the claim chooses again on the version read then), else a
        fresh read (a 304 when nothing changed)."""
        if self.docs.likely_current(self.layout.shard(shard)):
            return self.cached_shard(shard)
        return self.read_shard(shard)

    def entry_now(self, stage: str, file_id: str) -> Entry | None:
        """The live entry ``file_id`` of ``stage``, read fresh (None if its shard lacks it)."""
        if stage not in self.stages:
            return None
        return self.read_shard(self.layout.shard_of(stage, file_id)).entries.get(file_id)

    # -- claims --------------------------------------------------------------------------

    def routed(self, claim: Claim) -> Claim:
        """``claim`` naming the shard its entry lives in, as the layout routes it: a claim
        rebuilt from its printed fields (task, file, stage, agent, epoch) names only its
        stage, which is not its shard on a split stage or a one-shard task."""
        self.check_stage(claim.stage)
        shard = self.layout.shard_of(claim.stage, claim.file_id)
        return claim if claim.shard == shard else dataclasses.replace(claim, shard=shard)

    def held(self, claim: Claim) -> Entry:
        """The entry, read fresh, if ``claim`` still holds it; else ``LeaseLost``."""
        claim = self.routed(claim)
        entry = self.read_shard(claim.shard).entries.get(claim.file_id)
        if entry is None or (entry.state, entry.epoch, entry.owner) != (
            State.writing,
            claim.epoch,
            claim.agent,
        ):
            now = f"{entry.state.value} at epoch {entry.epoch}" if entry else "gone"
            raise LeaseLost(
                f"lease on {claim.file_id!r} (epoch {claim.epoch}, agent {claim.agent}) is "
                f"lost: the entry is now {now}. Stop working on it."
            )
        return entry


__all__ = ["PARALLEL_READS", "Manifest"]
