"""Creating, opening and deleting a task: the header written create-only after the store is
probed, read back and checked on open, and a deletion that can be run again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from ..cas.codecs import (
    HEADER_REPAIR,
    HeaderCodec,
    IndexCodec,
    ShardCodec,
    load_json,
    schema_problems,
)
from ..cas.policy import CasPolicy
from ..core.layout import TaskLayout
from ..core.model import (
    HEADER_SCHEMA,
    READERS,
    SCHEMA_VERSION,
    Shard,
    TaskHeader,
    validated,
)
from ..data.chunked import Scope
from ..data.transfer import TransferConfig
from ..errors import (
    AlreadyExists,
    CorruptShard,
    InvalidInput,
    NotFound,
    TaskBeingDeleted,
    UnsupportedSchema,
    UnsupportedStore,
)
from ..ops import deletion
from ..store import CREATE, PROBE_PREFIX, ObjectStore, probe_conditional_writes
from ..store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed
from .settings import check_retention, check_settings, check_timing

if TYPE_CHECKING:
    from .manifest import Manifest

M = TypeVar("M", bound="Manifest")


def create(
    cls: type[M],
    store: ObjectStore,
    task_id: str,
    stages: Iterable[str],
    lease_seconds: float = 300,
    max_retries: int = 3,
    *,
    policy: CasPolicy | None = None,
    transfer: TransferConfig | None = None,
    journal_keep_seconds: float | None = None,
    journal_keep_versions: int | None = None,
    partitions: Mapping[str, int] | None = None,
    layout: str | None = None,
    retry_backoff: float = 0,
    retry_backoff_max: float | None = None,
    deadlines: Mapping[str, float] | None = None,
) -> M:
    keys = TaskLayout(task_id)
    lease, retries = check_settings(lease_seconds, max_retries)
    keep_seconds, keep_versions = check_retention(journal_keep_seconds, journal_keep_versions)
    if isinstance(stages, (str, bytes, dict)):
        raise InvalidInput(
            f"stages must be a list of stage names, not the {type(stages).__name__} "
            f"{stages!r}: write stages=[{stages!r}] for one stage"
            if not isinstance(stages, dict)
            else f"stages must be a list of stage names, not a dict: {stages!r}"
        )
    if partitions is not None and not isinstance(partitions, Mapping):
        raise InvalidInput(
            f"partitions must map stage names to partition counts, like "
            f'{{"collect": 16}}, not the {type(partitions).__name__} {partitions!r}'
        )
    stages = tuple(stages)
    backoff, backoff_max, stage_deadlines = check_timing(
        retry_backoff, retry_backoff_max, deadlines, stages
    )
    layered = bool(layout is not None or any(n != 1 for n in (partitions or {}).values()))
    # A backoff or deadlines need header schema 3 too: 0.2.0 would claim a failed entry
    # at once, blind to its retry_at.
    timed = backoff is not None or stage_deadlines is not None
    schema = HEADER_SCHEMA if layered or timed else SCHEMA_VERSION
    runtime = store.runtime
    problems = probe_conditional_writes(store, PROBE_PREFIX + runtime.new_id())
    if problems:
        raise UnsupportedStore(
            f"{store.url} does not enforce conditional writes, so agents could overwrite "
            f"each other: {'; '.join(problems)}. Use a store that enforces "
            "If-Match / If-None-Match on PUT, also under concurrent writers (AWS S3, "
            "SeaweedFS, MinIO, LocalStack); `objmanifest doctor` shows what it enforces."
        )
    header = validated(
        TaskHeader,
        f"task {task_id!r}",
        task_id=task_id,
        stages=tuple(stages),
        lease_seconds=lease,
        max_retries=retries,
        created_at=store.now(),
        creation_id=runtime.new_id(),
        schema_version=schema,
        requires=READERS[schema],
        journal_keep_seconds=keep_seconds,
        journal_keep_versions=keep_versions,
        layout=layout,
        partitions=dict(partitions) if partitions is not None else None,
        retry_backoff=backoff,
        retry_backoff_max=backoff_max,
        deadlines=stage_deadlines,
    )
    key = keys.header
    body = header.model_dump_json(exclude_none=True).encode()
    for _ in range(3):
        try:
            etag = store.put(key, body, mode=CREATE, content_type="application/json")
            return cls(store, header, policy, transfer=transfer, header_etag=etag)
        except (PreconditionFailed, OutcomeUnknown):
            try:
                existing = cls.open(store, task_id, policy=policy, transfer=transfer)
            except TaskBeingDeleted as e:
                raise AlreadyExists(f"{e}; then create it") from None
            except NotFound:
                continue  # the write did not land: try again
            if existing.header.creation_id == header.creation_id:
                return existing  # our write landed; its answer was lost
            raise AlreadyExists(
                f"task {task_id!r} already exists at {store.describe(key)}; "
                "open it with Task.open, or pick another task id"
            ) from None
    raise UnsupportedStore(f"could not create {store.describe(key)}: writes are not landing")


def open(
    cls: type[M],
    store: ObjectStore,
    task_id: str,
    *,
    policy: CasPolicy | None = None,
    transfer: TransferConfig | None = None,
) -> M:
    key = TaskLayout(task_id).header
    try:
        blob = store.get(key)
    except NoSuchObject:
        raise NotFound(
            f"task {task_id!r} does not exist at {store.describe(key)}; "
            "create it with Task.create (or `objmanifest init`)"
        ) from None
    assert blob is not None
    where = store.describe(key)
    try:
        data = load_json(key, blob.body, HEADER_SCHEMA)
    except (CorruptShard, UnsupportedSchema) as e:
        raise e.at(where, HEADER_REPAIR) from None
    try:
        header = TaskHeader.model_validate(data)
    except ValidationError as e:
        problem = f"not a task header: {schema_problems(e)}"
        raise CorruptShard(key, problem, where, HEADER_REPAIR) from None
    if header.task_id != task_id:
        problem = f"it is the header of task {header.task_id!r}"
        raise CorruptShard(key, problem, where, HEADER_REPAIR)
    if header.deleting_at is not None:
        raise TaskBeingDeleted(
            f"task {task_id!r} at {where} is being deleted (since "
            f"{header.deleting_at.isoformat()}): run `objmanifest delete --yes` "
            "(Task.delete_by_id) again to finish it"
        )
    return cls(store, header, policy, transfer=transfer, header_etag=blob.etag)


def is_current(self: Manifest) -> bool:
    key = self.layout.header
    try:
        blob = self.store.get(key, if_none_match=self._header_etag)
    except NoSuchObject:
        return False
    if blob is None:
        return True
    try:
        header = HeaderCodec(self.task_id).decode(key, blob.body)
    except (CorruptShard, UnsupportedSchema):
        return False
    return header == self.header


def delete(self: Manifest, force: bool = False) -> deletion.Deleted:
    codec = HeaderCodec(self.task_id)
    try:
        header = self.docs.read(self.layout.header, codec)
    except NotFound:
        return deletion.remove_leftovers(self.store, self.layout)
    if header.deleting_at is None:
        shards: list[Shard] = []
        for shard in self.layout.all_shards(self.stages):
            try:
                shards.append(self.read_shard(shard))
            except CorruptShard:
                if not force:
                    raise
        if not force:
            deletion.refuse_live(self.task_id, deletion.live_holders(shards, self.store.now()))
        self.docs.commit(self.layout.header, codec, deletion.MarkDeleting())
    self.docs.flush()  # journal blocks this process is still writing land first
    return deletion.remove_all(self.store, self.layout)


def delete_by_id(
    cls: type[Manifest], store: ObjectStore, task_id: str, *, force: bool = False
) -> deletion.Deleted:
    layout = TaskLayout(task_id)
    codec = HeaderCodec(task_id)
    try:
        blob = store.get(layout.header)
    except NoSuchObject:
        return deletion.remove_leftovers(store, layout)
    assert blob is not None
    try:
        header = codec.decode(layout.header, blob.body)
    except (CorruptShard, UnsupportedSchema) as e:
        raise e.at(store.describe(layout.header), HEADER_REPAIR) from None
    return cls(store, header).delete(force=force)


def _configure(self: Manifest, header: TaskHeader) -> None:
    self.header = header
    self.index_codec = IndexCodec(header.objects_schema)
    self._codecs = {
        shard: ShardCodec(header.task_id, shard, header.objects_schema)
        for shard in self.layout.all_shards(header.stages)
    }
    self.uploads = Scope(
        store=self.store,
        docs=self.docs,
        layout=self.layout,
        stages=header.stages,
        held=self.held,
        entry=self._entry_now,
        schema=header.objects_schema,
    )
