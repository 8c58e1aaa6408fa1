"""Creating, opening and deleting a task: the header written create-only after the store is
probed, read back and checked on open, and a deletion that can be run again."""

from __future__ import annotations

from ..cas.codecs import HEADER_REPAIR, HeaderCodec
from ..cas.policy import CasPolicy
from ..core.layout import TaskLayout
from ..core.model import Shard, TaskHeader, validated
from ..core.settings import TaskSettings
from ..data.transfer import TransferConfig
from ..errors import (
    AlreadyExists,
    CorruptShard,
    NotFound,
    TaskBeingDeleted,
    UnsupportedSchema,
    UnsupportedStore,
)
from ..ops import deletion
from ..store import CREATE, PROBE_PREFIX, ObjectStore, probe_conditional_writes
from ..store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed
from .manifest import Manifest


def create(
    store: ObjectStore,
    task_id: str,
    settings: TaskSettings,
    *,
    policy: CasPolicy | None = None,
    transfer: TransferConfig | None = None,
) -> Manifest:
    """Create a task (``AlreadyExists`` if it is there) after checking the store is safe."""
    keys = TaskLayout(task_id)
    fields = settings.header_fields()
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
        created_at=store.now(),
        creation_id=runtime.new_id(),
        **fields,
    )
    key = keys.header
    body = header.model_dump_json(exclude_none=True).encode()
    for _ in range(3):
        try:
            etag = store.put(key, body, mode=CREATE, content_type="application/json")
            return Manifest(store, header, policy, transfer=transfer, header_etag=etag)
        except (PreconditionFailed, OutcomeUnknown):
            try:
                existing = open(store, task_id, policy=policy, transfer=transfer)
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


def read_header(store: ObjectStore, task_id: str) -> tuple[TaskHeader, str | None]:
    """The header of ``task_id`` and its ETag, decoded by its codec: ``NoSuchObject`` if
    there is none, ``CorruptShard`` or ``UnsupportedSchema`` naming its address if it does not
    read back as the header of that task."""
    key = TaskLayout(task_id).header
    blob = store.get(key)
    assert blob is not None
    try:
        return HeaderCodec(task_id).decode(key, blob.body), blob.etag
    except (CorruptShard, UnsupportedSchema) as e:
        raise e.at(store.describe(key), HEADER_REPAIR) from None


def open(
    store: ObjectStore,
    task_id: str,
    *,
    policy: CasPolicy | None = None,
    transfer: TransferConfig | None = None,
) -> Manifest:
    """Open an existing task (``NotFound`` if there is none)."""
    try:
        header, etag = read_header(store, task_id)
    except NoSuchObject:
        raise NotFound(
            f"task {task_id!r} does not exist at {store.describe(TaskLayout(task_id).header)}; "
            "create it with Task.create (or `objmanifest init`)"
        ) from None
    if header.deleting_at is not None:
        where = store.describe(TaskLayout(task_id).header)
        raise TaskBeingDeleted(
            f"task {task_id!r} at {where} is being deleted (since "
            f"{header.deleting_at.isoformat()}): run `objmanifest delete --yes` "
            "(Task.delete_by_id) again to finish it"
        )
    return Manifest(store, header, policy, transfer=transfer, header_etag=etag)


def is_current(m: Manifest) -> bool:
    """One conditional GET of the header: is it still the header this object read?"""
    key = m.layout.header
    try:
        blob = m.store.get(key, if_none_match=m.header_etag)
    except NoSuchObject:
        return False
    if blob is None:
        return True
    try:
        header = HeaderCodec(m.task_id).decode(key, blob.body)
    except (CorruptShard, UnsupportedSchema):
        return False
    return header == m.header


def delete(m: Manifest, force: bool = False) -> deletion.Deleted:
    """Mark the header (unless it is marked), then remove everything, the header last."""
    codec = HeaderCodec(m.task_id)
    try:
        header = m.docs.read(m.layout.header, codec)
    except NotFound:
        return deletion.remove_leftovers(m.store, m.layout)
    if header.deleting_at is None:
        shards: list[Shard] = []
        for shard in m.layout.all_shards(m.stages):
            try:
                shards.append(m.read_shard(shard))
            except CorruptShard:
                if not force:
                    raise
        if not force:
            deletion.refuse_live(m.task_id, deletion.live_holders(shards, m.store.now()))
        m.docs.commit(m.layout.header, codec, deletion.MarkDeleting())
    m.docs.flush()  # journal blocks this process is still writing land first
    return deletion.remove_all(m.store, m.layout)


def delete_by_id(store: ObjectStore, task_id: str, *, force: bool = False) -> deletion.Deleted:
    """``delete`` of the task under ``task_id``, also one a crashed delete left."""
    try:
        header, _ = read_header(store, task_id)
    except NoSuchObject:
        return deletion.remove_leftovers(store, TaskLayout(task_id))
    return delete(Manifest(store, header), force=force)
