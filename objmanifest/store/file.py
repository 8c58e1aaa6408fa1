"""``FileStore``: the storage seam over a directory of a POSIX filesystem (``file:///DIR``).

A local disk, or an NFSv4 share mounted by several machines: the directory is the store's
root, objects are files under it (keys mapped to paths by ``file_paths``), and the store
keeps its own files under ``DIR/.objmanifest/`` (``tmp/``, ``uploads/``, ``locks``,
``clock``).

Every version of an object is a file of its own, written whole to ``tmp/``, digested (its
xxh3-128 checksum is the ETag, kept in the file's header with the metadata) and
``fsync``-ed, then put in place in one step:

* **create-only** links it to the object's path (``link(2)`` fails if anything is there:
  the filesystem decides the race, also between machines on NFS);
* **update-if-match**, overwrite and delete take the object's lock, read the current
  version fresh under it (opening the file after the lock is taken: on NFS the open goes
  to the server by name, and close-to-open consistency gives its current bytes), decide the
  condition, and rename the new file over the object (or unlink it);
* the directory is ``fsync``-ed before the write is answered.

The lock is an open file description lock (``F_OFD_SETLKW``, Linux) on a byte of one lock
file, taken through a description of each thread's own (``file_io.Locks``): it excludes
threads and processes alike, and NFSv4 carries it to the server, so it excludes machines
too. It was chosen over create-only versioned files (each version a new name, the highest
wins) because a reader then opens one path, not a listing of versions, and nothing needs
collecting. Crashes: a writer killed at any step leaves the old version or the new one,
never a torn file (the new one is whole and on disk before it is renamed); its temporary
file is swept later, and its lock goes with its last descriptor (at death, or with a dead
NFS client's lease).

The clock is the filesystem's: ``now()`` touches ``.objmanifest/clock`` and reads back its
mtime (on NFS the server stamps it), and ``StoreClock`` advances it between observations
by the monotonic clock, as the ``Date`` headers of an S3 store.

"In transit" here is the way from the caller's bytes to the file: the ETag is the checksum
of the very bytes written (a streamed body is digested chunk by chunk as it goes), so there
is nothing for a digest to check on arrival. It is not an MD5, as S3's is, because nothing
compares a whole object's ETag with an MD5 (only a part's, which stays one) and xxh3 costs a
fraction of it; an object an earlier release wrote keeps its MD5 until its next version
(an ETag is only ever compared with one the store gave). NFS's own wire is the mount's
business (TCP's checksum, or ``sec=krb5i`` for an integrity check of every RPC).

A file in the store's tree that is no object's file (its header damaged or cut short, or
put there by something else) reads as an object whose body is the whole file and whose ETag
is that body's checksum, as a damaged object reads on any store: a manifest object is then
found corrupt and ``repair`` replaces it over that ETag (its bytes copied aside first), and
damaged data fails its checksum.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from functools import lru_cache
from typing import TypeVar
from urllib.parse import quote

from ..core import checksum
from ..core.runtime import DEFAULT, Runtime
from ..errors import InvalidInput, StoreError
from . import file_io, file_paths, file_tree, urls
from .base import (
    Blob,
    HandsOnUploads,
    Head,
    Listed,
    Put,
    PutMode,
    StoreClock,
    Writes,
)
from .errors import NoSuchObject, OutcomeUnknown, PreconditionFailed
from .file_io import FileStream, Header, Locks
from .file_root import Directory, check_root_path, kind
from .file_tree import Temporary
from .file_uploads import Uploads
from .urls import StoreURL

T = TypeVar("T")
Step = Callable[..., None]
"""``os.link`` or ``os.rename``: (source, name, src_dir_fd=..., dst_dir_fd=...)."""


def _link_itself(source: bytes, target: bytes, **at: int) -> None:
    """``link(2)`` of ``source`` itself: were it swapped for a link, never the file that link
    points at (``linkat`` without ``AT_SYMLINK_FOLLOW``)."""
    os.link(source, target, follow_symlinks=False, **at)


log = logging.getLogger(__name__)

OBSERVE_EVERY = 10.0
"""Seconds between two looks at the filesystem's clock (``StoreClock`` advances it between
them by the monotonic clock)."""

RETRIES = 5
"""Attempts at a link or rename whose directory another writer's delete just removed."""

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_store(
    url: StoreURL, *, endpoint_url: str | None = None, runtime: Runtime | None = None
) -> FileStore:
    """The store of a ``file:///DIR`` URL, for ``connect`` (a directory has no endpoint)."""
    if endpoint_url:
        raise InvalidInput(f"a directory has no endpoint: drop endpoint_url for {url}")
    return FileStore(url.bucket, runtime=runtime)


@lru_cache(maxsize=4096)
def _names(key: str) -> tuple[bytes, ...]:
    return tuple(file_paths.object_names(key))


class FileStore(HandsOnUploads, Writes):
    """One directory as an object store. Keys are relative to the directory."""

    scheme = "file"
    integrity = (
        "not asked: a directory has no transit to damage (the ETag is the checksum of the "
        "very bytes written)"
    )

    def __init__(self, root: str, *, runtime: Runtime | None = None, connections: int = 16) -> None:
        self.root = check_root_path(root, root)
        self.runtime = runtime or DEFAULT
        self.clock = StoreClock(monotonic=self.runtime.monotonic)
        self.directory = Directory(self.root)
        self.locks = Locks(self.directory.locks, self.directory.own)
        self.uploads = Uploads(self, self.directory.uploads)
        self._base = self.directory.base
        self._connections = connections
        self._observed: float | None = None

    @classmethod
    def from_url(cls, url: str, *, runtime: Runtime | None = None) -> FileStore:
        """The store of ``file:///ABSOLUTE/DIR``."""
        parsed = urls.parse(url)
        if parsed.scheme != "file":
            raise InvalidInput(f"not a file URL: {url!r}; use file:///ABSOLUTE/DIR")
        return open_store(parsed, runtime=runtime)

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    @property
    def url(self) -> str:
        return "file://" + quote(self.root)

    @property
    def connections(self) -> int:
        return self._connections

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}"

    def object_path(self, key: str) -> bytes:
        return os.path.join(self._base, *_names(key))

    def error(
        self, e: OSError, action: str, key: str, path: bytes, reading: bool = False
    ) -> Exception:
        """``e`` said as what it means for ``key`` (``reading``: a missing file is a missing
        object, unless the store's directory is gone)."""
        return self.directory.failure(e, action, self.describe(key), path, reading)

    # -- objects ---------------------------------------------------------------------------

    def _open(self, key: str, action: str) -> tuple[int, os.stat_result, bytes]:
        """The object's file, open for reading, and what ``fstat`` says of it."""
        path, names = self.object_path(key), _names(key)
        for attempt in range(RETRIES):  # a directory removed on an NFS server: walked again
            try:
                directory = file_tree.open_directory(self._base, names[:-1])
            except OSError as e:
                if _walk_again(e, attempt):
                    continue
                raise self.error(e, action, key, e.filename, reading=True) from e
            try:
                fd = os.open(names[-1], _READ_FLAGS, dir_fd=directory)
                break
            except OSError as e:
                if _walk_again(e, attempt):
                    continue
                raise self.error(e, action, key, path, reading=True) from e
            finally:
                os.close(directory)
        try:
            found = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise self.error(e, action, key, path, reading=True) from e
        if not stat.S_ISREG(found.st_mode):
            os.close(fd)
            raise StoreError(
                f"could not {action} {self.describe(key)}: {os.fsdecode(path)} is "
                f"{kind(found.st_mode)}, not an object's file; remove it"
            )
        return fd, found, path

    def _header(self, fd: int, key: str, path: bytes, first: bytes | None = None) -> Header:
        """The header of the object's file open at ``fd`` (``first``: its first bytes, read
        already); a file that is no object's file reads as one whose body is the whole file
        (``file_io.whole_file``)."""
        try:
            found = file_io.parse_header(first) if first is not None else None
            return found if isinstance(found, Header) else file_io.read_header(fd)
        except ValueError as e:
            log.debug(
                "%s (%s) is not an object's file (%s): it reads as an object of all its bytes",
                self.describe(key),
                os.fsdecode(path),
                e,
            )
            return file_io.whole_file(fd)

    def _reading(self, key: str, action: str, read: Callable[[int, os.stat_result, bytes], T]) -> T:
        """``read`` the object's open file; a file replaced under a reader on NFS (a stale
        handle) is opened again."""
        for attempt in range(RETRIES):
            fd, found, path = self._open(key, action)
            try:
                return read(fd, found, path)
            except OSError as e:
                if _walk_again(e, attempt):
                    continue
                raise self.error(e, action, key, path, reading=True) from e
            finally:
                os.close(fd)
        raise AssertionError("unreachable")

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        def read(fd: int, found: os.stat_result, path: bytes) -> Blob | None:
            first = os.pread(fd, 64 * 1024, 0)
            header = self._header(fd, key, path, first)
            if if_none_match is not None and checksum.bare_etag(if_none_match) == header.etag:
                return None
            if found.st_size <= len(first):
                body = first[header.body_at :]
            else:
                body = _read_exactly(fd, header.body_at, found.st_size - header.body_at)
            return Blob(body, f'"{header.etag}"', header.metadata)

        return self._reading(key, "read", read)

    def head(self, key: str) -> Head:
        def read(fd: int, found: os.stat_result, path: bytes) -> Head:
            header = self._header(fd, key, path)
            size = found.st_size - header.body_at
            return Head(f'"{header.etag}"', size, header.metadata, header.upload)

        return self._reading(key, "inspect", read)

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> FileStream:
        """The object's bytes, or ``[start, end)`` of them (an end past the object's end is
        its end)."""
        fd, found, path = self._open(key, "read")
        try:
            header = self._header(fd, key, path)
        except OSError as e:
            os.close(fd)
            raise self.error(e, "read", key, path, reading=True) from e
        except BaseException:
            os.close(fd)
            raise
        size = found.st_size - header.body_at
        start, end = 0, size
        if byte_range is not None:
            start, end = byte_range
            if start >= size > 0 or start < 0 or end < start:
                os.close(fd)
                raise StoreError(
                    f"could not read {self.describe(key)}: range {start}-{end} is outside "
                    f"its {size} bytes"
                )
        at = header.body_at
        return FileStream(fd, at + start, at + min(end, size), self.describe(key))

    def write(self, put: Put) -> str:
        """Write an object and return its ETag (its body's xxh3-128 checksum)."""

        def write(fd: int) -> str:
            return file_io.write_object(fd, put.body, put.metadata)

        return f'"{self.place(put.key, write, put.mode)}"'

    def place(self, key: str, write: Callable[[int], str], mode: PutMode) -> str:
        """Write a new version to a temporary file with ``write`` (which returns its bare
        ETag), make it durable, and put it in place of ``key``'s file under ``mode``'s
        condition."""
        temp = self.temporary("write", key)
        try:
            try:
                fd = os.open(temp.name, _TEMP_FLAGS, file_io.FILE_MODE, dir_fd=temp.directory)
            except OSError as e:
                raise self.error(e, "write", key, temp.path) from e
            placed = False
            try:
                try:
                    etag = write(fd)
                    os.fsync(fd)
                except OSError as e:
                    raise self.error(e, "write", key, temp.path) from e
                if mode.kind == "create":
                    self._link(key, temp, fd)
                else:
                    with self.locked([key]):
                        if mode.kind == "update":
                            self._check_version(key, mode)
                        self._into_place(key, os.rename, temp, fd)
                placed = True
                return etag
            finally:
                with suppress(OSError):  # written and fsync-ed: nothing left for close to report
                    os.close(fd)
                if not placed or mode.kind == "create":
                    temp.remove()
        finally:
            temp.close()

    def _check_version(self, key: str, mode: PutMode) -> None:
        """Refuse an update unless the object is still the version named (read fresh: the
        lock is held, and the file is opened now)."""
        try:
            current = self._reading(key, "update", lambda fd, _, at: self._header(fd, key, at))
        except NoSuchObject:
            raise PreconditionFailed(
                f"{self.describe(key)}: gone", answer="no such object"
            ) from None
        if current.etag != checksum.bare_etag(mode.etag or ""):
            raise PreconditionFailed(
                f"{self.describe(key)}: not the version named", answer="another version"
            )

    def _link(self, key: str, temp: Temporary, fd: int) -> None:
        """Link the new file in place of ``key``'s if nothing is there."""
        try:
            self._into_place(key, _link_itself, temp, fd)
        except FileExistsError:
            if self._in_place(_names(key), fd):  # our own link, answered EEXIST as NFS resent it
                return
            raise PreconditionFailed(f"{self.describe(key)}: exists", answer="exists") from None

    def _into_place(self, key: str, step: Step, temp: Temporary, fd: int) -> None:
        """Link or rename (``step``) the new file in place of ``key``'s, in its directory
        reached name by name (``file_tree``: a link on the way is refused, never followed),
        made first when it is missing (never made, or removed by a delete meanwhile), and
        make that directory durable. A failure that may have happened all the same is
        ``OutcomeUnknown`` unless the file is seen in place."""
        names, path = _names(key), self.object_path(key)
        missing: OSError
        for attempt in range(RETRIES):
            try:
                directory = file_tree.open_directory(self._base, names[:-1], make=True)
            except OSError as e:
                if not isinstance(e, FileNotFoundError) and e.errno != errno.ESTALE:
                    raise self.error(e, "write", key, e.filename) from e
                missing = e  # removed meanwhile (on NFS, by another machine): walked again
            else:
                try:
                    step(
                        temp.name,
                        names[-1],
                        src_dir_fd=temp.directory,
                        dst_dir_fd=directory,
                    )
                    self._sync(key, directory)
                    return
                except FileExistsError:
                    raise
                except FileNotFoundError as e:
                    missing = e
                except OSError as e:
                    if e.errno not in file_io.LOST:
                        raise self.error(e, "write", key, path) from e
                    if self._in_place(names, fd):
                        return
                    if e.errno != errno.ESTALE:
                        raise OutcomeUnknown(f"{self.describe(key)}: {e.strerror}") from e
                    missing = e  # its directory removed on the server: walked again
                finally:
                    os.close(directory)
            if not self.directory.present():
                raise self.directory.gone("write", self.describe(key)) from missing
            if not temp.exists():
                raise StoreError(
                    f"could not write {self.describe(key)}: its temporary file "
                    f"{os.fsdecode(temp.path)} vanished before it was put in place (a sweep "
                    "took it for a dead writer's); retry"
                ) from missing
            if attempt + 1 == RETRIES:
                raise StoreError(
                    f"could not write {self.describe(key)}: its directory was removed "
                    f"{RETRIES} times as this write made it again (deletes of the objects "
                    "beside it racing the write); retry"
                ) from missing

    def _walk_again_if_stale(self, names: Sequence[bytes]) -> int:
        """``file_tree.open_directory``, walked again while NFS says a directory on the
        way was removed by another machine as it was walked (``ESTALE``)."""
        for attempt in range(RETRIES):
            try:
                return file_tree.open_directory(self._base, names)
            except OSError as e:
                if not _walk_again(e, attempt):
                    raise
        raise AssertionError("unreachable")

    def _in_place(self, names: tuple[bytes, ...], fd: int) -> bool:
        """Whether the file open at ``fd`` is at ``names`` now (walked afresh: a rename or
        link that reported a failure but happened)."""
        try:
            directory = file_tree.open_directory(self._base, names[:-1])
        except OSError:
            return False
        try:
            return _same_file(fd, directory, names[-1])
        finally:
            os.close(directory)

    def _sync(self, key: str, directory: int) -> None:
        """Make the entries of ``directory`` (open) durable."""
        try:
            os.fsync(directory)
        except OSError as e:
            raise OutcomeUnknown(
                f"{self.describe(key)}: written, but its directory could not be made durable "
                f"({e.strerror})"
            ) from e

    @contextmanager
    def locked(self, names: Sequence[str]) -> Iterator[None]:
        """Hold the locks of ``names`` (keys, or ``upload:ID``)."""
        try:
            taken = self.locks.acquire(names)
        except OSError as e:
            named = e.filename if isinstance(e.filename, bytes) and e.filename[:1] == b"/" else b""
            where = named or self.locks.path  # a link on the way to the lock file, if one was
            raise self.directory.failure(e, "lock", self.describe(names[0]), where) from e
        try:
            yield
        finally:
            self.locks.release(taken)

    def delete(self, key: str) -> None:
        names, path = _names(key), self.object_path(key)
        with self.locked([key]):
            try:
                directory = self._walk_again_if_stale(names[:-1])
            except (FileNotFoundError, NotADirectoryError) as e:
                if not self.directory.present():
                    raise self.directory.gone("delete", self.describe(key)) from e
                return
            except OSError as e:
                raise self.error(e, "delete", key, e.filename) from e
            try:
                try:
                    os.unlink(names[-1], dir_fd=directory)
                except (FileNotFoundError, NotADirectoryError):
                    return
                except OSError as e:
                    raise self.error(e, "delete", key, path) from e
                self._sync(key, directory)
            finally:
                os.close(directory)
            file_tree.remove_empty(self._base, names[:-1])  # those left empty go too

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        """Keys under ``prefix`` in key order (their UTF-8 bytes, as S3 sorts them)."""
        if not self.directory.present():  # not an empty listing: the store is gone
            raise self.directory.gone("list", self.describe(prefix))
        try:
            for key, is_prefix in file_paths.listing(self._base, prefix, delimiter):
                yield Listed(key, is_prefix)
        except OSError as e:
            where = os.fsencode(e.filename) if e.filename else self._base
            raise self.directory.failure(e, "list", self.describe(prefix), where) from e
        if not self.directory.present():  # emptied under the listing: it was cut short
            raise self.directory.gone("list", self.describe(prefix))

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under ``prefix``."""
        return (row.key for row in self.list(prefix))

    # -- multipart uploads -----------------------------------------------------------------

    def own(self, action: str, key: str, *names: bytes) -> int:
        """The store's own directory ``.objmanifest/NAMES...``, open (``file_tree``: never
        through a link), for ``action`` on ``key``."""
        try:
            return self.directory.own(*names)
        except OSError as e:
            raise self.error(
                e, action, key, os.fsencode(e.filename or self.directory.reserved)
            ) from e

    def temporary(self, action: str, key: str) -> Temporary:
        """A new name for a temporary file or directory in ``tmp/`` (outside the key space),
        with ``tmp/`` open."""
        name = self.runtime.new_id().encode("ascii")
        return Temporary(
            self.own(action, key, b"tmp"), name, os.path.join(self.directory.tmp, name)
        )

    # -- time ------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's time: the filesystem's clock, looked at every ``OBSERVE_EVERY``
        seconds and advanced by the monotonic clock in between."""
        mono = self.runtime.monotonic()
        if self._observed is None or mono - self._observed >= OBSERVE_EVERY:
            self.clock.observe_time(self.directory.time())
            self._observed = mono
        return self.clock.now()


def _walk_again(e: OSError, attempt: int) -> bool:
    """Whether attempt ``attempt`` (from 0) failing with ``e`` is tried again: NFS said a
    directory or file on the way was removed by another machine (``ESTALE``), and attempts
    are left."""
    return e.errno == errno.ESTALE and attempt + 1 < RETRIES


def _read_exactly(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def _same_file(fd: int, directory: int, name: bytes) -> bool:
    """Whether ``name`` in ``directory`` is the file open at ``fd`` (a rename or link that
    reported a failure but happened)."""
    try:
        mine, there = os.fstat(fd), os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
