"""The directories of ``FileStore``'s key space, opened name by name without following a link.

A path handed to the kernel whole follows every symbolic link on its way: a directory of the
tree replaced by a link (by hand, by another program, by a user of the share) would take a
read, a write or a delete of an object somewhere outside the store. So an object's directory
is reached from the store's own directory one name at a time, each opened with
``O_NOFOLLOW`` relative to the one before, and the object's file is then read, linked,
renamed or removed relative to that last directory (``dir_fd``): a link anywhere on the way
is ``ELOOP``, never followed, whatever is swapped in meanwhile. The store's directory itself
is the path its user gave (resolved once, when the store is opened).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from . import file_io

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _said(e: OSError, base: bytes, names: Sequence[bytes]) -> OSError:
    """``e`` with the whole path of ``names`` under ``base`` as its file name (the kernel
    only knew the last name); a link in the way is ``ELOOP`` wherever it is."""
    code = e.errno
    if code == errno.ENOTDIR and names:
        try:
            if os.path.islink(os.path.join(base, *names)):
                code = errno.ELOOP  # O_DIRECTORY met the link before O_NOFOLLOW did
        except OSError:
            pass
    return OSError(code, os.strerror(code) if code else str(e), os.path.join(base, *names))


def open_directories(base: bytes, names: Sequence[bytes], *, make: bool = False) -> list[int]:
    """The store's directory ``base`` and each directory of ``names`` under it, open:
    ``fds[i]`` holds ``names[i]``, so the last is the directory of whatever ``names`` leads
    to next (``close_all`` them). ``make``: a missing directory is made (and made durable in
    its parent). An ``OSError`` names the whole path it met (``FileNotFoundError`` for a
    directory missing, ``ELOOP`` for a link), with nothing left open."""
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(base, DIR_FLAGS))
        except OSError as e:
            raise _said(e, base, ()) from e
        for i, name in enumerate(names):
            try:
                fds.append(_enter(fds[-1], name, make))
            except OSError as e:
                raise _said(e, base, names[: i + 1]) from e
    except BaseException:
        close_all(fds)
        raise
    return fds


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _enter(parent: int, name: bytes, make: bool) -> int:
    """The directory ``name`` in ``parent``, open (made first if missing and ``make``)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not make:
            raise
    try:
        os.mkdir(name, file_io.DIR_MODE, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile by another writer
    else:
        os.fsync(parent)
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def remove_empty(fds: Sequence[int], names: Sequence[bytes]) -> None:
    """Remove the directories of ``names`` (opened by ``open_directories``) that are
    left empty, the deepest first, up to the first that is not."""
    for i in range(len(names) - 1, -1, -1):
        try:
            os.rmdir(names[i], dir_fd=fds[i])
        except OSError:
            return
