"""An agent: claims entries, writes their data under a lease, consumes what others made.

Every change goes through the task's CAS loop as a named command from ``changes.py``; the
only other I/O here is the data itself (``transfer.py`` for one object, ``uploads/`` for a
chunked entry). Side effects of the transitions an agent causes (an upload to abort) run
from the task's commit events, not from here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import overload

from . import changes, sources, transfer, uploads, verbs
from .errors import (
    ChecksumMismatch,
    DataChanged,
    InvalidInput,
    LeaseLost,
    NotAConsumer,
    NotClaimable,
    NotFound,
    NotReady,
    ObjManifestError,
    ReadBrokeOff,
    StoreError,
)
from .leases import Renewer
from .manifest import Manifest
from .model import Claim, Entry, State, Stored, check_agent, error_text

log = logging.getLogger(__name__)


class Agent:
    """One worker of a task, known by ``name``; consumers are matched by ``role``.

    Safe to share between threads. Several agents may use one name only if they are the
    same logical worker: a claim is bound to the name and the epoch.
    """

    def __init__(self, task: Manifest, name: str, role: str | None = None) -> None:
        self.task = task
        self.name = check_agent("agent name", name)
        self.role = name if role is None or role == "" else check_agent("consumer role", role)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, role={self.role!r}, task={self.task.task_id!r})"

    # -- claiming ----------------------------------------------------------------------

    def claim(self, file_id: str | None = None, *, stage: str | None = None) -> Claim | None:
        """Claim ``file_id`` (``NotClaimable`` says why not), or any claimable entry of
        ``stage`` (None if there is none)."""
        if file_id is None:
            if stage is None:
                raise InvalidInput("claim() needs a file id, or stage= to take any entry of it")
            claims = self.claim_many(stage=stage, limit=1)
            return claims[0] if claims else None
        task = self.task
        stage_of = task.stage_of(file_id)
        if stage is not None and stage != stage_of:
            raise NotClaimable(file_id, f"it belongs to stage {stage_of!r}, not {stage!r}")
        shard = task.layout.shard_of(stage_of, file_id)
        current = task.read_shard(shard)
        wanted = [current.entries[file_id]] if file_id in current.entries else []
        result = task.docs.commit(
            task.layout.shard(shard),
            task.codec(shard),
            changes.ClaimEntry(file_id, self.name, task.rules, task.lookup_for(shard, wanted)),
        )
        if isinstance(result, NotClaimable):
            raise result
        return result

    def claim_many(self, stage: str, limit: int = 50) -> list[Claim]:
        """Claim up to ``limit`` claimable entries of ``stage`` in one commit per shard."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput(f"limit must be a whole number of at least 1, not {limit!r}")
        task = self.task
        task.check_stage(stage)  # refuses an unknown stage, without a request
        shards = task.layout.shards_of(stage)
        # A split stage: start at a random partition and move on while one has nothing
        # claimable, so that agents of the stage spread over its shards.
        start = int(task.store.runtime.random() * len(shards)) % len(shards)
        only = stage if task.layout.single else None
        claims: list[Claim] = []
        for shard in shards[start:] + shards[:start]:
            current = task.read_shard(shard)
            lookups = task.lookup_for(shard, current.entries.values())
            claims += task.docs.commit(
                task.layout.shard(shard),
                task.codec(shard),
                changes.ClaimAny(self.name, limit - len(claims), task.rules, lookups, only),
            )
            if len(claims) >= limit:
                break
        return claims

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
            task.layout.shard(claim.shard),
            task.codec(claim.shard),
            changes.Renew(claim, task.rules),
        )

    def put(
        self,
        claim: Claim,
        data: sources.Source,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
        progress: transfer.Progress | None = None,
    ) -> Entry:
        """Store the claim's data and make the entry ready.

        ``data`` is bytes, a path, or a binary file. Up to ``threshold`` bytes it is one
        object; above, a chunked entry: parts of ``part_size`` sent ``concurrency`` at a time
        (memory stays within ``concurrency x part_size``; a file's parts are streamed from
        it), recorded so that if this agent dies, the next holder with the same source adopts
        the upload and sends only what is missing. A buffered stream of unknown size
        (``sys.stdin.buffer``) is chunked too, with 64 MiB parts unless told otherwise (so up
        to 625 GiB), but it cannot be resumed: its bytes are gone with its producer.
        Defaults come from the task's ``transfer`` settings. ``progress`` is called as
        ``progress(bytes_done, total_or_None)`` from this thread, after each part.

        The lease is renewed in the background while the data is written, so a write that
        takes longer than the lease is not fenced while this agent is alive. A fenced
        holder gets ``LeaseLost`` and can never make the entry ready.
        """
        self._check_holder(claim)
        task = self.task
        config = task.transfer.with_overrides(part_size, concurrency, threshold)
        renewer = Renewer(
            lambda: self.renew(claim), task.lease_seconds / 3, claim.file_id, task.store.runtime
        )
        with renewer:
            try:
                stored = self._store_data(
                    claim, data, config, part_size is not None, progress, renewer
                )
            except LeaseLost:
                raise
            except ObjManifestError as e:
                self._raise_if_fenced(claim, renewer, e)
                raise
        try:
            entry = self._finish(claim, stored)
        except LeaseLost:
            if stored.parts_key is None:
                self._drop_fenced_object(stored.key)
            raise
        if progress is not None:
            progress(stored.size, stored.size)
        return entry

    def _drop_fenced_object(self, key: str) -> None:
        """A fenced holder's single object: no entry can ever point at its epoch's key."""
        try:
            self.task.store.delete(key)
        except ObjManifestError as e:
            log.warning(
                "could not remove the fenced object %s: %s", self.task.store.describe(key), e
            )

    def _store_data(
        self,
        claim: Claim,
        data: sources.Source,
        config: transfer.TransferConfig,
        explicit: bool,
        progress: transfer.Progress | None,
        renewer: Renewer,
    ) -> Stored:
        """One object for small data, a chunked upload for large data."""
        task = self.task

        def stop() -> None:
            if renewer.lost is not None:
                raise renewer.lost

        with sources.open_source(data, config.threshold) as prepared:
            if prepared.single is not None:
                key = task.layout.data(claim.stage, claim.file_id, claim.epoch)
                return transfer.upload(task.store, key, prepared.single)
            assert prepared.parts is not None
            stored, stats = uploads.upload(
                task.uploads,
                claim,
                prepared.parts,
                config,
                explicit_part_size=explicit,
                progress=progress,
                stop=stop,
            )
            log.info("%s: %s", claim.file_id, stats)
            return stored

    def _raise_if_fenced(self, claim: Claim, renewer: Renewer, error: Exception) -> None:
        """A store error while the lease is lost is reported as the lost lease."""
        lost = renewer.lost
        if lost is None:
            try:
                self.renew(claim)
            except LeaseLost as e:
                lost = e
            except ObjManifestError:
                return
        if lost is not None:
            raise lost from error

    def _finish(self, claim: Claim, stored: Stored) -> Entry:
        task = self.task
        return task.docs.commit(
            task.layout.shard(claim.shard), task.codec(claim.shard), changes.Finish(claim, stored)
        )

    def fail(self, claim: Claim, reason: str) -> Entry:
        """Give the entry up: it becomes failed (claimable again) or dead. ``reason`` is
        stored in the entry, cut to ``model.MAX_ERROR_CHARS`` (1024) characters."""
        self._check_holder(claim)
        task = self.task
        return task.docs.commit(
            task.layout.shard(claim.shard),
            task.codec(claim.shard),
            changes.Fail(claim, error_text(reason), task.rules),
        )

    # -- lifecycle verbs (issue 10: release) ---------------------------------------------

    def release(self, claim: Claim) -> Entry:
        """Give the claim back without spending a retry: the entry becomes pending again
        (failed, if it failed before), claimable by anyone; ``LeaseLost`` (nothing written)
        if the claim was fenced. A chunked entry's upload is kept for the next holder to
        adopt. For a worker told to stop, or one that decides not to do the work."""
        self._check_holder(claim)
        task = self.task
        return task.docs.commit(
            task.layout.shard(claim.shard), task.codec(claim.shard), verbs.Release(claim)
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
    def consume(
        self,
        file_id: str,
        dest: None = None,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> bytes: ...
    @overload
    def consume(
        self,
        file_id: str,
        dest: str | os.PathLike[str],
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> Entry: ...

    def consume(
        self,
        file_id: str,
        dest: str | os.PathLike[str] | None = None,
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        progress: transfer.Progress | None = None,
        parents: bool = False,
    ) -> bytes | Entry:
        """Download and verify the data, then mark it consumed.

        Returns the bytes, or with ``dest`` writes them to a temporary file beside that path
        and moves it into place once verified, and returns the entry: nothing unverified is
        ever left at ``dest``. A symlink is followed; an existing file keeps its mode, a new
        one gets ``0666 & ~umask``; a device or a FIFO (``/dev/null``) is written into, never
        replaced, once the bytes are verified (in a temporary file). A directory, or a
        missing parent directory unless ``parents=True``, is refused before anything is
        downloaded. A chunked entry is fetched with ``concurrency`` parallel
        ranged GETs of at most ``part_size`` bytes each (default: its recorded part), and
        each part is verified as it streams. Consuming again what this consumer consumed
        before returns the data again. A checksum mismatch moves the entry to failed, so it
        is produced again; ``ChecksumMismatch`` names the part.
        """
        task = self.task
        if part_size is not None:
            transfer.check_part_size(part_size)
        target = None if dest is None else transfer.check_destination(dest, parents)
        config = task.transfer.with_overrides(concurrency=concurrency)
        for _ in range(5):
            entry = task.entry(file_id)
            consumer = self._consumer(entry)
            changes.check_consumable(entry, consumer)
            try:
                result = self._fetch(entry, target, config, part_size, progress)
            except DataChanged:
                continue  # produced again while we looked: read the new data
            except ChecksumMismatch as e:
                raise self._mismatch(entry, e) from None
            except NotFound as e:  # the data is gone: as bad as wrong data, produce it again
                now = task.entry(file_id)
                if now.data_removed_at is not None:  # gc removed it after its retention
                    changes.check_consumable(now, consumer)  # raises DataRemoved
                raise self._mismatch(entry, ChecksumMismatch(f"{file_id!r}: {e}")) from None
            except ReadBrokeOff as e:
                raise StoreError(
                    f"reading the data of {file_id!r} from {task.store.describe(entry.key or '')} "
                    f"broke off ({e}); nothing was marked, consume it again"
                ) from e
            try:
                marked = self._mark(entry, consumer)
            except DataChanged:
                continue  # produced again while we read it: read the new data
            return result if isinstance(result, bytes) else marked
        raise NotReady(f"{file_id!r} kept being produced again while it was read; try later")

    def _mark(self, entry: Entry, consumer: str) -> Entry:
        task = self.task
        key, digest = entry.key, entry.checksum
        assert key is not None and digest is not None
        shard = task.layout.shard_of(entry.stage, entry.file_id)
        return task.docs.commit(
            task.layout.shard(shard),
            task.codec(shard),
            changes.Consume(entry.file_id, consumer, key, digest, actor=self.name),
        )

    def _fetch(
        self,
        entry: Entry,
        dest: transfer.Destination | None,
        config: transfer.TransferConfig,
        part_size: int | None,
        progress: transfer.Progress | None,
    ) -> bytes | Path:
        store = self.task.store
        if entry.is_chunked:
            return uploads.download(
                self.task.uploads, entry, dest, config, range_size=part_size, progress=progress
            )
        key, digest, size = entry.key, entry.checksum, entry.size
        assert key is not None and digest is not None and size is not None
        if dest is None:
            result: bytes | Path = transfer.download(store, entry.file_id, key, digest, size)
        else:
            result = transfer.download_to(store, entry.file_id, key, digest, size, dest)
        if progress is not None:
            progress(size, size)
        return result

    def _mismatch(self, entry: Entry, error: ChecksumMismatch) -> ChecksumMismatch:
        """Record bad data so it is produced again; the error says what became of it.

        A chunked entry's upload is marked first, so no later holder adopts the bad object
        back; if that mark cannot be written, the entry is left as it is (the next consumer
        finds the mismatch again) and the error says so.
        """
        task = self.task
        key, digest = entry.key, entry.checksum
        assert key is not None and digest is not None
        try:
            uploads.reject_data(task.uploads, entry)
        except ObjManifestError as e:
            return ChecksumMismatch(
                f"{error}; the bad data could not be marked ({e}), so the entry was left "
                "ready: consume it again to retry"
            )
        shard = task.layout.shard_of(entry.stage, entry.file_id)
        failed = task.docs.commit(
            task.layout.shard(shard),
            task.codec(shard),
            changes.Mismatch(
                entry.file_id, key, digest, error_text(str(error)), task.rules, actor=self.name
            ),
        )
        if failed.state is State.failed:
            return ChecksumMismatch(
                f"{error}; the entry is now failed, so it will be produced again"
            )
        return ChecksumMismatch(f"{error}; the entry is now {failed.state.value}")
