"""The POSIX calls under ``FileStore``: an object's file (a header, then the body), writing
one whole to a temporary file while digesting it, open file description locks, reading as
a ``ByteStream``, and ``OSError`` said as the seam's outcomes.

An object's file is ``MAGIC``, the length of a JSON header (4 bytes, big-endian), the
header (``{"etag": ..., "metadata": {...}}``, and ``"upload"``: the multipart upload whose
completion made it), then the body: the ETag and the metadata
are read with the first block of the file, so a HEAD or a conditional GET of a large
object reads a few hundred bytes, and each version is one file, written whole before it is
linked or renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO

from ..core import checksum
from ..core.plain import MAX_NESTING, nesting_bound
from ..errors import AccessDenied, ReadBrokeOff, StoreError
from .errors import NoSuchObject

MAGIC = b"\x89omobj1\n"
"""The first bytes of every object's file (a byte no text starts with, and a newline a
text-mode copy would mangle)."""

FIRST_READ = 4096
"""The bytes read first: the header of any object whose metadata is not unusually large."""

CHUNK = 1024 * 1024
"""Bytes read and written at a time when a body streams."""

MAX_HEADER = 16 * 1024 * 1024
"""The longest header a file may claim (metadata of that size is nobody's)."""

PLACEHOLDER = checksum.PREFIX + "0" * 32
"""The ETag a streamed body's header is written with, replaced by its digest at the end
(the same length)."""

_HEAD = struct.Struct(">I")
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps(..., separators=(",", ":"))``, its encoder made once."""
_ETAG_AT = len(MAGIC) + _HEAD.size + len('{"etag":"')

FLOCK = struct.Struct("hhqqi4x")
"""``struct flock`` on Linux (l_type, l_whence, l_start, l_len, l_pid, padding)."""

FILE_MODE = 0o666
DIR_MODE = 0o777
"""Modes of what the store makes, less the umask: agents running as several users of one
group share a store with ``umask 002`` (and a setgid directory)."""


@dataclass(frozen=True)
class Header:
    """What an object's file says about it: its ETag (bare), metadata, where its body
    starts, and the upload whose completion made it (None for an object put whole)."""

    etag: str
    metadata: dict[str, str]
    body_at: int
    upload: str | None = None


def header_bytes(etag: str, metadata: dict[str, str] | None, upload: str | None = None) -> bytes:
    """The bytes before an object's body."""
    fields: dict[str, object] = {"etag": etag, "metadata": dict(metadata or {})}
    if upload is not None:
        fields["upload"] = upload
    data = _HEADER_JSON.encode(fields).encode("utf-8")
    return MAGIC + _HEAD.pack(len(data)) + data


def parse_header(first: bytes) -> Header | int:
    """The header in ``first`` (the file's first bytes); if it is longer, how many bytes of
    the file hold it. A file that is not an object's raises ``ValueError``."""
    start = len(MAGIC) + _HEAD.size
    if len(first) < start or not first.startswith(MAGIC):
        raise ValueError("it does not start as an object's file does")
    (length,) = _HEAD.unpack_from(first, len(MAGIC))
    if length > MAX_HEADER:
        raise ValueError(f"its header claims {length} bytes (at most {MAX_HEADER})")
    if len(first) < start + length:
        return int(start + length)
    head = first[start : start + length]
    if nesting_bound(head) > MAX_NESTING:
        raise ValueError("its header is damaged (nested too deeply)")
    try:
        fields = json.loads(head)
        etag, metadata, upload = fields["etag"], fields["metadata"], fields.get("upload")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"its header is damaged ({type(e).__name__})") from None
    if not (
        isinstance(etag, str) and isinstance(metadata, dict) and isinstance(upload, str | None)
    ):
        raise ValueError("its header is damaged (wrong types)")
    return Header(etag, {str(k): str(v) for k, v in metadata.items()}, start + length, upload)


def read_header(fd: int) -> Header:
    """The header of the object's file open at ``fd``; ``ValueError`` if it is no object's
    file (or one cut short inside its header)."""
    first = os.pread(fd, FIRST_READ, 0)
    found = parse_header(first)
    if isinstance(found, int):
        found = parse_header(os.pread(fd, found, 0))
        if isinstance(found, int):
            raise ValueError("it ends inside its header")
    return found


def whole_file(fd: int) -> Header:
    """What a file that is not an object's file (damaged, or put there by something else)
    reads as: an object whose body is every byte of the file, its ETag their checksum, so
    that it is told apart from any other version, and a damaged manifest object is found
    corrupt (and repaired over that ETag) and damaged data fails its checksum, as on any
    store."""
    digest, at = checksum.Digest(), 0
    while chunk := os.pread(fd, CHUNK, at):
        digest.update(chunk)
        at += len(chunk)
    return Header(checksum.bare_etag(digest.checksum()), {}, 0)


# -- writing ---------------------------------------------------------------------------------


def write_all(fd: int, buffers: Iterable[bytes | memoryview]) -> None:
    """Write every byte of the buffers (``writev`` may write fewer than asked)."""
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        written = os.writev(fd, pending)
        while written and pending:
            if written >= len(pending[0]):
                written -= len(pending[0])
                pending.pop(0)
            else:
                pending[0] = pending[0][written:]
                written = 0


def write_object(fd: int, body: bytes | BinaryIO, metadata: dict[str, str] | None) -> str:
    """Write an object's file (header and body) to ``fd``; its ETag, the body's checksum
    (``xxh3-128:`` and its hex digest) digested from the very bytes written. A file object
    is read from its start to its end."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        etag = checksum.of_bytes(body)
        write_all(fd, [header_bytes(etag, metadata), memoryview(body)])
        return etag
    write_all(fd, [header_bytes(PLACEHOLDER, metadata)])
    digest = checksum.Digest()
    if body.seekable():
        body.seek(0)
    while chunk := body.read(CHUNK):
        digest.update(chunk)
        write_all(fd, [chunk])
    etag = digest.checksum()
    os.pwrite(fd, etag.encode("ascii"), _ETAG_AT)
    return etag


def write_stream(fd: int, body: BinaryIO, length: int) -> str:
    """Write ``length`` bytes of a part from its start, as they are (no header); their MD5."""
    digest = hashlib.md5(usedforsecurity=False)
    body.seek(0)
    left = length
    while left > 0 and (chunk := body.read(min(CHUNK, left))):
        digest.update(chunk)
        write_all(fd, [chunk])
        left -= len(chunk)
    if left:
        raise StoreError(f"the part ended {left} bytes before its length ({length})")
    return digest.hexdigest()


def copy_into(target: int, source: int, size: int) -> None:
    """Append ``size`` bytes of ``source`` (from its start) to ``target``: in the kernel
    where it can (``copy_file_range``: a server-side copy on NFS 4.2, a reflink on XFS or
    btrfs), else through a buffer."""
    offset = 0
    try:
        while offset < size and hasattr(os, "copy_file_range"):
            copied = os.copy_file_range(source, target, size - offset, offset)
            if copied == 0:
                break
            offset += copied
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    while offset < size:
        chunk = os.pread(source, min(CHUNK, size - offset), offset)
        if not chunk:
            raise StoreError(f"a part ended {size - offset} bytes early")
        write_all(target, [chunk])
        offset += len(chunk)


# -- locks -----------------------------------------------------------------------------------


class Locks:
    """Open file description locks (``F_OFD_SETLKW``) on byte ranges of one lock file.

    Each thread locks through a description of its own (an ``open`` of its own), so two
    threads of one process exclude each other as two processes do; a POSIX ``fcntl`` lock
    would not (it belongs to the process, and closing any descriptor of the file drops
    it). A lock goes when its holder's descriptions close: a process killed while holding
    one releases it, and on NFS a dead client's locks go with its lease. One byte per
    name, at an offset from its hash: distinct names practically never share a byte, and
    when two do, they only wait for each other.
    """

    NAME = b"locks"
    """The lock file's name in the store's own directory."""

    def __init__(self, path: bytes, directory: Callable[[], int]) -> None:
        self.path = path
        """The lock file's path, for messages."""
        self._directory = directory
        """Opens the directory that holds the lock file (reached without following a link)."""
        self._local = threading.local()

    def _description(self) -> _Description:
        """This thread's description of the lock file now at its name, opened relative to
        its directory (``O_NOFOLLOW``): one of a lock file removed or replaced since (the
        store's directory restored) excludes nobody who opens the file now there."""
        pid = os.getpid()
        directory = self._directory()
        try:
            held = getattr(self._local, "held", None)
            if held is not None and (held.pid != pid or not _at(held.fd, directory, self.NAME)):
                held = None  # a forked child makes descriptions of its own
            if held is None:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(self.NAME, flags, FILE_MODE, dir_fd=directory)
                self._local.held = held = _Description(fd, pid)
            return held
        finally:
            os.close(directory)

    @staticmethod
    def offset(name: str) -> int:
        digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 2  # below 2**62: a valid offset anywhere

    def acquire(self, names: Iterable[str]) -> Held:
        """Wait for the locks of ``names`` (in the order of their offsets, so two holders of
        several never wait for each other); what to ``release``."""
        description = self._description()
        offsets = sorted({self.offset(name) for name in names})
        taken = Held(description, [])
        try:
            for offset in offsets:
                _lock(description.fd, fcntl.F_WRLCK, offset)
                taken.offsets.append(offset)
        except BaseException:
            self.release(taken)
            raise
        return taken

    @staticmethod
    def release(taken: Held) -> None:
        """Release what ``acquire`` took, through the very description that took it."""
        for offset in taken.offsets:
            _lock(taken.description.fd, fcntl.F_UNLCK, offset)


@dataclass
class Held:
    """Locks taken: the description they were taken through (kept open while they are
    held, even if this thread has opened another since: closing it would drop them), and
    their offsets."""

    description: _Description
    offsets: list[int]


def _at(fd: int, directory: int, name: bytes) -> bool:
    """Whether the file open at ``fd`` is the one at ``name`` in ``directory`` now."""
    try:
        mine = os.fstat(fd)
        there = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:  # removed, or a stale handle on NFS: removed by another machine
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _lock(fd: int, kind: int, offset: int) -> None:
    """Set (or clear) the lock of one byte, waiting for it (the GIL is released meanwhile,
    and a signal's EINTR is retried by Python)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))


class _Description:
    """A thread's descriptor of the lock file, closed when the thread's data goes."""

    def __init__(self, fd: int, pid: int) -> None:
        self.fd = fd
        self.pid = pid

    def __del__(self) -> None:
        if self.pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self.fd)


# -- reading ---------------------------------------------------------------------------------


class FileStream:
    """Bytes ``[start, end)`` of an open object's file, as a ``ByteStream``: a read that
    fails (``EIO``, a stale NFS handle) is ``ReadBrokeOff``."""

    def __init__(self, fd: int, start: int, end: int, where: str) -> None:
        self._fd: int | None = fd
        self._pos = start
        self._end = end
        self._where = where

    def read(self, size: int = -1) -> bytes:
        if self._fd is None or self._pos >= self._end or size == 0:
            return b""
        want = self._end - self._pos if size < 0 else min(size, self._end - self._pos)
        try:
            data = os.pread(self._fd, want, self._pos)
            while size < 0 and len(data) < want:  # everything: as many reads as it takes
                more = os.pread(self._fd, want - len(data), self._pos + len(data))
                if not more:
                    break
                data += more
        except OSError as e:
            raise ReadBrokeOff(f"reading {self._where} broke off: {e.strerror}") from e
        if not data:
            raise ReadBrokeOff(
                f"reading {self._where} broke off: the file ended {self._end - self._pos} "
                "bytes early (it was cut short after it was written)"
            )
        self._pos += len(data)
        return data

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:
        self.close()


# -- errors ----------------------------------------------------------------------------------

LOST = frozenset({errno.EIO, errno.ETIMEDOUT, errno.ESTALE, errno.ENOLINK, errno.ECONNRESET})
"""Errors of a call that may have been applied all the same (a server that did not answer
in time, a soft NFS mount giving up)."""


PROBLEMS: dict[int, str] = {
    code: problem
    for codes, problem in (
        (
            (errno.ENOTDIR,),
            "a part of {shown} is not a directory (a file objmanifest did not write is in the "
            "way); remove it",
        ),
        (
            (errno.EACCES, errno.EPERM),
            "permission denied on {shown}; the user this runs as needs to read, write and "
            "enter every directory under {root} (for example `chmod -R u+rwX {root}`, or a "
            "group shared by every agent's user with `chmod -R g+rwXs`)",
        ),
        (
            (errno.ENOSPC, errno.EDQUOT),
            "no space left on the filesystem holding {root} ({strerror}); free space (or "
            "raise the quota), then retry",
        ),
        (
            (errno.EROFS,),
            "{root} is on a read-only filesystem; mount it read-write (agents write the manifest)",
        ),
        (
            (errno.ELOOP,),
            "{shown} is a symbolic link, and objmanifest never follows links inside a store; "
            "remove it",
        ),
        (
            (errno.ENOLCK,),
            "the filesystem holding {root} gives no locks (ENOLCK: on NFSv3, lockd is not "
            "running); mount it with NFSv4, or start lockd",
        ),
        (
            (errno.EMFILE, errno.ENFILE),
            "too many open files ({strerror}); raise the limit (`ulimit -n`) or run fewer threads",
        ),
    )
    for code in codes
}
"""What an ``errno`` means for the store, and its fix (``{shown}``: the file, ``{root}``:
the store's directory, ``{strerror}``: the system's words)."""

DENIED = frozenset({errno.EACCES, errno.EPERM})
"""The errors that are ``AccessDenied``."""


def failure(
    e: OSError, action: str, where: str, path: bytes, root: str, reading: bool = False
) -> StoreError | NoSuchObject:
    """An ``OSError`` said as what it means for the store, naming the object, its file and
    the fix (``reading``: a missing file is a missing object)."""
    shown = os.fsdecode(path)
    code = e.errno
    if reading and code in (errno.ENOENT, errno.ENOTDIR):
        return NoSuchObject(where)
    problem = PROBLEMS.get(code) if code is not None else None
    if problem is None:
        return StoreError(f"could not {action} {where} ({shown}): {e.strerror or e}")
    said = f"could not {action} {where}: " + problem.format(
        shown=shown, root=root, strerror=e.strerror
    )
    return AccessDenied(said) if code in DENIED else StoreError(said)
