"""Sources of an entry's bytes: read once whole (small data) or part by part (chunked).

``open_source`` looks at what ``put`` was given (bytes, a path, a binary file, a stream)
and decides: one object read into memory, or a ``PartSource`` read part by part, in
parallel where the source allows it, so memory holds the parts in flight and never the
whole file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from ..errors import InvalidInput, SourceChanged

Source = bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO


class PartSource:
    """A source read part by part: memory holds the parts in flight, never the whole file.

    ``size`` is None for a stream, which is read in order from one thread; other sources
    are read at any offset from any thread.
    """

    size: int | None = None
    seekable: bool = True
    name: str = "data"

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at the end of a stream)."""
        raise NotImplementedError

    def open_part(self, offset: int, length: int) -> PartReader | None:
        """The part as a file object that hashes what is sent (None: read it into memory)."""
        return None

    def check_unchanged(self) -> None:
        """Raise ``SourceChanged`` if the source was modified since it was opened (its size,
        modification time or inode changed)."""

    def close(self) -> None:
        """Release what the source opened itself (never a file object the caller passed)."""


class _FdSource(PartSource):
    """A regular file, read with ``os.pread`` so parts are read in parallel."""

    def __init__(self, fd: int, base: int, name: str, owned: bool) -> None:
        self.fd, self.base, self.name, self.owned = fd, base, name, owned
        self.stamp = self._stamp()
        self.size = self.stamp[0] - base

    def _stamp(self) -> tuple[int, int, int]:
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns, st.st_ino

    def read_at(self, offset: int, length: int) -> bytes:
        chunks: list[bytes] = []
        done = 0
        while done < length:
            got = os.pread(self.fd, length - done, self.base + offset + done)
            if not got:
                break
            chunks.append(got)
            done += len(got)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def open_part(self, offset: int, length: int) -> PartReader:
        return PartReader(self.fd, self.base + offset, length, self.name)

    def check_unchanged(self) -> None:
        now = self._stamp()
        if now != self.stamp:
            what = (
                f"changed size ({self.stamp[0]} -> {now[0]} bytes)"
                if now[0] != self.stamp[0]
                else "was modified"
            )
            raise SourceChanged(
                f"{self.name} {what} while it was uploaded; upload a file that is no longer "
                "being written"
            )

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


class PartReader(io.RawIOBase):
    """One part of a file as the body of an ``UploadPart``, streamed from the file, never
    held in memory whole.

    botocore reads a body in passes from the start (one to sign it, one to send it, again
    for a retry). The first whole pass is hashed with xxh3 and MD5 (the MD5 is what the
    store's ETag for the part must be); the source's ``check_unchanged``
    (size, mtime, inode) after the part is sent shows every pass read the same bytes. The
    file is read in blocks of ``BLOCK`` bytes, whatever size the caller asks for (http.client
    asks for 16 KiB at a time).
    """

    BLOCK = 1024 * 1024

    def __init__(self, fd: int, offset: int, length: int, name: str) -> None:
        super().__init__()
        self.fd, self.offset, self.length, self.name = fd, offset, length, name
        self.position = 0
        self.block, self.block_start = b"", 0
        self.hasher: Any = xxhash.xxh3_128()
        self.md5: Any = hashlib.md5(usedforsecurity=False)
        self.hashed = 0
        self.first_pass: str | None = None
        self.first_md5: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        target = base + offset
        if target != self.position:
            self.block, self.block_start = b"", 0
            if self.first_pass is None:  # an unfinished pass: start the digests again at 0
                self.hasher, self.hashed = xxhash.xxh3_128(), 0
                self.md5 = hashlib.md5(usedforsecurity=False)
        self.position = target
        return target

    def read(self, size: int | None = -1) -> bytes:
        left = self.length - self.position
        want = left if size is None or size < 0 else min(size, left)
        if want <= 0:
            return b""
        if not self.block_start <= self.position < self.block_start + len(self.block):
            self._fill()
        start = self.position - self.block_start
        if start == 0 and want >= len(self.block):
            data = self.block
        else:
            data = self.block[start : start + want]
        self.position += len(data)
        return data

    def _fill(self) -> None:
        """Read the block at the current position; hash it if it continues the first pass."""
        size = min(self.BLOCK, self.length - self.position)
        data = os.pread(self.fd, size, self.offset + self.position)
        if len(data) != size:
            raise SourceChanged(
                f"{self.name} ended early while a part was sent (at byte "
                f"{self.offset + self.position + len(data)}); upload a file that is not being "
                "written"
            )
        self.block, self.block_start = data, self.position
        if self.first_pass is None and self.hashed == self.position:
            self.hasher.update(data)
            self.md5.update(data)
            self.hashed += size
            if self.hashed == self.length:
                self.first_pass = self.hasher.hexdigest()
                self.first_md5 = self.md5.hexdigest()

    def digest(self) -> str:
        """The xxh3 of the part (its first whole pass)."""
        if self.first_pass is None:
            raise SourceChanged(f"{self.name}: a part was sent without being read whole")
        return self.first_pass

    def md5_hex(self) -> str:
        """The MD5 of the part (its first whole pass), what the store's ETag should be."""
        if self.first_md5 is None:
            raise SourceChanged(f"{self.name}: a part was sent without being read whole")
        return self.first_md5


class _BufferSource(PartSource):
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(data).cast("B")
        self.size = len(self.view)
        self.name = "the bytes given"

    def read_at(self, offset: int, length: int) -> bytes:
        return bytes(self.view[offset : offset + length])


class _SeekSource(PartSource):
    """A seekable file object without a file descriptor: one read at a time."""

    def __init__(self, file: BinaryIO, base: int, size: int) -> None:
        self.file, self.base, self.size = file, base, size
        self.name = repr(file)
        self._lock = threading.Lock()

    def read_at(self, offset: int, length: int) -> bytes:
        with self._lock:
            self.file.seek(self.base + offset)
            return read_fully(self.file, length)


class _StreamSource(PartSource):
    """A stream of unknown size: read in order, after the bytes already read to decide."""

    seekable = False

    def __init__(self, file: BinaryIO, head: bytes) -> None:
        self.file, self.head = file, head
        self.position = 0
        self.name = getattr(file, "name", None) or repr(file)

    def read_at(self, offset: int, length: int) -> bytes:
        if offset != self.position:
            raise InvalidInput(f"a stream is read in order: asked for {offset}, at {self.position}")
        taken = self.head[:length]
        self.head = self.head[len(taken) :]
        rest = read_fully(self.file, length - len(taken)) if len(taken) < length else b""
        data = taken + rest if rest else taken
        self.position += len(data)
        return data


def read_fully(file: BinaryIO, length: int) -> bytes:
    """Up to ``length`` bytes, fewer only at the end of the file."""
    chunks: list[bytes] = []
    done = 0
    while done < length:
        got = file.read(length - done)
        if not got:
            break
        chunks.append(got)
        done += len(got)
    return b"".join(chunks)


@dataclass
class Prepared:
    """A source made ready: either the whole bytes (one object) or a ``PartSource``."""

    single: bytes | None = None
    parts: PartSource | None = None


def check_source(data: object, what: str = "put()") -> None:
    """Refuse (``TypeError``) what ``put`` cannot take, before anything is read."""
    if isinstance(data, io.TextIOBase):
        raise TypeError(f"{what} needs bytes, a path, or a file opened in binary mode ('rb')")
    if not isinstance(data, (bytes, bytearray, memoryview, str, os.PathLike)) and not callable(
        getattr(data, "read", None)
    ):
        raise TypeError(
            f"{what} takes bytes (the data), a path (str or os.PathLike) or a binary file "
            f"object, not {type(data).__name__}"
        )


@contextlib.contextmanager
def open_source(data: Source, threshold: int) -> Iterator[Prepared]:
    """Look at a source once and decide: one object (at most ``threshold`` bytes, read into
    memory) or parts (read part by part later).

    A stream of unknown size is chunked only if it is a buffered binary stream (such as
    ``sys.stdin.buffer``), where a short read means its end; any other non-seekable object
    is read whole with one ``read()``, as before.
    """
    check_source(data)
    with contextlib.ExitStack() as opened:
        source = _source_of(data, threshold, opened)
        if not isinstance(source, bytes):
            opened.callback(source.close)
        if isinstance(source, bytes):
            yield Prepared(single=source)
        elif source.size is not None and source.size <= threshold:
            yield Prepared(single=source.read_at(0, source.size))
        else:
            yield Prepared(parts=source)


def _source_of(data: Source, threshold: int, opened: contextlib.ExitStack) -> bytes | PartSource:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data) if len(data) <= threshold else _BufferSource(data)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        file = opened.enter_context(open_path(path, isinstance(data, str)))
        if stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return _FdSource(file.fileno(), 0, str(path), owned=False)
        data = file  # a named pipe or a device: a stream, read in order
    return _file_source(data, threshold)


def open_path(path: Path, given_as_str: bool = False) -> BinaryIO:
    """Open a file to upload; a missing file or a directory is refused saying what ``put``
    takes (a str is a path, bytes are data)."""
    if path.is_dir():
        raise IsADirectoryError(f"cannot upload {str(path)!r}: it is a directory; put one file")
    try:
        return path.open("rb")
    except FileNotFoundError:
        hint = (
            "; put() takes a str as the path of a file to upload: pass bytes "
            "(for example text.encode()) to upload the string itself"
            if given_as_str
            else ""
        )
        raise FileNotFoundError(f"cannot read {str(path)!r}: no such file{hint}") from None
    except IsADirectoryError:
        raise IsADirectoryError(
            f"cannot upload {str(path)!r}: it is a directory; put one file"
        ) from None


def _file_source(file: BinaryIO, threshold: int) -> bytes | PartSource:
    seekable = bool(getattr(file, "seekable", lambda: False)())
    if seekable:
        base = file.tell()
        fd = _regular_fd(file)
        if fd is not None:
            return _FdSource(fd, base, str(getattr(file, "name", "")) or repr(file), owned=False)
        size = file.seek(0, io.SEEK_END) - base
        file.seek(base)
        return _SeekSource(file, base, size)
    if isinstance(file, io.BufferedIOBase):
        head = read_fully(file, threshold + 1)
        return head if len(head) <= threshold else _StreamSource(file, head)
    whole = file.read()
    return whole if len(whole) <= threshold else _BufferSource(whole)


def _regular_fd(file: BinaryIO) -> int | None:
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
