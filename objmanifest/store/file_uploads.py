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
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import StoreError
from . import file_io, file_paths
from .base import PartBody, PartsListed, PutMode
from .errors import PartsRejected, UploadGone

MAX_PART_NUMBER = 10_000

_UPLOAD_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")
_PART = re.compile(r"([1-9][0-9]{0,4})\.([0-9a-f]{32})")
_KEY_FILE = b"key"


class Host(Protocol):
    """What the uploads need of their ``FileStore``."""

    runtime: Runtime

    def describe(self, key: str) -> str: ...
    def error(
        self, e: OSError, action: str, key: str, path: bytes, reading: bool = False
    ) -> Exception: ...
    def locked(self, names: Sequence[str]) -> AbstractContextManager[None]: ...
    def temporary(self) -> bytes: ...
    def place(self, key: str, write: Callable[[int], str], mode: PutMode) -> str: ...


class Uploads:
    """The multipart uploads of one ``FileStore`` (its ``uploads/`` directory)."""

    def __init__(self, store: Host, path: bytes) -> None:
        self.store = store
        self.path = path

    def _gone(self, key: str) -> UploadGone:
        return UploadGone(f"{self.store.describe(key)}: the upload no longer exists")

    def _dir(self, key: str, upload_id: str) -> bytes:
        """The upload's directory, if it is an upload of ``key`` that still exists."""
        if not isinstance(upload_id, str) or not _UPLOAD_ID.fullmatch(upload_id):
            raise self._gone(key)  # not an id this store makes: no such upload
        directory = os.path.join(self.path, upload_id.encode("ascii"))
        try:
            with open(os.path.join(directory, _KEY_FILE), "rb") as f:
                recorded = f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone(key) from None
        except OSError as e:
            raise self.store.error(e, "read the upload of", key, directory) from e
        if recorded != file_paths.key_bytes(key):
            raise self._gone(key)
        return directory

    def create(self, key: str) -> str:
        file_paths.object_names(key)  # a key no file can hold is refused now, not at the end
        upload_id = self.store.runtime.new_id()
        staging = self.store.temporary()
        try:
            os.mkdir(staging, file_io.DIR_MODE)
            fd = os.open(
                os.path.join(staging, _KEY_FILE),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                file_io.FILE_MODE,
            )
            try:
                file_io.write_all(fd, [file_paths.key_bytes(key)])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(staging, os.path.join(self.path, upload_id.encode("ascii")))
            file_io.sync_dir(self.path)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise self.store.error(e, "start a multipart upload of", key, self.path) from e
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        if not isinstance(number, int) or not 1 <= number <= MAX_PART_NUMBER:
            raise StoreError(
                f"could not upload part {number} of {self.store.describe(key)}: part numbers "
                f"are 1 to {MAX_PART_NUMBER}"
            )
        directory = self._dir(key, upload_id)
        temp = self.store.temporary()
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self.store.error(e, f"upload part {number} of", key, temp) from e
        placed = False
        try:
            if isinstance(body, bytes):
                etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
                file_io.write_all(fd, [body])
            else:
                etag = file_io.write_stream(fd, body, body.length)  # type: ignore[arg-type]
            os.fsync(fd)
            try:
                os.rename(temp, os.path.join(directory, f"{number}.{etag}".encode("ascii")))
            except FileNotFoundError:
                if not os.path.isdir(directory):
                    raise self._gone(key) from None
                raise
            placed = True
            file_io.sync_dir(directory)
        except FileNotFoundError as e:
            if placed:  # aborted just after the part landed
                return etag
            raise self.store.error(e, f"upload part {number} of", key, temp) from e
        except OSError as e:
            raise self.store.error(e, f"upload part {number} of", key, temp) from e
        finally:
            os.close(fd)
            if not placed:
                _remove(temp)
        return etag

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        directory = self._dir(key, upload_id)
        listed: PartsListed = {}
        try:
            with os.scandir(directory) as found:
                for entry in found:
                    part = _PART.fullmatch(os.fsdecode(entry.name))
                    if part is not None:
                        size = entry.stat(follow_symlinks=False).st_size
                        listed.setdefault(int(part.group(1)), {})[part.group(2)] = size
        except FileNotFoundError:
            raise self._gone(key) from None
        except OSError as e:
            raise self.store.error(e, "list the parts of", key, directory) from e
        return dict(sorted(listed.items()))

    def complete(self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode) -> None:
        with self.store.locked([f"upload:{upload_id}"]):
            directory = self._dir(key, upload_id)
            if not etags:
                raise StoreError(f"could not complete {self.store.describe(key)}: no parts named")
            parts = self._open_parts(key, directory, etags)
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
            self._remove(directory)

    def _open_parts(
        self, key: str, directory: bytes, etags: Sequence[str]
    ) -> list[tuple[int, int]]:
        """The named parts, open, with their sizes; ``PartsRejected`` if one is not stored
        with that ETag."""
        parts: list[tuple[int, int]] = []
        try:
            for number, etag in enumerate(etags, start=1):
                bare = checksum.bare_etag(etag)
                if not checksum.is_md5(bare):
                    raise PartsRejected(f"{self.store.describe(key)}: InvalidPart {number}")
                name = os.path.join(directory, f"{number}.{bare}".encode("ascii"))
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise PartsRejected(
                        f"{self.store.describe(key)}: InvalidPart {number}"
                    ) from None
                parts.append((fd, 0))
                parts[-1] = (fd, os.fstat(fd).st_size)
        except OSError as e:
            for fd, _ in parts:
                os.close(fd)
            raise self.store.error(e, "complete the multipart upload of", key, directory) from e
        except BaseException:
            for fd, _ in parts:
                os.close(fd)
            raise
        return parts

    def _remove(self, directory: bytes) -> bool:
        """Take an upload's directory out of ``uploads/`` in one step, then remove it; False
        if it was gone already."""
        trash = self.store.temporary()
        try:
            os.rename(directory, trash)
        except FileNotFoundError:
            return False
        file_io.sync_dir(self.path)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def abort(self, key: str, upload_id: str) -> bool:
        with self.store.locked([f"upload:{upload_id}"]):
            try:
                directory = self._dir(key, upload_id)
            except UploadGone:
                return False
            try:
                return self._remove(directory)
            except OSError as e:
                raise self.store.error(e, "abort the multipart upload of", key, directory) from e

    def list(self, prefix: str) -> Iterator[tuple[str, str]]:
        wanted = file_paths.key_bytes(prefix, "prefix")
        found: list[tuple[bytes, str]] = []
        try:
            with os.scandir(self.path) as entries:
                ids = [os.fsdecode(e.name) for e in entries]
        except OSError as e:
            raise self.store.error(e, "list the multipart uploads under", prefix, self.path) from e
        for upload_id in ids:
            if not _UPLOAD_ID.fullmatch(upload_id):
                continue
            try:
                with open(os.path.join(self.path, upload_id.encode(), _KEY_FILE), "rb") as f:
                    recorded = f.read()
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # completed or aborted meanwhile
                raise self.store.error(
                    e, "list the multipart uploads under", prefix, self.path
                ) from e
            if recorded.startswith(wanted):
                found.append((recorded, upload_id))
        for recorded, upload_id in sorted(found):
            yield recorded.decode("utf-8"), upload_id


def _remove(path: bytes) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
