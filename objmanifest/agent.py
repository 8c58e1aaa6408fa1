"""An agent: claims entries, writes their data under a lease, consumes what others made.

Every change goes through the task's CAS loop as a named command from ``core.commands``;
the data itself goes up through ``engine.producing`` (one object, a chunked upload, a
batch) and comes back through ``engine.consuming`` (fetched, verified, marked). Side
effects of the transitions an agent causes (an upload to abort) run from the task's commit
events, not from here.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import overload

from .core import changes, commands, operator_changes
from .core.leases import Renewer, held_by_another
from .core.model import Claim, Entry, Stored
from .core.names import check_agent, error_text
from .core.pacing import Pace
from .data import sources, transfer
from .data.errors import SealRefused
from .engine import consuming, producing, reads
from .engine.declaring import lookup_for, resumed
from .engine.manifest import Manifest
from .errors import (
    ChecksumMismatch,
    DataChanged,
    Interrupted,
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


def checkpoint(stop: threading.Event | None, what: str) -> Callable[[], None]:
    """A check that raises ``Interrupted(what)`` once ``stop`` is set (never without one):
    how a caller in another thread (``objmanifest.aio``, cancelled) stops a transfer at a
    point where nothing half-done is left."""

    def check() -> None:
        if stop is not None and stop.is_set():
            raise Interrupted(what)

    return check


class Agent:
    """One worker of a task, known by ``name``; consumers are matched by ``role``.

    Safe to share between threads. Several agents may use one name only if they are the
    same logical worker: a claim is bound to the name and the epoch.
    """

    def __init__(self, engine: Manifest, name: str, role: str | None = None) -> None:
        self._engine = engine
        self._name = check_agent("agent name", name)
        self._role = name if role is None or role == "" else check_agent("consumer role", role)
        self._homes: dict[str, tuple[str, bool]] = {}
        """Per split stage, the partition its claims by stage start at, and whether it was
        settled there by a claim that lost no race (``_home_of``)."""

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, role={self.role!r}, task={self._engine.task_id!r})"

    @property
    def name(self) -> str:
        """The agent's name: every claim and commit of this agent carries it."""
        return self._name

    @property
    def role(self) -> str:
        """The consumer role this agent marks entries with named consumers as."""
        return self._role

    # -- claiming ----------------------------------------------------------------------

    def claim(self, file_id: str | None = None, *, stage: str | None = None) -> Claim | None:
        """Claim ``file_id`` (``NotClaimable`` says why not), or any claimable entry of
        ``stage`` (None if there is none)."""
        if file_id is None:
            if stage is None:
                raise InvalidInput("claim() needs a file id, or stage= to take any entry of it")
            claims = self.claim_many(stage=stage, limit=1)
            return claims[0] if claims else None
        engine = self._engine
        stage_of = engine.stage_of(file_id)
        if stage is not None and stage != stage_of:
            raise NotClaimable(file_id, f"it belongs to stage {stage_of!r}, not {stage!r}")
        shard = engine.layout.shard_of(stage_of, file_id)
        current = engine.claim_base(shard)
        wanted = [current.entries[file_id]] if file_id in current.entries else []
        result = engine.docs.commit(
            engine.layout.shard(shard),
            engine.codec(shard),
            commands.ClaimEntry(
                file_id, self.name, engine.rules, lookup_for(engine, shard, wanted)
            ),
        )
        if isinstance(result, NotClaimable):
            raise result
        return result

    def claim_many(self, stage: str, limit: int = 50) -> list[Claim]:
        """Claim up to ``limit`` claimable entries of ``stage`` in one commit per shard."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput(f"limit must be a whole number of at least 1, not {limit!r}")
        engine = self._engine
        engine.check_stage(stage)  # refuses an unknown stage, without a request
        shards = engine.layout.stage_shards(stage)
        only = stage if engine.layout.single else None
        claims: list[Claim] = []
        start, exploring = self._home_of(stage, shards)
        ahead = itertools.chain(range(start, len(shards)), range(start))
        passed: deque[str] = deque()
        now = engine.store.now() if exploring else None
        while True:
            number = next(ahead, None)
            looking = number is not None
            if number is not None:
                shard = shards[number]
            elif passed:
                shard = passed.popleft()
            else:
                break
            current = engine.claim_base(shard)
            if (
                looking
                and now is not None
                and held_by_another(current.entries.values(), self.name, now)
            ):
                passed.append(shard)  # another agent works here: look further first
                continue
            lookups = lookup_for(engine, shard, current.entries.values())
            key = engine.layout.shard(shard)
            began = engine.store.runtime.monotonic()
            found = engine.docs.commit(
                key,
                engine.codec(shard),
                commands.ClaimAny(self.name, limit - len(claims), engine.rules, lookups, only),
            )
            claims += found
            if found and len(shards) > 1:
                self._settle_home(stage, shards, shard, engine.docs.lost_since(key, began))
            if len(claims) >= limit:
                break
        return claims

    def _home_of(self, stage: str, shards: tuple[str, ...]) -> tuple[int, bool]:
        """Where a claim by stage of a split stage starts: this agent's home partition, the
        last one it claimed from (at first a random one); and whether it is still looking
        for a home of its own (none yet, or it just lost a race for the last one), when a
        partition another agent works in is passed over while others remain."""
        if len(shards) == 1:
            return 0, False
        home = self._homes.get(stage)
        number = None if home is None else self._engine.layout.partition_number(stage, home[0])
        if home is None or number is None:
            return self._random_index(len(shards)), True
        return number, not home[1]

    def _random_index(self, n: int) -> int:
        """A random whole number in [0, n), from the runtime's randomness."""
        return int(self._engine.store.runtime.random() * n) % n

    def _settle_home(self, stage: str, shards: tuple[str, ...], shard: str, lost: bool) -> None:
        """Stay where claims were found, unless a race for it was lost on the way: another
        agent works there too, so the next claim starts at a random other partition (any
        but ``shard``), and looks for one nobody works in. Agents of one stage so spread
        out until each has a partition of its own."""
        if lost:
            other = self._random_index(len(shards) - 1)
            if other >= (self._engine.layout.partition_number(stage, shard) or 0):
                other += 1  # the partitions after ``shard`` move up by one
            self._homes[stage] = (shards[other], False)
        else:
            self._homes[stage] = (shard, True)

    # -- holding -----------------------------------------------------------------------

    def _check_holder(self, claim: Claim) -> Claim:
        """``claim``, if it is this agent's, routed to the shard its entry lives in (a claim
        rebuilt by another process from its printed fields names only its stage)."""
        if claim.agent != self.name or claim.task_id != self._engine.task_id:
            raise LeaseLost(
                f"claim on {claim.file_id!r} belongs to agent {claim.agent!r} of task "
                f"{claim.task_id!r}, not to {self.name!r} of {self._engine.task_id!r}"
            )
        return self._engine.routed(claim)

    def resume(self, file_id: str, epoch: int) -> Claim:
        """The claim this agent got on ``file_id`` at ``epoch``, rebuilt (by a later process,
        say, from the agent name and epoch the claiming one printed).

        Rebuilding checks nothing: fencing does, on the next change the claim makes
        (``renew``, ``put``, ``fail``, ``release``), which ``LeaseLost`` refuses unless
        this agent still holds the entry at that epoch. The lease expiry is the entry's, or
        the store's time for an entry that has none.
        """
        return self.resume_many([(file_id, epoch)])[0]

    def resume_many(self, held: Iterable[tuple[str, int]]) -> list[Claim]:
        """``resume`` for each (file id, epoch), reading the index and each shard once."""
        return resumed(self._engine, self.name, list(held))

    def renew(self, claim: Claim) -> Claim:
        """Move the lease forward (``LeaseLost`` if the claim was fenced)."""
        claim = self._check_holder(claim)
        engine = self._engine
        return engine.docs.commit(
            engine.layout.shard(claim.shard),
            engine.codec(claim.shard),
            commands.Renew(claim, engine.rules),
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
        stop: threading.Event | None = None,
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

        ``stop`` (set from another thread) is checked before the data, between parts, and
        after the data before the ready commit: once set, ``Interrupted`` is raised and the
        entry stays writing under this claim, never half-ready (a chunked upload's parts
        stay recorded for the next put to adopt). Once the ready commit is sent, ``stop``
        no longer matters: the put ends with the commit's outcome.
        """
        claim = self._check_holder(claim)
        engine = self._engine
        interrupted = checkpoint(
            stop,
            f"the put of {claim.file_id!r} (epoch {claim.epoch}) was stopped before its ready "
            "commit: the entry stays writing under this claim; put it again, release or fail "
            "it, or leave it to a takeover once the lease expires",
        )
        interrupted()
        config = engine.transfer.with_overrides(part_size, concurrency, threshold)
        renewer = Renewer(
            lambda: self.renew(claim),
            engine.header.lease_seconds / 3,
            claim.file_id,
            engine.store.runtime,
        )
        with renewer:
            try:
                stored = producing.store_data(
                    engine,
                    claim,
                    data,
                    config,
                    part_size is not None,
                    progress,
                    lambda: renewer.lost,
                    interrupted=interrupted,
                )
            except (LeaseLost, Interrupted):
                raise
            except ObjManifestError as e:
                producing.raise_if_fenced(self.renew, claim, renewer.lost, e)
                raise
        interrupted()  # the last checkpoint: past it the ready commit is sent
        try:
            entry = self._finish(claim, stored)
        except LeaseLost:
            if stored.parts_key is None:
                producing.drop_fenced_object(engine, stored.key)
            raise
        if progress is not None:
            progress(stored.size, stored.size)
        return entry

    def put_many(
        self,
        claims: Iterable[Claim],
        datas: Iterable[sources.Source],
        *,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
        stop: threading.Event | None = None,
    ) -> list[Entry | Exception]:
        """Store the data of several claims and make their entries ready: ``datas[i]`` is
        the data of ``claims[i]``, each what ``put`` takes.

        The data objects go up ``concurrency`` at a time (default: the task's transfer
        setting, 8; a batch whose datas are all bytes, already in memory, goes up to the
        store's connection pool at a time, 32 by default), each written once at its
        claim's epoch key with its xxh3, as ``put`` writes it; data above ``threshold``
        becomes a chunked entry, sent one at a time with its parts in parallel (memory as
        ``put``'s). Then one commit per shard makes every uploaded entry ready
        (``finish_many``; the shards of a batch are committed in parallel): 100 entries of
        one stage cost one shard commit. While the data goes up, the leases are renewed in
        the background, one commit per claim, every third of the lease.

        Returns a list aligned with ``claims``: each the ready ``Entry``, or the exception
        for that claim alone: ``LeaseLost`` for a claim that was fenced (taken over after
        its lease expired, reaped; its single object is removed and it never becomes
        ready), the upload's error (``FileNotFoundError``, ``StoreError`` ...) for data
        that could not be stored (the claim is still held: ``put`` it again, ``fail`` or
        ``release`` it), the commit's error for every claim of a shard whose commit
        failed. The other claims become ready whatever happened to one.

        Refused before anything is sent: claims and datas of different lengths, a claim
        of another agent or engine, an entry claimed twice in the batch (``InvalidInput``),
        data of a type ``put`` does not take (``TypeError``).

        ``stop`` is checked as ``put`` checks it: once set before the ready commits,
        ``Interrupted`` is raised for the whole batch and every entry stays writing under
        its claim.
        """
        batch = producing.check_batch(self._engine, self.name, claims, datas)
        if not batch:
            return []
        interrupted = checkpoint(
            stop,
            f"put_many of {len(batch)} claims was stopped before its ready commits: every "
            "entry stays writing under its claim; put them again, release or fail them, or "
            "leave them to a takeover once the leases expire",
        )
        interrupted()
        engine = self._engine
        config = engine.transfer.with_overrides(part_size, concurrency, threshold)
        leases = producing.Leases(self.renew, [claim for claim, _ in batch])
        renewer = Renewer(
            leases.renew,
            engine.header.lease_seconds / 3,
            f"{len(batch)}-claims",
            engine.store.runtime,
        )
        with renewer:
            in_memory = concurrency is None and all(
                isinstance(data, (bytes, bytearray, memoryview)) for _, data in batch
            )
            uploaded = producing.upload_many(
                engine,
                self.renew,
                batch,
                config,
                part_size is not None,
                leases,
                interrupted,
                in_memory,
            )
        interrupted()  # the last checkpoint: past it the ready commits are sent
        return producing.finish_many(engine, self.name, uploaded)

    def _finish(self, claim: Claim, stored: Stored) -> Entry:
        engine = self._engine
        return engine.docs.commit(
            engine.layout.shard(claim.shard),
            engine.codec(claim.shard),
            commands.Finish(claim, stored),
        )

    def fail(self, claim: Claim, reason: str) -> Entry:
        """Give the entry up: it becomes failed (claimable again) or dead. ``reason`` is
        stored in the entry, cut to ``names.MAX_ERROR_CHARS`` (1024) characters."""
        claim = self._check_holder(claim)
        engine = self._engine
        return engine.docs.commit(
            engine.layout.shard(claim.shard),
            engine.codec(claim.shard),
            commands.Fail(claim, error_text(reason), engine.rules),
        )

    # -- lifecycle verbs: release ---------------------------------------------

    def release(self, claim: Claim) -> Entry:
        """Give the claim back without spending a retry: the entry becomes pending again
        (failed, if it failed before), claimable by anyone; ``LeaseLost`` (nothing written)
        if the claim was fenced. A chunked entry's upload is kept for the next holder to
        adopt. For a worker told to stop, or one that decides not to do the work."""
        claim = self._check_holder(claim)
        engine = self._engine
        return engine.docs.commit(
            engine.layout.shard(claim.shard),
            engine.codec(claim.shard),
            operator_changes.Release(claim),
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
        stop: threading.Event | None = None,
        wait: float | None = None,
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
        stop: threading.Event | None = None,
        wait: float | None = None,
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
        stop: threading.Event | None = None,
        wait: float | None = None,
    ) -> bytes | Entry:
        """Download and verify the data, then mark it consumed.

        ``wait`` (seconds): while the entry is not ready yet, look again until it is, for
        up to that long (``NotReady`` then); each look is one conditional read of its shard,
        paced by ``core.pacing``: every 0.5 s at most while a producer writes it, slowing to
        one look every 2 s while nothing happens. None (the default): ``NotReady`` at once.

        Returns the bytes, or with ``dest`` writes them to a temporary file beside that path
        and moves it into place once verified and marked consumed, and returns the entry:
        nothing unverified is ever left at ``dest``, and a consume refused at its mark (the
        entry consumed by another meanwhile, say) leaves ``dest`` as it was. If the bytes
        cannot be put in place after the mark, the error says so: consuming again writes
        them. A symlink is followed; an existing file keeps its mode, a new
        one gets ``0666 & ~umask``; a device or a FIFO (``/dev/null``) is written into, never
        replaced, once the bytes are verified (in a temporary file). A directory, or a
        missing parent directory unless ``parents=True``, is refused before anything is
        downloaded. A chunked entry is fetched with ``concurrency`` parallel
        ranged GETs of at most ``part_size`` bytes each (default: its recorded part), and
        each part is verified as it streams. Consuming again what this consumer consumed
        before returns the data again. A checksum mismatch moves the entry to failed, so it
        is produced again; ``ChecksumMismatch`` names the part.

        ``stop`` (set from another thread) is checked while the data streams and once it is
        verified, before it is put in place at ``dest`` and before it is marked: once set,
        ``Interrupted`` is raised, nothing is marked and ``dest`` is as it was.
        """
        if wait is not None:
            return self._consume_waiting(
                file_id, dest, part_size, concurrency, progress, parents, stop, wait
            )
        engine = self._engine
        if part_size is not None:
            transfer.check_part_size(part_size)
        target = None if dest is None else transfer.check_destination(dest, parents)
        config = engine.transfer.with_overrides(concurrency=concurrency)
        left = "" if dest is None else f" and {os.fspath(dest)!r} was left as it was"
        interrupted = checkpoint(
            stop,
            f"the consume of {file_id!r} was stopped before it was marked: nothing was "
            f"marked{left}; consume it again",
        )
        for _ in range(5):
            interrupted()
            entry = reads.entry(engine, file_id)
            consumer = self._consumer(entry)
            changes.check_consumable(entry, consumer)
            sealed: list[Entry] = []  # with dest: marked before the bytes are put there
            seal = consuming.marking(engine, entry, consumer, self.name, sealed)
            try:
                result = consuming.fetch(
                    engine, entry, target, config, part_size, progress, interrupted, seal
                )
            except DataChanged:
                continue  # produced again while we looked: read the new data
            except SealRefused as refused:
                if not isinstance(refused.error, DataChanged):
                    raise refused.error from None
                if target is not None and target.special:  # the stream has the old bytes
                    raise consuming.streamed_stale(file_id, target.given) from None
                continue  # produced again while we read it: read the new data
            except OSError as e:
                if sealed:
                    raise consuming.unplaced(e, file_id, consumer) from e
                raise
            except ChecksumMismatch as e:
                raise consuming.mismatch(engine, entry, e, self.name) from None
            except NotFound as e:  # the data is gone: as bad as wrong data, produce it again
                now = reads.entry(engine, file_id)
                if now.data_removed_at is not None:  # gc removed it after its retention
                    changes.check_consumable(now, consumer)  # raises DataRemoved
                mismatch = ChecksumMismatch(f"{file_id!r}: {e}")
                raise consuming.mismatch(engine, entry, mismatch, self.name) from None
            except ReadBrokeOff as e:
                where = engine.store.describe(entry.key or "")
                raise StoreError(
                    f"reading the data of {file_id!r} from {where} broke off ({e}); nothing "
                    "was marked, consume it again"
                ) from e
            if sealed:
                return sealed[0]
            interrupted()
            try:
                marked = consuming.mark(engine, entry, consumer, self.name)
            except DataChanged:
                continue  # produced again while we read it: read the new data
            return result if isinstance(result, bytes) else marked
        raise NotReady(f"{file_id!r} kept being produced again while it was read; try later")

    def _consume_waiting(
        self,
        file_id: str,
        dest: str | os.PathLike[str] | None,
        part_size: int | None,
        concurrency: int | None,
        progress: transfer.Progress | None,
        parents: bool,
        stop: threading.Event | None,
        wait: float,
    ) -> bytes | Entry:
        """``consume`` until the entry is ready, for up to ``wait`` seconds (``Pace``)."""
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
            raise InvalidInput(f"wait must be a finite number of seconds from 0, not {wait!r}")
        runtime = self._engine.store.runtime
        deadline = runtime.monotonic() + wait
        pace, seen = Pace(), None
        while True:
            try:
                return self.consume(
                    file_id,
                    dest,
                    part_size=part_size,
                    concurrency=concurrency,
                    progress=progress,
                    parents=parents,
                    stop=stop,
                )
            except NotReady as e:
                remaining = deadline - runtime.monotonic()
                if remaining <= 0:
                    raise
                pause = pace.after(changed=e.state != seen, writing=e.state == "writing")
                seen = e.state
            if stop is not None and stop.is_set():
                raise Interrupted(f"the wait for {file_id!r} was stopped; nothing was marked")
            runtime.sleep(min(pause, remaining))
