"""Moving an entry's bytes as one object, and the settings of every transfer.

A small holder's data goes to its epoch's data key with ``If-None-Match: *``. A fenced
holder therefore writes beside the winner, never over it, and since the manifest only
ever points at the key of the epoch that made the entry ready, its bytes never become
visible. Reads hash while they stream and hand nothing over that does not match.

Data above ``TransferConfig.threshold`` goes as a chunked entry (``uploads/``); this module
gives it its part size.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core import checksum
from ..core.layout import TaskLayout
from ..core.model import Stored
from ..errors import AlreadyExists, ChecksumMismatch, InvalidInput, NotFound
from ..store import CREATE, ByteStream, ObjectStore
from ..store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed
from .errors import SealRefused

Progress = Callable[[int, "int | None"], None]
"""Called as ``progress(bytes_done, total)``; ``total`` is None for a stream of unknown size."""

READ_CHUNK = 1024 * 1024
META_DIGEST = "xxh3-128"

MiB = 1024 * 1024
GiB = 1024 * MiB
MIN_PART_SIZE = 5 * MiB
"""S3's smallest part (every part but the last); every backend enforces it."""
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * 1024 * GiB


def check_part_size(part_size: int, name: str = "part_size") -> int:
    if not isinstance(part_size, int) or not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        raise InvalidInput(
            f"{name} must be a whole number of bytes from 5 MiB to 5 GiB (S3's limits), "
            f"not {part_size!r}"
        )
    return part_size


@dataclass(frozen=True)
class TransferConfig:
    """How data moves: per task (``Task.create``/``Task.open`` with ``transfer=``), or per
    call of ``put`` and ``consume`` with their ``part_size=``, ``concurrency=`` and
    ``threshold=`` arguments.

    * ``threshold``: data larger than this goes as a chunked (multipart) entry; smaller data
      is one object, read into memory.
    * ``part_size``: the part size of a chunked upload of known size; grown (to whole MiB) so
      a file never needs more than 10,000 parts. An explicit per-call part size is not grown:
      too small a one is refused with the size that would do.
    * ``stream_part_size``: the part size for a stream of unknown size (stdin, a pipe). With
      10,000 parts at most, 64 MiB parts allow streams up to 625 GiB; pass a larger
      ``part_size`` for longer streams (525 MiB reaches S3's 5 TiB object limit).
    * ``concurrency``: parts in flight at once, uploading or downloading. Memory stays
      within ``concurrency x part_size`` whatever the file size (a file's parts are streamed
      from it in 1 MiB blocks, so far less; a stream's parts, and parts checked for adoption,
      are held whole). It is capped at the boto3 client's connection pool size.
    """

    threshold: int = 64 * MiB
    part_size: int = 16 * MiB
    stream_part_size: int = 64 * MiB
    concurrency: int = 8

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise InvalidInput(f"threshold must be >= 0, not {self.threshold}")
        for name in ("part_size", "stream_part_size"):
            check_part_size(getattr(self, name), name)
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise InvalidInput(f"concurrency must be a whole number >= 1, not {self.concurrency!r}")

    def with_overrides(
        self,
        part_size: int | None = None,
        concurrency: int | None = None,
        threshold: int | None = None,
    ) -> TransferConfig:
        """These settings with the per-call values that were given."""
        changes: dict[str, Any] = {}
        if part_size is not None:
            changes.update(part_size=part_size, stream_part_size=part_size)
        if concurrency is not None:
            changes["concurrency"] = concurrency
        if threshold is not None:
            changes["threshold"] = threshold
        return replace(self, **changes) if changes else self


def part_size_for(size: int | None, config: TransferConfig, explicit: bool = False) -> int:
    """The part size for ``size`` bytes (None: a stream of unknown size).

    A default part size grows to whole MiB so the file fits in 10,000 parts; an explicit one
    that is too small is refused, saying what would do.
    """
    if size is None:
        return config.stream_part_size
    if size > MAX_OBJECT_SIZE:
        raise InvalidInput(f"{size} bytes is more than S3's largest object (5 TiB)")
    needed = math.ceil(size / MAX_PARTS / MiB) * MiB
    if config.part_size >= needed:
        return config.part_size
    if explicit:
        raise InvalidInput(
            f"part_size={config.part_size} would need {math.ceil(size / config.part_size)} "
            f"parts for {size} bytes, and S3 allows {MAX_PARTS}: use part_size >= {needed} "
            "or leave it unset"
        )
    return max(needed, MIN_PART_SIZE)


def part_count(size: int, part_size: int) -> int:
    return max(1, math.ceil(size / part_size))


class InOrder:
    """The xxh3-128 of a whole object, computed in order while its parts finish in any order.

    ``done(offset, length)`` says those bytes are final (sent, or downloaded and verified);
    each range that continues the hashed prefix is then read back with ``read(offset,
    length)`` (from the buffer or the page cache they were just in) and hashed, with every
    finished range it reaches. Ranges may overlap (a restarted upload with another part
    size). Safe from many threads: one of them hashes at a time, the others only note their
    range and go on. ``feed`` hashes bytes already in hand, for a stream read in order.
    """

    def __init__(self, read: Callable[[int, int], bytes | bytearray | memoryview]) -> None:
        self._read = read
        self._digest = checksum.Digest()
        self._finished: dict[int, int] = {}  # start -> end of ranges not hashed yet
        self._lock = threading.Lock()
        self._busy = False

    @property
    def hashed(self) -> int:
        """How many bytes from the start are hashed."""
        return self._digest.size

    def feed(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Hash ``data`` found at ``offset``, if it continues the prefix (a stream)."""
        with self._lock:
            if offset == self._digest.size and not self._busy:
                self._digest.update(data)

    def done(self, offset: int, length: int) -> None:
        with self._lock:
            end = offset + length
            if end <= self._digest.size:
                return
            self._finished[offset] = max(end, self._finished.get(offset, 0))
            if self._busy:
                return  # the thread hashing now will reach it
            self._busy = True
        try:
            while (span := self._next()) is not None:
                self._hash(*span)
        except BaseException:
            with self._lock:
                self._busy = False
            raise

    def _next(self) -> tuple[int, int] | None:
        """The next range to hash, or None (and no longer busy) when none continues."""
        with self._lock:
            at = self._digest.size
            reach = at
            for start in [s for s in self._finished if s <= at]:
                reach = max(reach, self._finished.pop(start))
            if reach > at:
                return at, reach
            self._busy = False
            return None

    def _hash(self, start: int, end: int) -> None:
        while start < end:
            length = min(READ_CHUNK, end - start)
            data = self._read(start, length)
            if len(data) != length:
                raise ChecksumMismatch(
                    f"read {len(data)} of {length} bytes at offset {start} while hashing the "
                    "whole object"
                )
            self._digest.update(data)
            start += length

    def checksum(self, size: int) -> str | None:
        """The whole object's checksum once its ``size`` bytes are hashed, else None."""
        with self._lock:
            return self._digest.checksum() if self._digest.size == size else None


# -- single objects ----------------------------------------------------------------------


def upload(store: ObjectStore, key: str, body: bytes) -> Stored:
    """Write ``body`` once at ``key``. Repeating the same bytes is a no-op; other bytes for
    the same epoch go beside them under a key with their digest, never over them."""
    digest = checksum.of_bytes(body)
    hexdigest = digest.removeprefix(checksum.PREFIX)
    for candidate in (key, TaskLayout.beside(key, hexdigest[:16])):
        if _write_once(store, candidate, body, hexdigest):
            return Stored(candidate, digest, len(body))
    raise AlreadyExists(
        f"{store.describe(key)} and its alternative already hold other bytes; "
        "fail() this claim and claim the entry again"
    )


def _write_once(store: ObjectStore, key: str, body: bytes, hexdigest: str) -> bool:
    """True once ``key`` holds exactly ``body``; False if it holds something else.

    A refused or unanswered write is checked by reading the object's metadata: the same
    digest and size mean this write (or an identical earlier one) is there. An object that
    is missing after all is written again.
    """
    meta = {META_DIGEST: hexdigest, "size": str(len(body))}
    for _ in range(3):
        try:
            store.put(key, body, mode=CREATE, metadata=meta)
            return True
        except (PreconditionFailed, OutcomeUnknown):
            pass
        try:
            head = store.head(key)
        except NoSuchObject:
            continue  # the write did not land (or the object went): write it again
        return head.metadata.get(META_DIGEST) == hexdigest and head.size == len(body)
    return False


def open_data(
    store: ObjectStore, key: str, byte_range: tuple[int, int] | None = None
) -> ByteStream:
    """The bytes of a data object (or ``[start, end)`` of them); ``NotFound`` naming the
    object if it is not there (removed, or never written)."""
    try:
        return store.open(key, byte_range)
    except NoSuchObject as e:
        raise NotFound(str(e)) from e


def _chunks(stream: ByteStream) -> Iterator[bytes]:
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def _check(
    store: ObjectStore, file_id: str, key: str, digest: checksum.Digest, expected: str, size: int
) -> None:
    if digest.checksum() != expected or digest.size != size:
        raise ChecksumMismatch(
            f"{file_id!r}: {store.describe(key)} holds {digest.size} bytes with "
            f"{digest.checksum()}, but the manifest recorded {size} bytes with {expected}"
        )


def download(
    store: ObjectStore,
    file_id: str,
    key: str,
    expected: str,
    size: int,
    stop: Callable[[], None] = lambda: None,
) -> bytes:
    """The verified bytes of one data object; ``stop`` may raise between chunks.
    ``NotFound`` naming the object if it is not there."""
    digest = checksum.Digest()
    buf = bytearray()
    with contextlib.closing(open_data(store, key)) as stream:
        for chunk in _chunks(stream):
            stop()
            digest.update(chunk)
            buf += chunk
    _check(store, file_id, key, digest, expected, size)
    return bytes(buf)


@dataclass(frozen=True)
class Destination:
    """Where ``consume(dest=)`` writes, looked at before anything is downloaded.

    * ``target``: the file that receives the bytes (a symlink is followed to it);
    * ``special``: a character or block device or a FIFO, written into (never replaced);
    * ``mode``: the permission bits of an existing regular file, kept; None for a new one;
    * ``parents``: missing parent directories may be created.
    """

    given: str
    target: Path
    special: bool = False
    mode: int | None = None
    owner: tuple[int, int] | None = None
    parents: bool = False


def check_destination(dest: str | os.PathLike[str], parents: bool = False) -> Destination:
    """What writing to ``dest`` means, or an error saying why it cannot be written (a
    directory, a socket, a read-only file, a missing parent without ``parents``)."""
    if not isinstance(dest, (str, os.PathLike)):
        raise TypeError(f"dest must be a path (str or os.PathLike), not {type(dest).__name__}")
    given = os.fspath(dest)
    if not given:
        raise InvalidInput("dest is empty: name the file to write")
    try:
        st = os.stat(given)  # follows symlinks: /dev/stdout is whatever stdout is
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise NotADirectoryError(
            f"cannot write {given!r}: a part of its path is a file, not a directory"
        ) from None
    except OSError as e:  # a symlink loop, a path too long, no permission to look
        raise type(e)(f"cannot write {given!r}: {e.strerror or e}") from None
    if st is None:
        return _new_file(given, parents)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(
            f"cannot write {given!r}: it is a directory; name a file in it, such as "
            f"{os.path.join(given, 'NAME')!r}"
        )
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return Destination(given, Path(given), special=True)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"cannot write {given!r}: it is not a file, a device or a FIFO")
    target = Path(os.path.realpath(given))
    if not os.access(target, os.W_OK):
        raise PermissionError(f"cannot write {given!r}: permission denied (it is read-only)")
    _check_writable_dir(given, target.parent)
    return Destination(given, target, mode=stat.S_IMODE(st.st_mode), owner=(st.st_uid, st.st_gid))


def _new_file(given: str, parents: bool) -> Destination:
    target = Path(os.path.realpath(given))  # a dangling symlink: the file it points to
    parent = target.parent
    if not parent.is_dir():
        if parent.exists() or parent.is_symlink():
            raise NotADirectoryError(f"cannot write {given!r}: {str(parent)!r} is not a directory")
        if not parents:
            raise FileNotFoundError(
                f"cannot write {given!r}: the directory {str(parent)!r} does not exist; "
                "create it first, or ask for it to be created (parents=True, --parents)"
            )
        existing = next(p for p in parent.parents if p.exists())
        _check_writable_dir(given, existing)
    else:
        _check_writable_dir(given, parent)
    return Destination(given, target, parents=parents)


def _check_writable_dir(given: str, directory: Path) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot write {given!r}: no permission to create files in {str(directory)!r}"
        )


def download_to(
    store: ObjectStore,
    file_id: str,
    key: str,
    expected: str,
    size: int,
    dest: Destination,
    stop: Callable[[], None] = lambda: None,
    seal: Callable[[], None] = lambda: None,
) -> Path:
    """Stream to a temporary file and put it in place only once verified and sealed: on a
    mismatch nothing is written to ``dest``, nor when ``stop`` raises (between chunks, and
    once the bytes are verified) or ``seal`` does (``writing``)."""
    with writing(dest, seal=seal) as fd:
        digest = checksum.Digest()
        with contextlib.closing(open_data(store, key)) as stream:
            for chunk in _chunks(stream):
                stop()
                digest.update(chunk)
                write_all(fd, chunk, digest.size - len(chunk))
        _check(store, file_id, key, digest, expected, size)
        stop()
    return dest.target


def run_seal(seal: Callable[[], None]) -> None:
    """Run a download's ``seal``; what it raises comes out as ``SealRefused`` (raised
    outside the handler, so the two exceptions do not chain to each other)."""
    try:
        seal()
    except Exception as e:
        refused = SealRefused(e)
    else:
        return
    raise refused


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``os.pwrite`` until all of ``data`` is written."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


@contextlib.contextmanager
def writing(
    dest: Destination, size: int = 0, seal: Callable[[], None] = lambda: None
) -> Iterator[int]:
    """A temporary file to write the bytes into, put in place when the block ends without
    an error and removed otherwise: nothing unverified is ever written to ``dest``.

    A regular file is replaced atomically (a temporary file beside it, fsynced, renamed),
    keeping an existing file's mode (a new one gets ``0666 & ~umask``), once ``seal`` (a
    consume's mark) passed: a seal refused leaves ``dest`` as it was. A device or a FIFO
    is never replaced: the verified temporary file is copied into it, then sealed (a stream
    cannot take its bytes back, and a copy that fails is not sealed).
    """
    if dest.special:
        fd, tmp = tempfile.mkstemp(prefix="objmanifest-", suffix=".part")
        try:
            yield fd
            _copy_into(fd, dest.given)
            run_seal(seal)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return
    target = dest.target
    if dest.parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        os.fchmod(fd, dest.mode if dest.mode is not None else 0o666 & ~_umask())
        if dest.owner is not None and dest.owner != (os.getuid(), os.getgid()):
            with contextlib.suppress(PermissionError):
                os.fchown(fd, *dest.owner)
        if size:
            os.ftruncate(fd, size)
        yield fd
        os.fsync(fd)
        os.close(fd)
        fd = -1
        _refuse_changed(dest)
        run_seal(seal)
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _refuse_changed(dest: Destination) -> None:
    """What was a regular file (or nothing) must not have become a directory, a device or a
    FIFO while the bytes were downloaded: those are never replaced."""
    try:
        st = os.stat(dest.target)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FileExistsError(
            f"cannot write {dest.given!r}: it became something other than a file while the "
            "data was downloaded; nothing was written"
        )


def _copy_into(fd: int, path: str) -> None:
    """Copy the temporary file into a device or FIFO, opened for writing as it is."""
    try:
        out = os.open(path, os.O_WRONLY)
        try:
            offset = 0
            while chunk := os.pread(fd, READ_CHUNK, offset):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
                offset += len(chunk)
        finally:
            os.close(out)
    except OSError as e:
        problem = e.strerror or str(e)
        raise retold(
            e, f"cannot write {path!r}: {problem} (the data was verified, not consumed)"
        ) from None


def retold(error: OSError, message: str) -> OSError:
    """``error`` said as ``message`` (which names its file), of its own type and with its
    ``errno``, for a caller that tells errors apart by them."""
    new = type(error)(message)
    new.errno = error.errno
    return new


def _umask() -> int:
    """The process's umask (read without changing it where the system allows)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
