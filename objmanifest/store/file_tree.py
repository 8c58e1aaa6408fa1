"""The directories of ``FileStore``, opened name by name without following a link.

A path handed to the kernel whole follows every symbolic link on its way: a directory of the
store replaced by a link (by hand, by another program, by another user of a share) would take
a read, a write or a delete somewhere outside the store. So a directory of the key space, or
of the store's own ``.objmanifest/``, is reached from the store's directory one name at a
time, each opened with ``O_NOFOLLOW`` relative to the one before, and what is in it is then
read, linked, renamed or removed relative to it (``dir_fd``): a link anywhere on the way is
``ELOOP``, never followed, whatever is swapped in meanwhile. The store's directory itself is
the path its user gave (resolved once, when the store is opened).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

from . import file_io

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _said(e: OSError, base: bytes, names: Sequence[bytes]) -> OSError:
    """``e`` with the whole path of ``names`` under ``base`` as its file name (the kernel
    only knew the last name)."""
    code = e.errno
    return OSError(code, os.strerror(code) if code else str(e), os.path.join(base, *names))


def open_directory(base: bytes, names: Sequence[bytes], *, make: bool = False) -> int:
    """The directory of ``names`` under the store's directory ``base``, open, reached one
    name at a time (each directory closed once the next is open: a key of a thousand
    segments holds no more descriptors than one of two). ``make``: a missing directory is
    made (and made durable in its parent). An ``OSError`` names the whole path it met
    (``FileNotFoundError`` for a directory missing, ``ELOOP`` for a link)."""
    try:
        fd = os.open(base, DIR_FLAGS)
    except OSError as e:
        raise _said(e, base, ()) from e
    for i, name in enumerate(names):
        try:
            inner = _enter(fd, name, make)
        except OSError as e:
            said = _said(e, base, names[: i + 1])
            os.close(fd)
            raise said from e
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        fd = inner
    return fd


def enter(parent: int, name: bytes | str) -> int:
    """The directory ``name`` in ``parent``, open; ``ELOOP`` if it is a link (which
    ``O_DIRECTORY`` may answer ``ENOTDIR`` for)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError as e:
        if _is_link(parent, name):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from e
        raise


def _is_link(parent: int, name: bytes | str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _enter(parent: int, name: bytes, make: bool) -> int:
    """The directory ``name`` in ``parent``, open (made first if missing and ``make``)."""
    try:
        return enter(parent, name)
    except FileNotFoundError:
        if not make:
            raise
    make_in(parent, name)
    return enter(parent, name)


def make_in(parent: int, name: bytes) -> None:
    """The directory ``name`` made in ``parent`` (by this process, or by another meanwhile,
    perhaps not durable yet), and made durable."""
    with suppress(FileExistsError):
        os.mkdir(name, file_io.DIR_MODE, dir_fd=parent)
    os.fsync(parent)


def remove_empty(base: bytes, names: Sequence[bytes]) -> None:
    """Remove the directories of ``names`` under ``base`` that are left empty, the deepest
    first, up to the first that is not (each reached afresh from ``base``)."""
    for i in range(len(names) - 1, -1, -1):
        try:
            parent = open_directory(base, names[:i])
        except OSError:
            return
        try:
            os.rmdir(names[i], dir_fd=parent)
        except OSError:
            return
        finally:
            os.close(parent)


TREE_DEPTH = 16
"""The deepest ``remove_tree`` goes: the store's own trees (an upload's, made in ``tmp/``)
are one level deep; deeper ones were put there by someone else, and are left."""


def remove_tree(parent: int, name: bytes | str, depth: int = 0) -> None:
    """Remove ``name`` in ``parent`` and, if it is a directory, all it holds, never through
    a link (a link is removed itself); what cannot be removed is left."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:  # a file, a link, or gone
        with suppress(OSError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        with os.scandir(fd) as found:
            inside = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in found]
        for child, is_dir in inside:
            if not is_dir:
                with suppress(OSError):
                    os.unlink(child, dir_fd=fd)
            elif depth < TREE_DEPTH:
                remove_tree(fd, child, depth + 1)
    finally:
        os.close(fd)
    with suppress(OSError):
        os.rmdir(name, dir_fd=parent)


@dataclass(frozen=True)
class Temporary:
    """A temporary file's (or directory's) name in ``tmp/``, open as ``directory``, and its
    path for messages."""

    directory: int
    name: bytes
    path: bytes

    def exists(self) -> bool:
        try:
            os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def remove(self) -> None:
        with suppress(OSError):
            os.unlink(self.name, dir_fd=self.directory)

    def close(self) -> None:
        os.close(self.directory)
