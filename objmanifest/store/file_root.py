"""The directory under a ``FileStore``: its path checked, the directory checked and made a
store, and the store's own files under ``.objmanifest/``: ``tmp/`` (swept of what dead
writers left), ``uploads/``, the lock file, and the clock file whose mtime is the
filesystem's time (on NFS, the server's)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
from contextlib import suppress
from datetime import datetime, timezone

from ..errors import InvalidInput, StoreError, UnsupportedStore
from . import file_io, file_paths, file_tree
from .errors import NoSuchObject
from .file_io import failure

log = logging.getLogger(__name__)

SWEEP_EVERY = 600.0
"""Seconds of the filesystem's clock between two sweeps of ``tmp/``."""

STALE_AFTER = 3600.0
"""A temporary file (or a removed upload) unchanged this long was left by a writer that
died: the sweep removes it. A live writer changes its file as it writes."""


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


def permissions_needed(root: str) -> str:
    """What a directory needs instead of a cloud policy: its own permissions, in words
    (``iam-policy`` says it for a ``file://`` URL)."""
    return (
        f"a directory is confined by its own permissions. Every agent's user needs to read, "
        f"write and enter (rwx) {root} and everything under it, and nobody else; agents "
        f"running as several users share it through a group (chgrp -R GROUP {root}; chmod "
        f"-R g+rwXs {root}; and umask 002 for each agent). A directory cannot let agents "
        "write manifest objects yet keep them from deleting them (its write permission "
        "covers both), as the agent's IAM policy does on S3"
    )


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


LOCAL_LOCKS = frozenset({"nolock", "local_lock=all", "local_lock=posix"})
"""NFS mount options under which a lock is kept by the client alone: it excludes nothing
on another machine."""


def mount_of(path: bytes, mountinfo: str) -> tuple[str, set[str]] | None:
    """The filesystem type and options (the mount's and the filesystem's) of the mount that
    holds ``path``, from ``/proc/self/mountinfo``'s text; the last of those mounted on the
    deepest mount point wins, as it hides the others."""
    best: tuple[int, str, set[str]] | None = None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, rest = before.split(), after.split()
        if len(fields) < 6 or len(rest) < 3:
            continue
        point = os.fsencode(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
        inside = path == point or path.startswith(point.rstrip(b"/") + b"/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), rest[0], set(fields[5].split(",")) | set(rest[2].split(",")))
    return None if best is None else (best[1], best[2])


def check_locks(base: bytes, root: str, mountinfo: str | None = None) -> None:
    """Refuse a directory whose locks would not reach other machines (an NFS mount with
    ``nolock`` keeps them on the client), and a system without open file description
    locks. ``mountinfo``: the text of ``/proc/self/mountinfo`` (read if not given)."""
    if not hasattr(fcntl, "F_OFD_SETLKW"):
        raise UnsupportedStore(
            f"file://{root} needs open file description locks (F_OFD_SETLKW, Linux 3.15 and "
            "later) to keep writers from each other, and this system has none"
        )
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError:
            return
    found = mount_of(base, mountinfo)
    if found is not None and found[0].startswith("nfs") and found[1] & LOCAL_LOCKS:
        options = ",".join(sorted(found[1] & LOCAL_LOCKS))
        raise UnsupportedStore(
            f"{root} is on an NFS mount with {options}: its locks stay on this machine, so "
            "writers on two machines could both update one object; mount it without "
            "nolock/local_lock (NFSv4, or NFSv3 with lockd running)"
        )


_CLOCK, _SWEPT = b"clock", b"swept"
"""Files of ``.objmanifest/`` whose times are all they hold: the store's clock, and when
its ``tmp/`` was last swept."""


def _kind_in(directory: int, name: bytes) -> int | None:
    """The mode of ``name`` in ``directory`` (a link's own), None if there is none."""
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def stamp(directory: int, name: bytes, when: float | None = None) -> float:
    """Set the time of ``name`` in ``directory`` (open) to ``when``, or to now by the
    filesystem's clock (on NFS the server's), making it first if it is missing, never
    through a link; the time it reads back."""
    try:
        os.utime(
            name, None if when is None else (when, when), dir_fd=directory, follow_symlinks=False
        )
    except FileNotFoundError:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(name, flags, file_io.FILE_MODE, dir_fd=directory))
        os.utime(
            name, None if when is None else (when, when), dir_fd=directory, follow_symlinks=False
        )
    return os.stat(name, dir_fd=directory, follow_symlinks=False).st_mtime


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
        check_locks(base, root)
        self.base = base
        self.reserved = os.path.join(base, file_paths.RESERVED)
        self.tmp = os.path.join(self.reserved, b"tmp")
        self.uploads = os.path.join(self.reserved, b"uploads")
        self.locks = os.path.join(self.reserved, b"locks")
        self.clock = os.path.join(self.reserved, b"clock")
        self.swept = os.path.join(self.reserved, b"swept")
        self._warned_read_only = False
        try:
            self._set_up()
        except OSError as e:
            raise failure(e, "set up the store in", root, self.reserved, root) from e

    def _set_up(self) -> None:
        """Make ``.objmanifest/`` and its ``tmp/`` and ``uploads/`` where missing (each made
        durable), relative to the directory above it, never through a link."""
        base = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _kind_in(base, file_paths.RESERVED) is None:
                try:
                    file_paths.check_root_free(self.base, self.root)
                except StoreError:
                    if _kind_in(base, file_paths.RESERVED) is None:  # not made a store meanwhile
                        raise
                file_tree.make_in(base, file_paths.RESERVED)
            self._check_own(base, file_paths.RESERVED, self.reserved)
            reserved = file_tree.enter(base, file_paths.RESERVED)
            try:
                for name, path in ((b"tmp", self.tmp), (b"uploads", self.uploads)):
                    if _kind_in(reserved, name) is None:
                        file_tree.make_in(reserved, name)
                    self._check_own(reserved, name, path)
            finally:
                os.close(reserved)
        finally:
            os.close(base)

    @staticmethod
    def _check_own(directory: int, name: bytes, path: bytes) -> None:
        mode = _kind_in(directory, name)
        if mode is not None and not stat.S_ISDIR(mode):
            raise StoreError(
                f"{os.fsdecode(path)} is {kind(mode)}, where objmanifest keeps its own files "
                "(a link there is never followed); move it away"
            )

    def own(self, *names: bytes) -> int:
        """``.objmanifest/NAMES...``, open, reached name by name (``file_tree``: never
        through a link, whatever was swapped in since the store was opened)."""
        return file_tree.open_directory(self.base, [file_paths.RESERVED, *names])

    def present(self) -> bool:
        """Whether the directory still holds the store: a store's directory removed, emptied
        or unmounted (NFS) makes every file missing, which must not read as objects that
        were never written."""
        try:
            found = os.stat(self.reserved, follow_symlinks=False)  # a link there is no store
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:  # EIO, ESTALE, a soft mount's timeout: said as itself by the caller
            return True
        return stat.S_ISDIR(found.st_mode)

    def gone(self, action: str, where: str) -> StoreError:
        """The error of a call that found the store's directory no longer holding it."""
        return StoreError(
            f"could not {action} {where}: the store's directory {self.root} no longer holds "
            f"the store ({os.fsdecode(self.reserved)} is missing, or no directory: the "
            "directory was removed or emptied, or its share unmounted); restore or remount it, "
            "then retry. Nothing was changed"
        )

    def failure(
        self, e: OSError, action: str, where: str, path: bytes, reading: bool = False
    ) -> StoreError | NoSuchObject:
        """``file_io.failure`` of ``e``, unless a missing file means the store is gone."""
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and not self.present():
            return self.gone(action, where)
        return failure(e, action, where, path, self.root, reading)

    def time(self) -> float:
        """The filesystem's time now: the clock file touched (on NFS the server stamps it)
        and its mtime read back; a ``sweep`` when one is due."""
        try:
            reserved = self.own()
            try:
                stamped = stamp(reserved, _CLOCK)
            finally:
                os.close(reserved)
        except OSError as e:
            if e.errno == errno.EROFS or (
                e.errno in file_io.DENIED and not os.access(self.tmp, os.W_OK)
            ):
                return self._reading_only(e)
            raise self.failure(e, "read the time of", f"file://{self.root}", self.clock) from e
        self._sweep_if_due(stamped)
        return stamped

    def _reading_only(self, e: OSError) -> float:
        """The time of a process that may write nothing (a read-only mount, or a user who
        may write neither the clock file nor ``tmp/``, through which every write goes): this
        machine's clock, which then only tells what it shows (a lease overdue), never a
        decision. One that may write ``tmp/`` but not the clock file is refused the time
        (``AccessDenied``), never given its own clock to decide a lease by."""
        if not self._warned_read_only:
            self._warned_read_only = True
            log.warning(
                "cannot stamp %s (%s): reading file://%s by this machine's clock",
                os.fsdecode(self.clock),
                e.strerror,
                self.root,
            )
        return datetime.now(timezone.utc).timestamp()

    def _sweep_if_due(self, now: float) -> None:
        """Sweep every ``SWEEP_EVERY`` seconds, by whichever process looks at the clock
        then; a sweep that fails is tried again at the next."""
        try:
            reserved = self.own()
        except OSError:
            return
        try:
            try:
                if now - os.stat(_SWEPT, dir_fd=reserved, follow_symlinks=False).st_mtime < (
                    SWEEP_EVERY
                ):
                    return
            except FileNotFoundError:
                pass
            except OSError:
                return
            with suppress(OSError):
                stamp(reserved, _SWEPT, now)
                self.sweep(now)
        finally:
            os.close(reserved)

    def sweep(self, now: float, older: float = STALE_AFTER) -> int:
        """Remove every temporary file or removed upload unchanged for ``older`` seconds
        before ``now`` (the filesystem's time); how many."""
        tmp = self.own(b"tmp")  # never a link's directory
        try:
            with os.scandir(tmp) as found:
                stale = [e for e in found if now - e.stat(follow_symlinks=False).st_mtime > older]
            for entry in stale:
                file_tree.remove_tree(tmp, entry.name)
        finally:
            os.close(tmp)
        return len(stale)
