"""How an agent's read of an entry is fetched, verified and marked: the data of one
object or of a chunked entry, the consumed mark, and bad data recorded so it is produced
again. ``Agent.consume`` is built on these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..core import changes, commands
from ..core.model import Entry
from ..core.names import error_text
from ..core.states import State
from ..data import chunked, transfer
from ..errors import ChecksumMismatch, NotFound, NotReady, ObjManifestError
from . import reads
from .manifest import Manifest


def fetch(
    task: Manifest,
    entry: Entry,
    dest: transfer.Destination | None,
    config: transfer.TransferConfig,
    part_size: int | None,
    progress: transfer.Progress | None,
    stop: Callable[[], None],
    seal: Callable[[], None] = lambda: None,
) -> bytes | Path:
    """The entry's data, verified: its bytes, or with ``dest`` the path it was put at, once
    ``seal`` (the mark) passed."""
    store = task.store
    if entry.is_chunked:
        return chunked.download(
            task.uploads,
            entry,
            dest,
            config,
            range_size=part_size,
            progress=progress,
            stop=stop,
            seal=seal,
        )
    key, digest, size = entry.key, entry.checksum, entry.size
    assert key is not None and digest is not None and size is not None
    if dest is None:
        data = transfer.download(store, entry.file_id, key, digest, size, stop)
        if progress is not None:
            progress(size, size)
        return data

    def told_then_sealed() -> None:  # progress told before the mark, as a part's is
        if progress is not None:
            progress(size, size)
        seal()

    return transfer.download_to(
        store, entry.file_id, key, digest, size, dest, stop, told_then_sealed
    )


def mark(task: Manifest, entry: Entry, consumer: str, actor: str) -> Entry:
    key, digest = entry.key, entry.checksum
    assert key is not None and digest is not None
    shard = task.layout.shard_of(entry.stage, entry.file_id)
    try:
        return task.docs.commit(
            task.layout.shard(shard),
            task.codec(shard),
            commands.Consume(entry.file_id, consumer, key, digest, actor=actor),
        )
    except NotFound:
        # Archived (before this read, or since): terminal, so there is nothing to mark;
        # a consumer that had consumed it reads it again, any other is refused.
        archived = reads.entry(task, entry.file_id)
        if (archived.key, archived.checksum) != (key, digest):
            raise
        if changes.check_consumable(archived, consumer):
            return archived
        raise


def marking(
    task: Manifest, entry: Entry, consumer: str, actor: str, sealed: list[Entry]
) -> Callable[[], None]:
    """A download's seal that marks ``entry`` consumed and keeps the marked entry in
    ``sealed``: the mark comes before the bytes are put at the destination."""
    return lambda: sealed.append(mark(task, entry, consumer, actor))


def unplaced(error: OSError, file_id: str, consumer: str) -> OSError:
    """``error``, of putting the bytes in place after the mark, saying what to do (its
    type and ``errno`` kept)."""
    problem = (
        f"could not put the verified data at {error.filename2!r}: {error.strerror}"
        if error.filename2 is not None and error.strerror
        else str(error)
    )
    return transfer.retold(
        error,
        f"{problem}; {file_id!r} was marked consumed by {consumer!r} first: consume it "
        "again to write it (a consumer gets again what it consumed)",
    )


def streamed_stale(file_id: str, dest: str) -> NotReady:
    """A device or FIFO took the data of a version produced again before the mark."""
    return NotReady(
        f"{file_id!r} was produced again while its data was written into {dest!r}: what "
        f"{dest!r} received is the earlier data, and nothing was marked; consume it again"
    )


def mismatch(task: Manifest, entry: Entry, error: ChecksumMismatch, actor: str) -> ChecksumMismatch:
    """Record bad data so it is produced again; the error says what became of it.

    A chunked entry's upload is marked first, so no later holder adopts the bad object
    back; if that mark cannot be written, the entry is left as it is (the next consumer
    finds the mismatch again) and the error says so.
    """
    key, digest = entry.key, entry.checksum
    assert key is not None and digest is not None
    try:
        chunked.reject_data(task.uploads, entry)
    except ObjManifestError as e:
        return ChecksumMismatch(
            f"{error}; the bad data could not be marked ({e}), so the entry was left "
            "ready: consume it again to retry"
        )
    shard = task.layout.shard_of(entry.stage, entry.file_id)
    failed = task.docs.commit(
        task.layout.shard(shard),
        task.codec(shard),
        commands.Mismatch(
            entry.file_id, key, digest, error_text(str(error)), task.rules, actor=actor
        ),
    )
    if failed.state is State.failed:
        return ChecksumMismatch(f"{error}; the entry is now failed, so it will be produced again")
    return ChecksumMismatch(f"{error}; the entry is now {failed.state.value}")
