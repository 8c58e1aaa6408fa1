"""Reading a chunked entry: parallel ranged GETs, each part verified as it streams.

A consumer reads the part list from the upload state, checks it against the entry's
composite checksum, then fetches parts in parallel, verifying each part's xxh3, and hashes
the whole object in order as the parts arrive (``transfer.InOrder``) to check the entry's
``whole_checksum`` too. With a destination the bytes go to a temporary file beside it that
is moved into place only once every part and the whole matched.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ...core import checksum
from ...core.model import Entry
from ...core.runtime import Runtime
from ...errors import Cancelled, ChecksumMismatch, DataChanged, NotFound, StoreError
from ...store import ObjectStore
from ...store.errors import NoSuchObject
from .. import transfer
from ..transfer import Destination, InOrder, Progress, TransferConfig
from .scope import Scope
from .state import Part, read_state

log = logging.getLogger(__name__)

FETCH_TRIES = 3


def load_parts(scope: Scope, entry: Entry) -> list[Part]:
    """The entry's part list, checked against its composite checksum.

    ``DataChanged`` if the entry was produced again meanwhile; ``ChecksumMismatch`` if the
    list does not match an unchanged entry.
    """
    return _load(scope, entry)[0]


def _load(scope: Scope, entry: Entry) -> tuple[list[Part], str | None]:
    """The entry's part list (as ``load_parts``), and the whole object's checksum to verify:
    the entry's ``whole_checksum`` when the upload state binds it to its upload, else None
    (an entry produced by a release before 0.3.0, or produced again by one).

    Without an upload state to read (deleted, or damaged: ``repair`` rebuilds it), the part
    list is derived from the entry's size and part size, with no digest per part: the
    parts' digests are then checked together against the entry's composite checksum once
    all arrived (``derived``); the ``whole_checksum`` is not (only the upload state says
    which upload it was sealed for)."""
    assert entry.parts_key is not None and entry.part_size is not None
    problem = _parts_problem(scope, entry)
    if problem is None:
        log.warning(
            "%s: its part list %s is missing or unreadable (`objmanifest repair` rebuilds "
            "it); its parts are verified together against the entry's checksum",
            entry.file_id,
            scope.store.describe(entry.parts_key),
        )
        return derived(entry), None
    if not isinstance(problem, str):
        return problem
    fresh = scope.entry(entry.stage, entry.file_id)
    if fresh is None or (fresh.key, fresh.checksum) != (entry.key, entry.checksum):
        raise DataChanged(entry.file_id)
    raise ChecksumMismatch(
        f"{entry.file_id!r}: the part list {scope.store.describe(entry.parts_key)} does not "
        f"match the entry: {problem}"
    )


def derived(entry: Entry) -> list[Part]:
    """The parts of a chunked entry as its size and part size imply them, with no digest
    or ETag (``""``): what a reader verifies when the part list is gone."""
    assert entry.size is not None and entry.part_size is not None
    count = max(1, -(-entry.size // entry.part_size))
    return [
        (n, min(entry.part_size, entry.size - (n - 1) * entry.part_size), "", "")
        for n in range(1, count + 1)
    ]


def _parts_problem(scope: Scope, entry: Entry) -> tuple[list[Part], str | None] | str | None:
    """The part list and whole checksum to verify; what is wrong with the upload state; or
    None if there is none to read."""
    assert entry.parts_key is not None and entry.part_size is not None
    doc = read_state(scope.store, scope.layout, entry.parts_key)
    if doc is None:
        return None
    parts = list(doc.parts)
    if doc.key != entry.key or doc.part_size != entry.part_size:
        return f"it describes {doc.key} with part size {doc.part_size}"
    if [p[0] for p in parts] != list(range(1, len(parts) + 1)):
        return "its part numbers are not 1..N"
    if any(p[1] != entry.part_size for p in parts[:-1]) or sum(p[1] for p in parts) != entry.size:
        return "its part sizes do not add up to the entry's size"
    if checksum.composite((p[2] for p in parts), entry.part_size) != entry.checksum:
        return "its part digests do not make the entry's checksum"
    whole = entry.whole_checksum
    if whole is not None and doc.whole != (doc.upload_id, whole):
        log.info(
            "%s: its whole_checksum is not the one sealed for upload %s (%s): produced by a "
            "release before 0.3.0, only its parts are verified",
            entry.file_id,
            doc.upload_id,
            doc.whole,
        )
        whole = None
    return parts, whole


def download(
    scope: Scope,
    entry: Entry,
    dest: Destination | None,
    config: TransferConfig,
    *,
    range_size: int | None = None,
    progress: Progress | None = None,
    stop: Callable[[], None] = lambda: None,
    seal: Callable[[], None] = lambda: None,
) -> bytes | Path:
    """Fetch a chunked entry with parallel ranged GETs, verifying each part as it streams.

    With ``dest`` the bytes go to a temporary file (``os.pwrite`` at each part's offset)
    that is put in place only once every part matched (``transfer.writing``); without, they are
    returned. A part is fetched in ranges of at most ``range_size`` bytes, resuming after a
    broken connection where it stopped; it is verified whole. ``stop`` may raise between
    chunks of every part, and once the bytes are verified; ``seal`` runs as
    ``transfer.writing`` says (a consume's mark: refused, it leaves ``dest`` as it was).
    ``NotFound`` naming the object if it is not there.
    """
    parts, whole = _load(scope, entry)
    assert entry.key is not None and entry.size is not None
    try:
        head = scope.store.head(entry.key)
    except NoSuchObject as e:
        raise NotFound(str(e)) from e
    if head.size != entry.size:
        raise ChecksumMismatch(
            f"{entry.file_id!r}: {scope.store.describe(entry.key)} holds {head.size} bytes, "
            f"but the manifest recorded {entry.size}"
        )
    fetch = _Fetch(scope.store, entry, parts, config, range_size, progress, stop)
    if dest is None:
        memory = _MemorySink(entry.size)
        fetch.run(memory)
        _check_parts(scope.store, entry, fetch)
        _check_whole(scope.store, entry, fetch, whole)
        return bytes(memory.buffer)
    with transfer.writing(dest, entry.size, seal) as fd:
        fetch.run(_FileSink(fd))
        _check_parts(scope.store, entry, fetch)
        _check_whole(scope.store, entry, fetch, whole)
        stop()
    return dest.target


def _check_parts(store: ObjectStore, entry: Entry, fetch: _Fetch) -> None:
    """Parts fetched without a digest each (a derived part list) must make the entry's
    composite checksum together."""
    if not fetch.unchecked:
        return
    assert entry.part_size is not None and entry.key is not None
    digests = [fetch.unchecked[n] for n in sorted(fetch.unchecked)]
    got = checksum.composite(digests, entry.part_size)
    if got != entry.checksum:
        raise ChecksumMismatch(
            f"{entry.file_id!r}: the parts of {store.describe(entry.key)} make {got}, but the "
            f"manifest recorded {entry.checksum} (its part list is missing, so its parts "
            "were checked together)"
        )


def _check_whole(store: ObjectStore, entry: Entry, fetch: _Fetch, expected: str | None) -> None:
    """Every part matched; the whole object, hashed in order, must match as well."""
    if expected is None:
        return
    assert entry.size is not None and entry.key is not None
    got = fetch.whole.checksum(entry.size) if fetch.whole is not None else None
    if got != expected:
        raise ChecksumMismatch(
            f"{entry.file_id!r}: {store.describe(entry.key)} has xxh3 {got} as a whole, but "
            f"the manifest recorded {expected} (every part matched its own digest)"
        )


class _MemorySink:
    """Parts written into one buffer, each at its offset."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)

    def write(self, offset: int, data: bytes) -> None:
        self.view[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> memoryview:
        return self.view[offset : offset + length]

    def part_done(self, size: int) -> None:
        pass


class _FileSink:
    """Parts written into a file at their offsets, flushed to disk as they finish (by the
    worker that crossed ``SYNC_EVERY``, while the others keep fetching), so the fsync before
    the file is moved into place has little left to write."""

    SYNC_EVERY = 64 * transfer.MiB

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.unsynced = 0
        self.lock = threading.Lock()
        self.syncing = threading.Lock()

    def write(self, offset: int, data: bytes) -> None:
        transfer.write_all(self.fd, data, offset)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def part_done(self, size: int) -> None:
        with self.lock:
            self.unsynced += size
            due = self.unsynced >= self.SYNC_EVERY
            if due:
                self.unsynced = 0
        if due and self.syncing.acquire(blocking=False):
            try:
                getattr(os, "fdatasync", os.fsync)(self.fd)
            finally:
                self.syncing.release()


Sink = _MemorySink | _FileSink


class _Fetch:
    """Fetches and verifies parts in parallel; the first failure stops the others."""

    def __init__(
        self,
        store: ObjectStore,
        entry: Entry,
        parts: list[Part],
        config: TransferConfig,
        range_size: int | None,
        progress: Progress | None,
        stop: Callable[[], None] = lambda: None,
    ) -> None:
        assert entry.key is not None and entry.part_size is not None
        self.store, self.entry, self.key, self.parts = store, entry, entry.key, parts
        self.part_size = entry.part_size
        self.range_size = range_size or entry.part_size
        self.runtime: Runtime = store.runtime
        self.concurrency = max(1, min(config.concurrency, store.connections, len(parts)))
        self.progress = progress
        self.stop = stop
        self.cancelled = threading.Event()
        self.whole: InOrder | None = None
        self.unchecked: dict[int, str] = {}
        """Part number -> digest, of the parts that had none to be checked against."""

    def run(self, sink: Sink) -> None:
        done = 0
        self.whole = InOrder(sink.read)
        with self.runtime.pool(self.concurrency, "om-fetch") as pool:
            futures = [pool.submit(self._part, part, sink) for part in self.parts]
            try:
                for future in cf.as_completed(futures):
                    done += future.result()
                    if self.progress is not None:
                        self.progress(done, self.entry.size)
            except BaseException:
                self.cancelled.set()
                for future in futures:
                    future.cancel()
                raise

    def _part(self, part: Part, sink: Sink) -> int:
        number, size, expected, _ = part
        cursor = _Cursor(
            start=(number - 1) * self.part_size, end=(number - 1) * self.part_size + size
        )
        tries = 0
        while cursor.position < cursor.end:
            try:
                self._range(cursor, min(cursor.end, cursor.position + self.range_size), sink)
            except (OSError, StoreError) as e:
                tries += 1
                if tries >= FETCH_TRIES or self.cancelled.is_set():
                    raise StoreError(
                        f"could not read part {number} of {self.store.describe(self.key)} "
                        f"after {tries} tries: {e}"
                    ) from e
                log.info(
                    "part %d of %s broke off at byte %d, resuming: %s",
                    number,
                    self.key,
                    cursor.position,
                    e,
                )
        if not expected:  # a derived part list: checked together by _check_parts
            self.unchecked[number] = cursor.digest.hexdigest()
        elif cursor.digest.hexdigest() != expected:
            raise ChecksumMismatch(
                f"{self.entry.file_id!r}: part {number} of {len(self.parts)} (bytes "
                f"{cursor.start}-{cursor.end - 1}) of {self.store.describe(self.key)} has xxh3 "
                f"{cursor.digest.hexdigest()}, but the manifest recorded {expected}"
            )
        if self.whole is not None:
            self.whole.done(cursor.start, size)
        sink.part_done(size)
        return size

    def _range(self, cursor: _Cursor, end: int, sink: Sink) -> None:
        """Stream ``[cursor.position, end)`` into the part's digest and the sink; the cursor
        keeps what arrived, so a broken connection resumes where it stopped."""
        opened = transfer.open_data(self.store, self.key, (cursor.position, end))
        with contextlib.closing(opened) as body:
            while cursor.position < end:
                if self.cancelled.is_set():
                    raise Cancelled()
                self.stop()
                chunk = body.read(min(transfer.READ_CHUNK, end - cursor.position))
                if not chunk:
                    raise ChecksumMismatch(
                        f"{self.entry.file_id!r}: {self.store.describe(self.key)} ended at byte "
                        f"{cursor.position}, before the recorded {self.entry.size} bytes"
                    )
                cursor.digest.update(chunk)
                sink.write(cursor.position, chunk)
                cursor.position += len(chunk)


@dataclass
class _Cursor:
    """How far one part has arrived, and the digest of what arrived."""

    start: int
    end: int
    position: int = -1
    digest: Any = field(default_factory=xxhash.xxh3_128)

    def __post_init__(self) -> None:
        if self.position < 0:
            self.position = self.start
