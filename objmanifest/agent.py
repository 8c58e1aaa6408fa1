"""An agent: claims entries, writes their data under a lease, consumes what others made.

Every change goes through the task's CAS loop with a pure change from ``changes.py``; the
only other I/O here is the data itself (``transfer.py``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, overload

from . import changes, transfer
from .errors import ChecksumMismatch, LeaseLost, NotAConsumer, NotClaimable, NotReady
from .leases import Renewer
from .model import Claim, Entry

if TYPE_CHECKING:
    from .task import Task


class Agent:
    """One worker of a task, known by ``name``; consumers are matched by ``role``.

    Safe to share between threads. Several agents may use one name only if they are the
    same logical worker: a claim is bound to the name and the epoch.
    """

    def __init__(self, task: Task, name: str, role: str | None = None) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"an agent needs a non-empty name, not {name!r}")
        self.task = task
        self.name = name
        self.role = role or name

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, role={self.role!r}, task={self.task.task_id!r})"

    # -- claiming ----------------------------------------------------------------------

    def claim(self, file_id: str | None = None, *, stage: str | None = None) -> Claim | None:
        """Claim ``file_id`` (``NotClaimable`` says why not), or any claimable entry of
        ``stage`` (None if there is none)."""
        if file_id is None:
            if stage is None:
                raise ValueError("claim() needs a file id, or stage= to take any entry of it")
            claims = self.claim_many(stage=stage, limit=1)
            return claims[0] if claims else None
        stage_of = self.task.stage_of(file_id)
        if stage is not None and stage != stage_of:
            raise NotClaimable(file_id, f"it belongs to stage {stage_of!r}, not {stage!r}")
        task = self.task
        current = task.docs.cached(task.shard_key(stage_of), task.codec(stage_of))
        wanted = [current.entries[file_id]] if file_id in current.entries else []
        make_lookup = task.lookup_for(stage_of, wanted)
        result = task.docs.commit(
            task.shard_key(stage_of),
            task.codec(stage_of),
            lambda shard, now: changes.claim(
                shard, file_id, self.name, now, task.rules, make_lookup(shard)
            ),
        )
        if isinstance(result, NotClaimable):
            raise result
        return result

    def claim_many(self, stage: str, limit: int = 50) -> list[Claim]:
        """Claim up to ``limit`` claimable entries of ``stage`` in one commit."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        task = self.task
        current = task.docs.cached(task.shard_key(stage), task.codec(stage))
        make_lookup = task.lookup_for(stage, current.entries.values())
        return task.docs.commit(
            task.shard_key(stage),
            task.codec(stage),
            lambda shard, now: changes.claim_any(
                shard, self.name, limit, now, task.rules, make_lookup(shard)
            ),
        )

    # -- holding -----------------------------------------------------------------------

    def _check_holder(self, claim: Claim) -> None:
        if claim.agent != self.name or claim.task_id != self.task.task_id:
            raise LeaseLost(
                f"claim on {claim.file_id!r} belongs to agent {claim.agent!r} of task "
                f"{claim.task_id!r}, not to {self.name!r} of {self.task.task_id!r}"
            )

    def renew(self, claim: Claim) -> Claim:
        """Move the lease forward (``LeaseLost`` if the claim was fenced)."""
        self._check_holder(claim)
        task = self.task
        return task.docs.commit(
            task.shard_key(claim.stage),
            task.codec(claim.stage),
            lambda shard, now: changes.renew(shard, claim, now, task.rules),
        )

    def put(self, claim: Claim, data: transfer.Source) -> Entry:
        """Store the claim's data and make the entry ready.

        The lease is renewed in the background while the data is written, so a write that
        takes longer than the lease is not fenced while this agent is alive. A fenced
        holder gets ``LeaseLost``; its bytes are at a key of its own and never visible.
        """
        self._check_holder(claim)
        task = self.task
        key = transfer.data_key(claim.task_id, claim.stage, claim.file_id, claim.epoch)
        with Renewer(lambda: self.renew(claim), task.lease_seconds / 3, claim.file_id):
            stored = transfer.upload(task.store, key, transfer.read_source(data))
        try:
            return task.docs.commit(
                task.shard_key(claim.stage),
                task.codec(claim.stage),
                lambda shard, now: changes.finish(
                    shard, claim, stored.key, stored.checksum, stored.size, now
                ),
            )
        except LeaseLost:
            with contextlib.suppress(Exception):
                task.store.delete(stored.key)  # nobody can reference a fenced epoch's key
            raise

    def fail(self, claim: Claim, reason: str) -> Entry:
        """Give the entry up: it becomes failed (claimable again) or dead."""
        self._check_holder(claim)
        task = self.task
        return task.docs.commit(
            task.shard_key(claim.stage),
            task.codec(claim.stage),
            lambda shard, now: changes.fail(shard, claim, reason, now, task.rules),
        )

    # -- consuming ---------------------------------------------------------------------

    def _consumer(self, entry: Entry) -> str:
        """Who marks: the agent for a queue entry, the role for one with named consumers."""
        if entry.is_queue:
            return self.name
        if self.role not in entry.consumers:
            raise NotAConsumer(
                f"role {self.role!r} is not a consumer of {entry.file_id!r} "
                f"(its consumers are {', '.join(entry.consumers)})"
            )
        return self.role

    @overload
    def consume(self, file_id: str, dest: None = None) -> bytes: ...
    @overload
    def consume(self, file_id: str, dest: str | os.PathLike[str]) -> Entry: ...

    def consume(self, file_id: str, dest: str | os.PathLike[str] | None = None) -> bytes | Entry:
        """Download and verify the data, then mark it consumed.

        Returns the bytes, or with ``dest`` streams them to that path and returns the
        entry. Consuming again what this consumer consumed before returns the data again.
        A checksum mismatch moves the entry to failed, so it is produced again.
        """
        task = self.task
        for _ in range(5):
            entry = task.entry(file_id)
            consumer = self._consumer(entry)
            changes.check_consumable(entry, consumer)
            key, digest, size = entry.key, entry.checksum, entry.size
            assert key is not None and digest is not None and size is not None
            try:
                if dest is None:
                    result: bytes | Path = transfer.download(task.store, file_id, key, digest, size)
                else:
                    result = transfer.download_to(task.store, file_id, key, digest, size, dest)
            except ChecksumMismatch as e:
                failed = task.docs.commit(
                    task.shard_key(entry.stage),
                    task.codec(entry.stage),
                    lambda shard, now: changes.mismatch(
                        shard, file_id, key, digest, str(e), now, task.rules
                    ),
                )
                raise ChecksumMismatch(
                    f"{e}; the entry is now {failed.state.value}, so it will be produced again"
                    if failed.state.value == "failed"
                    else f"{e}; the entry is now {failed.state.value}"
                ) from None
            try:
                marked = task.docs.commit(
                    task.shard_key(entry.stage),
                    task.codec(entry.stage),
                    lambda shard, now: changes.consume(
                        shard, file_id, consumer, key, digest, now
                    ),
                )
            except changes.DataChanged:
                continue  # produced again while we read it: read the new data
            return result if isinstance(result, bytes) else marked
        raise NotReady(f"{file_id!r} kept being produced again while it was read; try later")
