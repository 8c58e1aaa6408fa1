"""Journal blocks: whole blocks of an object's records, written once each in the background
by the commit loop, and how a block's versions are numbered."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from ..core.model import JournalBlock, JournalRecord
from ..errors import (
    ObjManifestError,
)
from ..store import CREATE, ObjectStore
from ..store.errors import OutcomeUnknown, PreconditionFailed
from .policy import Stats

BLOCK = 32

log = logging.getLogger(__name__)


"""Journal records per block: one block PUT per this many commits of an object, so the
journal costs about 1/32 of a request per commit, and an object carries at most about
twice this many records."""


BlockKey = Callable[[str, str, int, int], str]


"""(object key, journal id, first version, last version) -> the block's key."""


def block_end(version: int) -> int:
    """The last version of the block ``version`` belongs to: blocks end at multiples of
    ``BLOCK``."""
    return -(-version // BLOCK) * BLOCK


class BlockWriter:
    """Writes whole blocks of journal records in the background, one at a time, and
    remembers which blocks are stored, so a commit drops only records a block holds.

    A block is the records of one object incarnation that end at a multiple of ``BLOCK``;
    it is whole once the object carries the record of its last version (it starts at the
    oldest record the object carries in its range: after a migration, the first block
    starts at the first journaled version).
    """

    def __init__(self, store: ObjectStore, stats: Stats, block_key: BlockKey | None) -> None:
        self.store = store
        self.stats = stats
        self.block_key = block_key
        self._stored: dict[tuple[str, str], set[int]] = {}
        """Per (key, journal id), the ends of the blocks known to be stored."""
        self._started: dict[tuple[str, str, int], cf.Future[None]] = {}
        self._failed: set[tuple[str, str, int]] = set()
        """Blocks whose write here failed: sent again by the next commit of the object."""
        self._guard = threading.RLock()  # held while a job is submitted; a job takes it too
        self._pool: cf.Executor | None = None

    def unstored(
        self, key: str, journal_id: str, records: Sequence[JournalRecord]
    ) -> Sequence[JournalRecord]:
        if not records:
            return records
        low, high = block_end(records[0].version), block_end(records[-1].version)
        with self._guard:
            stored = self._stored.get((key, journal_id), set())
            if stored.isdisjoint(range(low, high + 1, BLOCK)):
                return records  # the usual case: no block carried is stored
            return [r for r in records if block_end(r.version) not in stored]

    def write_due(
        self, key: str, journal_id: str, records: Sequence[JournalRecord], since: int
    ) -> None:
        """Start writing, in the background, the whole blocks of ``records`` that the write
        whose first version was ``since`` made whole (and any block a write of this process
        failed to store). A block made whole by another process is that process's to write;
        if it did not live to, ``store_old`` writes it before the object carries two more
        blocks' worth, so every writer, however short-lived, keeps the object bounded."""
        if self.block_key is None or not records:
            return
        with self._guard:
            done = [j for j, f in self._started.items() if f.done()]
            for job in done:  # stored, or failed and due to be sent again
                if job[2] not in self._stored.get(job[:2], ()):
                    self._failed.add(job)
                del self._started[job]
        low, last = block_end(records[0].version), records[-1].version
        for end in range(low, last + 1, BLOCK):  # the blocks that may be whole
            job = (key, journal_id, end)
            with self._guard:
                # A stored block is not sent again, though the doc still carries it.
                if job in self._started or end in self._stored.get((key, journal_id), ()):
                    continue
                if end < since and job not in self._failed:
                    continue  # made whole by an earlier write: not this one's to send
                block = [r for r in records if block_end(r.version) == end]
                # A block is whole once it holds its last version (records are contiguous:
                # each version adds the next; only whole blocks leave).
                if not block or block[-1].version != end:
                    continue
                if self._pool is None:
                    self._pool = self.store.runtime.pool(1, "objmanifest-journal")
                self._failed.discard(job)
                self._started[job] = self._pool.submit(self._write, key, journal_id, block)

    def store_old(
        self, key: str, journal_id: str | None, records: Sequence[JournalRecord], version: int
    ) -> None:
        """Before a write of version ``version + 1``, store every whole block of ``records``
        that ends a whole block or more before it and is not known to be stored (waiting for
        this process's own write of it, else writing it now), so the next version drops
        them: an object carries fewer than ``2 * BLOCK`` records, also when each commit
        comes from a new process that knows of no block stored. Writes here only what
        nobody stored in time (a 412: somebody did; it counts as stored)."""
        if self.block_key is None or journal_id is None or not records:
            return
        for end in range(block_end(records[0].version), version + 1 - BLOCK + 1, BLOCK):
            job = (key, journal_id, end)
            with self._guard:
                if end in self._stored.get((key, journal_id), ()):
                    continue
                running = self._started.get(job)
            if running is not None:
                running.result()  # a failure is logged by the job itself
                with self._guard:
                    if end in self._stored.get((key, journal_id), ()):
                        continue
            block = [r for r in records if block_end(r.version) == end]
            if block and block[-1].version == end:
                self._write(key, journal_id, block)

    def _write(self, key: str, journal_id: str, records: list[JournalRecord]) -> None:
        first, last = records[0].version, records[-1].version
        assert self.block_key is not None
        block_key = self.block_key(key, journal_id, first, last)
        block = JournalBlock(
            object_key=key, journal_id=journal_id, first=first, last=last, records=tuple(records)
        )
        try:
            # A 412: written already, by another agent or an earlier attempt of ours.
            with contextlib.suppress(PreconditionFailed):
                body = block.model_dump_json(exclude_none=True).encode()
                self.store.put(block_key, body, mode=CREATE)
            self.stats.count("journal_blocks")
            with self._guard:
                self._stored.setdefault((key, journal_id), set()).add(last)
        except (ObjManifestError, OutcomeUnknown) as e:
            # The records stay in the object; whoever commits to it next tries again.
            log.warning("could not write journal block %s: %s", block_key, e)

    def flush(self) -> None:
        """Wait until every block started so far is written (or failed)."""
        with self._guard:
            started = list(self._started.values())
        cf.wait(started)
