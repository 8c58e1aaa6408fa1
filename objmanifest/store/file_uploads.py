"""Multipart uploads of ``FileStore``: part files under ``.objmanifest/uploads/``, completed
create-only.

An upload is a directory ``uploads/ID/`` (an id of ours), made whole in ``tmp/`` and
renamed into place, holding the key it is for (``key``) and one file per part sent,
``N.MD5``: the part's number and the MD5 of its bytes (its ETag, as on S3), so listing the
parts reads the directory and nothing else, and a part sent again with other bytes is kept
beside the first (``PartsListed`` lists each). Completion, under the upload's lock, writes
the chosen parts one after another into a new object file (``copy_file_range``: in the
kernel, a server-side copy on NFS 4.2) whose ETag is S3's multipart ETag of the part ETags
and whose header names the upload (``Head.completed_upload``),
puts it in place under the mode's condition (a link for create-only), and only then removes
the upload; abort renames the upload's directory away (one step: a part sent meanwhile
lands in it or finds it gone) and removes it. There is no smallest part: that is S3's own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import StoreError
from . import file_io, file_paths, file_tree
from .base import PartBody, PartsListed, PutMode
from .errors import PartsRejected, UploadGone
from .file_tree import Temporary

MAX_PART_NUMBER = 10_000

_UPLOAD_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")
_PART = re.compile(r"([1-9][0-9]{0,4})\.([0-9a-f]{32})")
_KEY_FILE = b"key"
_UPLOADS = b"uploads"
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Host(Protocol):
    """What the uploads need of their ``FileStore``."""

    runtime: Runtime

    def describe(self, key: str) -> str: ...
    def error(
        self, e: OSError, action: str, key: str, path: bytes, reading: bool = False
    ) -> Exception: ...
    def locked(self, names: Sequence[str]) -> AbstractContextManager[None]: ...
    def own(self, action: str, key: str, *names: bytes) -> int: ...
    def temporary(self, action: str, key: str) -> Temporary: ...
    def place(self, key: str, write: Callable[[int], str], mode: PutMode) -> str: ...


class Uploads:
    """The multipart uploads of one ``FileStore`` (its ``uploads/`` directory), every one
    reached name by name from the store's directory (``file_tree``: never through a link)."""

    def __init__(self, store: Host, path: bytes) -> None:
        self.store = store
        self.path = path

    def _gone(self, key: str) -> UploadGone:
        return UploadGone(f"{self.store.describe(key)}: the upload no longer exists")

    @contextlib.contextmanager
    def _opened(self, key: str, upload_id: str, action: str) -> Iterator[Upload]:
        """The upload's directory, open, if it is an upload of ``key`` that still exists."""
        if not isinstance(upload_id, str) or not _UPLOAD_ID.fullmatch(upload_id):
            raise self._gone(key)  # not an id this store makes: no such upload
        name = upload_id.encode("ascii")
        path = os.path.join(self.path, name)
        uploads = self.store.own(action, key, _UPLOADS)
        try:
            try:
                directory = file_tree.enter(uploads, name)
            except (FileNotFoundError, NotADirectoryError):
                raise self._gone(key) from None
            except OSError as e:
                raise self.store.error(e, action, key, path) from e
            try:
                try:
                    recorded = _read_key(directory)
                except (FileNotFoundError, NotADirectoryError):
                    raise self._gone(key) from None
                except OSError as e:
                    raise self.store.error(e, action, key, path) from e
                if recorded != file_paths.key_bytes(key):
                    raise self._gone(key)
                yield Upload(uploads, name, directory, path)
            finally:
                os.close(directory)
        finally:
            os.close(uploads)

    def create(self, key: str) -> str:
        file_paths.object_names(key)  # a key no file can hold is refused now, not at the end
        upload_id = self.store.runtime.new_id()
        action = "start a multipart upload of"
        staging = self.store.temporary(action, key)
        try:
            uploads = self.store.own(action, key, _UPLOADS)
            try:
                os.mkdir(staging.name, file_io.DIR_MODE, dir_fd=staging.directory)
                made = os.open(staging.name, file_tree.DIR_FLAGS, dir_fd=staging.directory)
                try:
                    fd = os.open(_KEY_FILE, _NEW_FILE, file_io.FILE_MODE, dir_fd=made)
                    try:
                        file_io.write_all(fd, [file_paths.key_bytes(key)])
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                finally:
                    os.close(made)
                os.rename(
                    staging.name,
                    upload_id.encode("ascii"),
                    src_dir_fd=staging.directory,
                    dst_dir_fd=uploads,
                )
                os.fsync(uploads)
            except OSError as e:
                file_tree.remove_tree(staging.directory, staging.name)
                raise self.store.error(e, action, key, self.path) from e
            finally:
                os.close(uploads)
        finally:
            staging.close()
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        if not isinstance(number, int) or not 1 <= number <= MAX_PART_NUMBER:
            raise StoreError(
                f"could not upload part {number} of {self.store.describe(key)}: part numbers "
                f"are 1 to {MAX_PART_NUMBER}"
            )
        action = f"upload part {number} of"
        with self._opened(key, upload_id, action) as upload:
            temp = self.store.temporary(action, key)
            try:
                return self._send_part(key, upload, temp, number, body)
            finally:
                temp.close()

    def _send_part(
        self, key: str, upload: Upload, temp: Temporary, number: int, body: PartBody
    ) -> str:
        """Write the part to ``temp``, make it durable and rename it into the upload."""
        action = f"upload part {number} of"
        try:
            fd = os.open(temp.name, _NEW_FILE, file_io.FILE_MODE, dir_fd=temp.directory)
        except OSError as e:
            raise self.store.error(e, action, key, temp.path) from e
        placed = False
        try:
            if isinstance(body, bytes):
                etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
                file_io.write_all(fd, [body])
            else:
                etag = file_io.write_stream(fd, body, body.length)  # type: ignore[arg-type]
            os.fsync(fd)
            try:
                os.rename(
                    temp.name,
                    f"{number}.{etag}".encode("ascii"),
                    src_dir_fd=temp.directory,
                    dst_dir_fd=upload.directory,
                )
            except FileNotFoundError:
                if upload.removed():
                    raise self._gone(key) from None
                raise
            placed = True
            os.fsync(upload.directory)
        except OSError as e:
            raise self.store.error(e, action, key, temp.path) from e
        finally:
            os.close(fd)
            if not placed:
                temp.remove()
        return etag

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        listed: PartsListed = {}
        with self._opened(key, upload_id, "list the parts of") as upload:
            try:
                with os.scandir(upload.directory) as found:
                    for entry in found:
                        part = _PART.fullmatch(entry.name)
                        if part is not None:
                            try:
                                size = entry.stat(follow_symlinks=False).st_size
                            except FileNotFoundError:  # the upload removed meanwhile
                                continue
                            listed.setdefault(int(part.group(1)), {})[part.group(2)] = size
            except FileNotFoundError:
                raise self._gone(key) from None
            except OSError as e:
                raise self.store.error(e, "list the parts of", key, upload.path) from e
            if upload.removed():
                raise self._gone(key)
        return dict(sorted(listed.items()))

    def complete(self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode) -> None:
        action = "complete the multipart upload of"
        with (
            self.store.locked([f"upload:{upload_id}"]),
            self._opened(key, upload_id, action) as upload,
        ):
            if not etags:
                raise StoreError(f"could not complete {self.store.describe(key)}: no parts named")
            parts = self._open_parts(key, upload, etags)
            try:
                implied = checksum.multipart_etag(etags)
                assert implied is not None  # every name was checked to be an MD5

                def write(fd: int) -> str:
                    file_io.write_all(fd, [file_io.header_bytes(implied, {}, upload_id)])
                    for part_fd, size in parts:
                        file_io.copy_into(fd, part_fd, size)
                    return implied

                self.store.place(key, write, mode)
            finally:
                for part_fd, _ in parts:
                    os.close(part_fd)
            try:
                self._remove(key, upload, action)
            except OSError as e:
                raise self.store.error(e, action, key, upload.path) from e

    def _open_parts(self, key: str, upload: Upload, etags: Sequence[str]) -> list[tuple[int, int]]:
        """The named parts, open, with their sizes; ``PartsRejected`` if one is not stored
        with that ETag."""
        parts: list[tuple[int, int]] = []
        try:
            for number, etag in enumerate(etags, start=1):
                bare = checksum.bare_etag(etag)
                if not checksum.is_md5(bare):
                    raise PartsRejected(f"{self.store.describe(key)}: InvalidPart {number}")
                name = f"{number}.{bare}".encode("ascii")
                try:
                    fd = os.open(name, _READ_FLAGS, dir_fd=upload.directory)
                except FileNotFoundError:
                    raise PartsRejected(
                        f"{self.store.describe(key)}: InvalidPart {number}"
                    ) from None
                parts.append((fd, 0))
                found = os.fstat(fd)
                if not stat.S_ISREG(found.st_mode):  # a FIFO or device put there by hand
                    raise PartsRejected(f"{self.store.describe(key)}: InvalidPart {number}")
                parts[-1] = (fd, found.st_size)
        except OSError as e:
            for fd, _ in parts:
                os.close(fd)
            raise self.store.error(e, "complete the multipart upload of", key, upload.path) from e
        except BaseException:
            for fd, _ in parts:
                os.close(fd)
            raise
        return parts

    def _remove(self, key: str, upload: Upload, action: str) -> bool:
        """Take an upload's directory out of ``uploads/`` in one step, then remove it; False
        if it was gone already."""
        trash = self.store.temporary(action, key)
        try:
            try:
                os.rename(
                    upload.name, trash.name, src_dir_fd=upload.uploads, dst_dir_fd=trash.directory
                )
            except FileNotFoundError:
                return False
            os.fsync(upload.uploads)
            file_tree.remove_tree(trash.directory, trash.name)
            return True
        finally:
            trash.close()

    def abort(self, key: str, upload_id: str) -> bool:
        action = "abort the multipart upload of"
        with self.store.locked([f"upload:{upload_id}"]):
            try:
                with self._opened(key, upload_id, action) as upload:
                    try:
                        return self._remove(key, upload, action)
                    except OSError as e:
                        raise self.store.error(e, action, key, upload.path) from e
            except UploadGone:
                return False

    def list(self, prefix: str) -> Iterator[tuple[str, str]]:
        wanted = file_paths.key_bytes(prefix, "prefix")
        action = "list the multipart uploads under"
        found: list[tuple[bytes, str]] = []
        uploads = self.store.own(action, prefix, _UPLOADS)
        try:
            try:
                with os.scandir(uploads) as entries:
                    ids = [e.name for e in entries]
            except OSError as e:
                raise self.store.error(e, action, prefix, self.path) from e
            for upload_id in ids:
                if not _UPLOAD_ID.fullmatch(upload_id):
                    continue
                try:
                    directory = file_tree.enter(uploads, upload_id)
                    try:
                        recorded = _read_key(directory)
                    finally:
                        os.close(directory)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        continue  # completed or aborted meanwhile (or no upload of ours)
                    raise self.store.error(e, action, prefix, self.path) from e
                if recorded.startswith(wanted):
                    found.append((recorded, upload_id))
        finally:
            os.close(uploads)
        for recorded, upload_id in sorted(found):
            yield recorded.decode("utf-8"), upload_id


@dataclass(frozen=True)
class Upload:
    """An upload's directory, open, beside ``uploads/`` open, and its name and path there."""

    uploads: int
    name: bytes
    directory: int
    path: bytes

    def removed(self) -> bool:
        """Whether the directory was taken out of ``uploads/`` (completed or aborted)."""
        try:
            there = os.stat(self.name, dir_fd=self.uploads, follow_symlinks=False)
        except FileNotFoundError:
            return True
        mine = os.fstat(self.directory)
        return (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino)


def _read_key(directory: int) -> bytes:
    """The key an upload's directory (open) is for."""
    fd = os.open(_KEY_FILE, _READ_FLAGS, dir_fd=directory)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device put there by hand
            raise FileNotFoundError(errno.ENOENT, "not an upload's key file", _KEY_FILE)
        return os.pread(fd, file_paths.MAX_KEY_BYTES + 1, 0)
    finally:
        os.close(fd)
