"""Reading a task's manifest: a stage's view over its shards (read in parallel for a split
stage), one entry wherever it lives, and the base a claim starts from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import shard_index

from ..core.model import (
    Claim,
    Entry,
    Shard,
)
from ..data.chunked.state import UploadCodec
from ..errors import (
    InvalidInput,
    NotFound,
)
from .settings import PARALLEL_READS

if TYPE_CHECKING:
    from .manifest import Manifest


def shard_key(self: Manifest, stage: str, file_id: str | None = None) -> str:
    self._check_stage(stage)
    shards = self.layout.shards_of(stage)
    if file_id is not None:
        return self.layout.shard(self.layout.shard_of(stage, file_id))
    if len(shards) > 1:
        raise InvalidInput(
            f"stage {stage!r} is split into {len(shards)} partitions, each a shard: "
            "name the file id whose shard you want"
        )
    return self.layout.shard(shards[0])


def read_shards(self: Manifest, shards: Iterable[str]) -> dict[str, Shard]:
    names = list(dict.fromkeys(shards))
    if len(names) <= 1:
        return {name: self.read_shard(name) for name in names}
    with self.store.runtime.pool(min(len(names), PARALLEL_READS), "read-shards") as pool:
        return dict(zip(names, pool.map(self.read_shard, names), strict=True))


def shard(self: Manifest, stage: str) -> Shard:
    self._check_stage(stage)
    names = self.layout.shards_of(stage)
    if names == [stage]:
        return self.read_shard(stage)
    return self._view(stage, self.read_shards(names), self.index)


def _view(
    self: Manifest,
    stage: str,
    docs: Mapping[str, Shard],
    index: Callable[[], shard_index.ShardIndex | None],
) -> Shard:
    names = self.layout.shards_of(stage)
    if names == [stage]:
        return docs[stage]
    parts = [docs[name] for name in names]
    entries = {f: e for p in parts for f, e in p.entries.items() if e.stage == stage}
    archived = {f: a for p in parts for f, a in (p.archived or {}).items()}
    if archived and self.layout.single:
        found = index()
        archived = {
            f: a for f, a in archived.items() if found is not None and found.stage_of(f) == stage
        }
    return Shard(
        task_id=self.task_id,
        stage=stage,
        entries=entries,
        archived=archived or None,
        schema_version=self.header.objects_schema,
    )


def entry(self: Manifest, file_id: str) -> Entry:
    stage = self.stage_of(file_id)
    shard = self.read_shard(self.layout.shard_of(stage, file_id))
    entry = shard.entries.get(file_id) or self.archives.entry(shard, file_id)
    if entry is None:
        raise NotFound(
            f"{file_id!r} is in the index but not in shard {stage!r}: its declaration "
            "was interrupted; declare it again to finish it"
        )
    return entry


def routed(self: Manifest, claim: Claim) -> Claim:
    self._check_stage(claim.stage)
    shard = self.layout.shard_of(claim.stage, claim.file_id)
    return claim if claim.shard == shard else dataclasses.replace(claim, shard=shard)


def _all_shards(self: Manifest, read: dict[str, Shard] | None = None) -> dict[str, Shard]:
    shards = dict(read or {})
    for shard in self.layout.all_shards(self.stages):
        if shard not in shards:
            shards[shard] = self.read_shard(shard)
    return shards


def claim_base(self: Manifest, shard: str) -> Shard:
    if self.docs.likely_current(self.layout.shard(shard)):
        return self.docs.cached(self.layout.shard(shard), self.codec(shard))
    return self.read_shard(shard)


def _upload_codec(self: Manifest, key: str) -> UploadCodec | None:
    parsed = self.layout.parse(key)
    if parsed.kind != "upload" or parsed.stage is None or parsed.file_id is None:
        return None
    return UploadCodec(self.task_id, parsed.stage, parsed.file_id, self.schema_version)
