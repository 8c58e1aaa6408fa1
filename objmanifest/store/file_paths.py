"""How ``FileStore`` maps object keys to paths, and lists them back in key order.

A key's ``/``-separated segments become nested directories, its last segment a file. The
mapping is injective and reversible, whatever the key holds:

* each segment's UTF-8 bytes are kept as they are, but for ``%XX`` escapes of the bytes a
  name must not hold or that mark a name's kind: control bytes, ``%``, ``=`` and ``+``, and
  a leading ``.`` (so no name of ours starts with a dot: ``.`` and ``..`` are ``%2E`` and
  ``%2E.``, and the store's own files under ``.objmanifest/`` are out of the key space);
* a directory's name ends in ``=`` and an object's does not, so ``x`` (an object), ``x/y``
  (under the directory ``x=``) and ``x.json/y`` live side by side; an empty segment is ``=``
  as a directory and ``%`` as an object;
* an encoded segment longer than ``NAME_BYTES`` is cut into directories whose names end in
  ``+``, each continued by the next (``NAME_MAX`` is 255 bytes on every filesystem Linux
  mounts, and a key segment may be as long as a whole key).

A name that is not the canonical encoding of something (a dotfile, ``lost+found``, a file
another program left) is not an object of the store: listings pass over it.

Listings read each directory once and sort its entries by what they decode to, an object's
segment as it is and a directory's followed by ``/``: every key under a directory shares
that prefix, so a depth-first walk yields keys in the order of their UTF-8 bytes, as S3
lists them.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ..errors import InvalidInput, StoreError
from . import file_tree

MAX_KEY_BYTES = 1024
"""The longest key, in UTF-8 bytes (S3's limit too)."""

NAME_BYTES = 240
"""The longest encoded segment kept in one name; longer ones continue in a directory."""

RESERVED = b".objmanifest"
"""The store's own directory at the root (temporary files, uploads, the lock file, the
clock file): no key maps to a name that starts with a dot."""

Kind = Literal["object", "dir", "more"]

_ESCAPED = frozenset([*range(0x20), 0x7F, ord("%"), ord("="), ord("+")])
_ESCAPE = re.compile(rb"%([0-9A-F]{2})")
_EMPTY_OBJECT = b"%"
_DIR = b"="
_MORE = b"+"


def key_bytes(key: str, what: str = "key") -> bytes:
    """A key's UTF-8 bytes; a key that no store could hold is ``InvalidInput``."""
    if not isinstance(key, str):
        raise InvalidInput(f"a {what} is a str, not {type(key).__name__}: {key!r}")
    try:
        data = key.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(
            f"the {what} {key!r} is not valid Unicode text (a lone surrogate at {e.start}): "
            "keys are UTF-8"
        ) from None
    if len(data) > MAX_KEY_BYTES:
        raise InvalidInput(
            f"the {what} {key[:60]!r}... is {len(data)} bytes long: a key has at most "
            f"{MAX_KEY_BYTES} bytes of UTF-8"
        )
    return data


def escape(segment: bytes) -> bytes:
    """A segment's bytes with every byte a name must not hold as ``%XX``."""
    out = bytearray()
    for i, byte in enumerate(segment):
        if byte in _ESCAPED or (i == 0 and byte == 0x2E):
            out += b"%%%02X" % byte
        else:
            out.append(byte)
    return bytes(out)


def unescape(encoded: bytes) -> str | None:
    """The segment ``encoded`` stands for, or None if it is not the canonical encoding of
    one (a stray ``%``, an escape of a byte that needs none, bytes that are not UTF-8)."""
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), encoded)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if escape(raw) == encoded else None


def _pieces(encoded: bytes) -> list[bytes]:
    """``encoded`` cut into pieces of at most ``NAME_BYTES``, never inside an escape."""
    pieces = []
    while len(encoded) > NAME_BYTES:
        cut = NAME_BYTES
        percent = encoded.rfind(b"%", cut - 2, cut)
        if percent >= 0:  # not inside an escape
            cut = percent
        while 0x80 <= encoded[cut] < 0xC0:  # nor inside a character
            cut -= 1
        pieces.append(encoded[:cut])
        encoded = encoded[cut:]
    pieces.append(encoded)
    return pieces


def segment_names(segment: str, kind: Literal["object", "dir"]) -> list[bytes]:
    """The names (a chain of directories, then the last) that hold one segment."""
    encoded = escape(segment.encode("utf-8"))
    *more, last = _pieces(encoded)
    names = [piece + _MORE for piece in more]
    if kind == "dir":
        names.append(last + _DIR)
    else:
        names.append(last or _EMPTY_OBJECT)
    return names


def dir_names(segments: list[str]) -> list[bytes]:
    """The path, name by name, of the directory that holds keys starting with these
    segments (each followed by ``/``)."""
    return [name for segment in segments for name in segment_names(segment, "dir")]


def object_names(key: str) -> list[bytes]:
    """The path, name by name, of the file that holds ``key``."""
    key_bytes(key)
    if not key:
        raise InvalidInput("an object key is not empty")
    *dirs, last = key.split("/")
    return dir_names(dirs) + segment_names(last, "object")


def read_name(name: bytes) -> tuple[bytes, Kind] | None:
    """What a name in the key space is: an encoded piece and its kind; None for a name the
    store never makes."""
    if not name or name.startswith(b"."):
        return None
    if name.endswith(_DIR):
        return name[:-1], "dir"
    if name.endswith(_MORE):
        return (name[:-1], "more") if len(name) > 1 else None
    return (b"", "object") if name == _EMPTY_OBJECT else (name, "object")


# -- listing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Child:
    """One object or directory of a directory: its decoded segment and its names there (a
    continued segment's directories, then its own)."""

    segment: str
    is_dir: bool
    names: tuple[bytes, ...]

    @property
    def order(self) -> str:
        """Where it sorts among its siblings (code points sort as UTF-8 bytes do)."""
        return self.segment + "/" if self.is_dir else self.segment


def _scan(directory: int) -> list[tuple[bytes, bool]]:
    """The names in a directory (open), with whether each is a directory; a link is no
    object and no directory of the store's, whatever it points at: passed over."""
    with os.scandir(directory) as found:
        return [
            (os.fsencode(entry.name), entry.is_dir(follow_symlinks=False))
            for entry in found
            if not entry.is_symlink()
        ]


MORE_NAMES = 16
"""The most directories one segment continues through (a 1024-byte key, every byte escaped,
in names of ``NAME_BYTES``, takes 13): a deeper chain is none of the store's."""


def _open_child(directory: int, names: tuple[bytes, ...]) -> int | None:
    """The directory ``names`` leads to from ``directory`` (open), open, never through a
    link; None if it is gone (or was swapped for a link or a file since it was listed)."""
    fd = directory
    try:
        for name in names:
            inner = file_tree.enter(fd, name)
            if fd != directory:
                os.close(fd)
            fd = inner
    except OSError as e:
        if fd != directory:
            os.close(fd)
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    except BaseException:
        if fd != directory:
            os.close(fd)
        raise
    return None if fd == directory else fd


def children(directory: int, chain: tuple[bytes, ...] = ()) -> list[Child]:
    """The objects and directories directly in ``directory`` (open), in key order, continued
    names followed into their directories (``chain``: the continued names that led here)."""
    found: list[Child] = []
    for name, is_dir in _scan(directory):
        read = read_name(name)
        if read is None:
            continue
        _, kind = read
        if kind == "more":
            if is_dir and len(chain) < MORE_NAMES:
                more = _open_child(directory, (name,))
                if more is not None:
                    try:
                        found += [
                            Child(c.segment, c.is_dir, (name, *c.names))
                            for c in children(more, (*chain, name))
                        ]
                    finally:
                        os.close(more)
            continue
        if (kind == "dir") != is_dir:
            continue
        encoded = b"".join(n[:-1] for n in chain) + read[0]
        segment = unescape(encoded)
        if segment is None or segment_names(segment, kind) != [*chain, name]:
            continue  # not a name the store makes (a dotfile, lost+found, another's file)
        found.append(Child(segment, kind == "dir", (name,)))
    found.sort(key=lambda child: child.order)
    return found


def _too_deep(key_prefix: str) -> bool:
    """Whether no key can start with ``key_prefix`` (it is longer than any key)."""
    return len(key_prefix.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES


HELD_LEVELS = 8
"""The directories a walk keeps open: the deepest ones, from which it goes down; one above
them is opened again (from the first) only when the walk comes back up to it with more of
its directories to go into. A key of a thousand segments is walked in linear time with a
few descriptors."""


class _Level(NamedTuple):
    """A directory a walk is in: its children left to look at, their keys' prefix, and the
    names that lead to it from the walk's first directory."""

    pending: Iterator[Child]
    prefix: str
    path: tuple[bytes, ...]


def walk(directory: int, key_prefix: str) -> Generator[str, None, None]:
    """Every object key under ``directory`` (open; its keys start with ``key_prefix``), in
    key order, depth first without recursion (a key may have a thousand segments). A
    directory deeper than any key reaches is not the store's: not walked."""
    if _too_deep(key_prefix):
        return
    levels = [_Level(iter(children(directory)), key_prefix, ())]
    fds: list[int | None] = [directory]  # each level's directory, while it is kept open
    held = 0  # the open ones below the first: always the deepest levels, one run of them
    try:
        while levels:
            level = levels[-1]
            child = next(level.pending, None)
            if child is None:
                levels.pop()
                fd = fds.pop()
                if fd is not None and fd != directory:
                    os.close(fd)
                    held -= 1
                continue
            key = level.prefix + child.segment
            if not child.is_dir:
                yield key
                continue
            if _too_deep(key + "/"):
                continue
            parent = fds[-1]
            if parent is None:  # every level below it is done: opened again from the first
                parent = fds[-1] = _open_child(directory, level.path)
                if parent is None:
                    continue
                held += 1
            inside = _open_child(parent, child.names)
            if inside is None:
                continue
            try:
                listed = children(inside)
            except BaseException:
                os.close(inside)
                raise
            levels.append(_Level(iter(listed), key + "/", level.path + child.names))
            fds.append(inside)
            held += 1
            if held > HELD_LEVELS:  # the shallowest of the run is let go
                shallowest = len(fds) - held
                os.close(fds[shallowest])  # type: ignore[arg-type]
                fds[shallowest] = None
                held -= 1
    finally:
        for fd in fds:
            if fd is not None and fd != directory:
                os.close(fd)


def holds_objects(directory: int, key_prefix: str) -> bool:
    """Whether any object lives under ``directory`` (open; its keys start with
    ``key_prefix``): a directory emptied by deletes, or being filled, may have none."""
    keys = walk(directory, key_prefix)
    try:
        return next(keys, None) is not None
    finally:
        keys.close()


def listing(root: bytes, prefix: str, delimiter: str | None) -> Iterator[tuple[str, bool]]:
    """(key, is_prefix) of every key under ``prefix``, in key order; with a delimiter,
    keys that hold it after the prefix rolled up into one row each. Every directory is
    reached name by name from ``root`` (``file_tree``): a link on the prefix's way is
    ``ELOOP``, one met below is passed over."""
    key_bytes(prefix, "prefix")
    *whole, partial = prefix.split("/")
    try:
        base = file_tree.open_directory(root, dir_names(whole))
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        yield from _listed(base, prefix, "".join(f"{s}/" for s in whole), partial, delimiter)
    finally:
        os.close(base)


def _listed(
    base: int, prefix: str, under: str, partial: str, delimiter: str | None
) -> Iterator[tuple[str, bool]]:
    rolled: str | None = None

    def row(found: str) -> tuple[str, bool] | None:
        """``found``'s row: rolled up when it holds ``delimiter`` after the prefix (None for
        the next key of a run already rolled up)."""
        nonlocal rolled
        cut = found.find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            return found, False
        rolled_up = found[: cut + len(delimiter or "")]
        if rolled_up == rolled:
            return None
        rolled = rolled_up
        return rolled_up, True

    for child in children(base):
        if not child.segment.startswith(partial):
            continue
        key = under + child.segment
        if not child.is_dir:
            r = row(key)
            if r is not None:
                yield r
            continue
        inside = _open_child(base, child.names)
        if inside is None:
            continue
        try:
            if delimiter == "/":
                if holds_objects(inside, key + "/"):
                    yield key + "/", True
                continue
            for k in walk(inside, key + "/"):
                r = row(k)
                if r is not None:
                    yield r
        finally:
            os.close(inside)


def check_root_free(root: bytes, shown: str) -> None:
    """Refuse a directory that holds names of the key space (files of someone else's) and
    is not a store yet: objmanifest never lists, replaces or deletes what it did not write."""
    directory = file_tree.open_directory(root, ())
    try:
        foreign = children(directory)
    finally:
        os.close(directory)
    if foreign:
        names = ", ".join(os.fsdecode(c.names[-1]) for c in foreign[:3])
        if any(c.is_dir for c in foreign):  # a directory named as the store names them
            raise StoreError(
                f"{shown} holds what looks like the objects of an objmanifest store ({names}"
                f"{' ...' if len(foreign) > 3 else ''}) but not the store's own directory "
                f"{RESERVED.decode()}/ (removed?): if it is a store, make that directory again "
                f"(mkdir {shown}/{RESERVED.decode()}) and open it again; otherwise give "
                "objmanifest an empty directory of its own"
            )
        raise StoreError(
            f"{shown} is not an objmanifest store and is not empty (it holds {names}"
            f"{' ...' if len(foreign) > 3 else ''}): objmanifest keeps its objects directly "
            "in the directory it is given, so give it an empty directory of its own "
            "(mkdir it first)"
        )
