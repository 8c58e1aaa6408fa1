"""The directory under a ``FileStore``: its URL checked, the directory checked and made a
store, and the store's own files under ``.objmanifest/``: ``tmp/`` (swept of what dead
writers left), ``uploads/``, the lock file, and the clock file whose mtime is the
filesystem's time (on NFS, the server's)."""

from __future__ import annotations

import os
import shutil
import stat
import unicodedata
from contextlib import suppress
from email.utils import formatdate
from urllib.parse import unquote, urlsplit

from ..errors import InvalidInput, StoreError
from . import file_io, file_paths
from .file_io import failure

SWEEP_EVERY = 600.0
"""Seconds of the filesystem's clock between two sweeps of ``tmp/``."""

STALE_AFTER = 3600.0
"""A temporary file (or a removed upload) unchanged this long was left by a writer that
died: the sweep removes it. A live writer changes its file as it writes."""


def file_root(url: str) -> str:
    """The directory of ``file:///ABSOLUTE/DIR``, checked: an absolute path with no host,
    query or fragment, no control character, and no ``.``, ``..`` or empty segment."""
    if not isinstance(url, str) or any(unicodedata.category(c) == "Cc" for c in url):
        raise InvalidInput(f"a store URL has no control characters (a newline, a tab ...): {url!r}")
    parts = urlsplit(url)
    if parts.scheme != "file" or not url.startswith("file://"):
        raise InvalidInput(f"not a file URL: {url!r}; use file:///ABSOLUTE/DIR")
    if parts.netloc:
        raise InvalidInput(
            f"{url!r} names a host ({parts.netloc!r}): a file URL names a directory of this "
            "machine, file:///ABSOLUTE/DIR (three slashes; an NFS share is used where it is "
            "mounted)"
        )
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise InvalidInput(f"a store URL has no query or fragment: {url!r}")
    try:
        path = unquote(parts.path, errors="strict")
    except UnicodeDecodeError:
        raise InvalidInput(f"{url!r} has a %-escape that is not UTF-8") from None
    if any(unicodedata.category(c) == "Cc" for c in path):
        raise InvalidInput(f"the directory of {url!r} has a control character")
    return check_root_path(path, url)


def check_root_path(path: str, shown: str) -> str:
    """An absolute directory path, without a trailing slash."""
    if not isinstance(path, str):
        raise InvalidInput(f"a FileStore's directory is a str path, not {path!r}")
    if not path.startswith("/"):
        raise InvalidInput(
            f"the directory of {shown!r} is not absolute: use file:///ABSOLUTE/DIR (the path "
            "after file:// starts with /)"
        )
    if "\x00" in path:
        raise InvalidInput(f"the directory of {shown!r} has a NUL character")
    trimmed = path.rstrip("/")
    if not trimmed:
        raise InvalidInput(
            f"{shown!r} is the filesystem's root: give objmanifest a directory of its own, "
            "such as file:///srv/objmanifest"
        )
    if any(part in ("", ".", "..") for part in trimmed[1:].split("/")):
        raise InvalidInput(
            f"the directory of {shown!r} has an empty, '.' or '..' segment; write the path "
            "plainly, such as file:///srv/objmanifest/jobs"
        )
    return trimmed


def kind(mode: int) -> str:
    """What a file of this mode is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def touch(path: bytes) -> None:
    """Create ``path`` if it is missing (an empty file)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, file_io.FILE_MODE))


class Directory:
    """A store's directory: resolved once (a link to it cannot be turned elsewhere later),
    checked to be a directory, and made a store if it is empty."""

    def __init__(self, root: str) -> None:
        self.root = root
        base = os.fsencode(os.path.realpath(root))
        try:
            found = os.stat(base)
        except FileNotFoundError:
            raise StoreError(
                f"the store's directory {root} does not exist (or is a dangling link); "
                f"create it (mkdir -p {root}), or mount the share there"
            ) from None
        except OSError as e:
            raise failure(e, "open the store", root, base, root) from e
        if not stat.S_ISDIR(found.st_mode):
            raise StoreError(
                f"the store's directory {root} is not a directory (it is {kind(found.st_mode)}); "
                "give file:// a directory"
            )
        self.base = base
        self.reserved = os.path.join(base, file_paths.RESERVED)
        self.tmp = os.path.join(self.reserved, b"tmp")
        self.uploads = os.path.join(self.reserved, b"uploads")
        self.locks = os.path.join(self.reserved, b"locks")
        self.clock = os.path.join(self.reserved, b"clock")
        self.swept = os.path.join(self.reserved, b"swept")
        try:
            self._set_up()
        except OSError as e:
            raise failure(e, "set up the store in", root, self.reserved, root) from e

    def _set_up(self) -> None:
        try:
            found = os.lstat(self.reserved)
        except FileNotFoundError:
            try:
                file_paths.check_root_free(self.base, self.root)
            except StoreError:
                if not os.path.isdir(self.reserved):  # not made a store meanwhile by another
                    raise
            with suppress(FileExistsError):
                os.mkdir(self.reserved, file_io.DIR_MODE)
            found = os.lstat(self.reserved)
        if not stat.S_ISDIR(found.st_mode):
            raise StoreError(
                f"{os.fsdecode(self.reserved)} is {kind(found.st_mode)}, where objmanifest "
                "keeps its own files; move it away"
            )
        for made in (self.tmp, self.uploads):
            with suppress(FileExistsError):
                os.mkdir(made, file_io.DIR_MODE)

    def time(self) -> float:
        """The filesystem's time now: the clock file touched (on NFS the server stamps it)
        and its mtime read back; a ``sweep`` when one is due."""
        try:
            try:
                os.utime(self.clock, None)
            except FileNotFoundError:
                touch(self.clock)
                os.utime(self.clock, None)
            stamped = os.stat(self.clock).st_mtime
        except OSError as e:
            raise failure(
                e, "read the time of", f"file://{self.root}", self.clock, self.root
            ) from e
        self._sweep_if_due(stamped)
        return stamped

    @staticmethod
    def date(stamped: float) -> str:
        """A time as a ``Date`` header says it, for ``StoreClock``."""
        return formatdate(stamped, usegmt=True)

    def _sweep_if_due(self, now: float) -> None:
        """Sweep every ``SWEEP_EVERY`` seconds, by whichever process looks at the clock
        then; a sweep that fails is tried again at the next."""
        try:
            if now - os.stat(self.swept).st_mtime < SWEEP_EVERY:
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        with suppress(OSError):
            touch(self.swept)
            os.utime(self.swept, (now, now))
            self.sweep(now)

    def sweep(self, now: float, older: float = STALE_AFTER) -> int:
        """Remove every temporary file or removed upload unchanged for ``older`` seconds
        before ``now`` (the filesystem's time); how many."""
        with os.scandir(self.tmp) as found:
            stale = [e for e in found if now - e.stat(follow_symlinks=False).st_mtime > older]
        for entry in stale:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with suppress(OSError):
                    os.unlink(entry.path)
        return len(stale)
