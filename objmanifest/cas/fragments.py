"""A shard's JSON put together from what the last encoding kept: the pieces of the items a
commit left alone, and the shard's small fields, so a warm commit encodes only what changed.

The bytes are exactly pydantic's ``model_dump_json(exclude_none=True)`` of the shard.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import compress, islice
from operator import attrgetter, is_not
from typing import Any, NamedTuple

import pydantic_core
from pydantic import BaseModel, TypeAdapter
from pydantic_core import SchemaSerializer

from ..core.model import Archived, Entry, Shard, entries_changed


def starts_with(keys: list[str], first: list[str]) -> bool:
    """Whether ``keys`` are ``first`` and maybe more after (compared at C speed)."""
    n = len(first)
    return len(keys) >= n and (keys if len(keys) == n else keys[:n]) == first


_PLAIN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]*')
"""Text that JSON writes as it is, between quotes: no quote, backslash or control character
(and no lone surrogate, which pydantic refuses to write)."""


def quoted(text: str) -> bytes:
    """``text`` as pydantic writes a string in JSON (UTF-8, only what must be escaped is)."""
    if _PLAIN.fullmatch(text):
        return b'"' + text.encode() + b'"'
    return pydantic_core.to_json(text)


def _piece(key: str | None, item: BaseModel) -> bytes:
    """One item's JSON as it sits in its shard: ``"key":value`` for an item of a mapping
    (``model_dump_json(exclude_none=True)``'s bytes, from its serializer straight)."""
    body = item.__pydantic_serializer__.to_json(item, exclude_none=True)
    return body if key is None else quoted(key) + b":" + body


class _Run(NamedTuple):
    """The items of one field of the last shard encoded, their JSON joined, and each item's
    piece once the field is being written warm (None before: it was encoded whole). A
    tuple: made twice a commit, and never changed."""

    values: Sequence[BaseModel] | None
    """A sequence's items (None for a mapping): the shard's own tuple."""
    pieces: list[bytes] | None
    joined: bytes
    warm: int = 0
    """How many encodings in a row found most items the same objects as the one before."""
    source: dict[str, Any] | None = None
    """A mapping's items (None for a sequence)."""
    positions: dict[str, int] | None = None
    """Where each key of a mapping's items has its piece, once there are pieces."""


class Delta(NamedTuple):
    """What mapping ``new`` changed of ``old``: the keys whose value may be another object
    than in ``old``, in ``new``'s order (``new`` keeps ``old``'s keys in order and adds its
    own last, a commit's usual change); None when keys were removed or reordered, so that
    any item may differ."""

    old: dict[str, Any]
    new: dict[str, Any]
    changed: Sequence[str] | None

    @classmethod
    def of(cls, old: dict[str, Any], new: dict[str, Any]) -> Delta:
        """From what ``Shard.with_entries`` said it set (one entry, or entries all new, whose
        order it gave), else by comparing every item's object at C speed."""
        said = entries_changed(old, new)
        if said is not None and (len(said) < 2 or old.keys().isdisjoint(said)):
            return cls(old, new, said)
        keys, n = list(new), len(old)
        if not starts_with(keys, list(old)):
            return cls(old, new, None)
        moved = compress(range(n), map(is_not, new.values(), old.values()))
        return cls(old, new, [keys[i] for i in moved] + keys[n:])


_WHOLE: dict[str, SchemaSerializer] = {
    "entries": TypeAdapter(dict[str, Entry]).serializer,
    "archived": TypeAdapter(dict[str, Archived]).serializer,
}
"""How a mapping field of a shard is encoded in one pass, as inside the shard."""


def _inside(whole: SchemaSerializer, items: dict[str, BaseModel]) -> bytes:
    """A mapping's items encoded in one pass, without the braces around them."""
    return whole.to_json(items, exclude_none=True)[1:-1]


_HOLES: tuple[tuple[str, bytes], ...] = (
    ("journal", b'"journal":[]'),
    ("entries", b'"entries":{}'),
    ("archived", b'"archived":{}'),
)
"""The shard's fields that grow with it, in the order pydantic writes them (the fields
before each are numbers and strings, so the first such text after the one before is the
field itself: a string's quotes are escaped, so no string can hold it)."""

_STAMP_HOLE = b',"version":0,"commits":[]'
"""What the skeleton holds for the two fields every commit changes (version and commit ids,
written right after ``schema_version``, an integer, so the first such text is theirs)."""

SMALL_FIELDS = ("schema_version", "journal_id", "task_id", "stage", "creation_id")
"""The shard's fields a skeleton is made of (besides version, commits and the holes)."""
_small = attrgetter(*SMALL_FIELDS)
_grown = attrgetter(*(name for name, _ in _HOLES))


class _Skeleton(NamedTuple):
    """A shard's JSON less its version, its commit ids and the fields that grow with it (what
    stays the same from one commit to the next), cut where those go: ``head``, the version,
    the commit ids, then ``cuts`` with each present field of ``names`` between two."""

    small: tuple[Any, ...]
    present: tuple[bool, ...]
    extra: dict[str, Any] | None
    head: bytes
    names: tuple[str, ...]
    cuts: tuple[bytes, ...]

    @classmethod
    def of(cls, doc: Shard, small: tuple[Any, ...], present: tuple[bool, ...]) -> _Skeleton:
        names = tuple(name for (name, _), there in zip(_HOLES, present, strict=True) if there)
        empty: dict[str, Any] = {n: () if n == "journal" else {} for n in names}
        text = doc.replaced(version=0, commits=(), **empty).model_dump_json(exclude_none=True)
        body = text.encode()
        stamp = body.index(_STAMP_HOLE)
        head, rest = body[:stamp] + b',"version":', body[stamp + len(_STAMP_HOLE) :]
        cuts, pos = [], 0
        for name, hole in _HOLES:
            if name in names:
                inside = rest.index(hole, pos) + len(hole) - 1  # at its closing bracket
                cuts.append(rest[pos:inside])
                pos = inside
        cuts.append(rest[pos:])
        return cls(small, present, doc.__pydantic_extra__, head, names, tuple(cuts))


class Fragments:
    """The encoded JSON of each item (entry, journal record, archived id) of the last shard
    a codec encoded, known by the identity of the item's object, and the shard's skeleton.

    Items are frozen models, and a commit carries every item it did not change over as the
    same object (and a mapping's keys in the same order, new ones last), so a commit encodes
    only the items it changed: the others are found by comparing the new version's objects
    with the last one's, at C speed, and their pieces are joined again. Pieces cost about
    twice pydantic's one pass over the whole field to make, so they are made only once the
    field was encoded twice in a row with most of its items unchanged; before that (a fresh
    read, where every item is a new object, as after each lost race on a busy shard), and
    after any other change (items removed or reordered), the field is encoded whole. Only
    the last encoding is kept (about the size of the shard's body), each field's as one
    immutable ``_Run``: two threads encoding at once only lose some reuse, never correctness
    (a piece is reused only for the very object, under the very key, it was made from).

    The small fields (schema, journal id, task, stage, unknown ones) are kept encoded too,
    as a ``_Skeleton`` made again only when one of them changes."""

    WARM = 2
    """Encodings in a row with most items unchanged after which pieces are made."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._skeleton: _Skeleton | None = None
        self._delta: Delta | None = None
        self._ids: tuple[tuple[str, ...], list[bytes], bytes] = ((), [], b"[]")
        """The last commit ids encoded, each one's JSON, and theirs joined."""

    def delta(self, old: dict[str, Any], new: dict[str, Any]) -> Delta:
        """``Delta.of(old, new)``, found once: a commit's transitions and its encoding both
        ask for the one between the version it changed and the one it made."""
        last = self._delta
        if last is not None and last.old is old and last.new is new:
            return last
        found = self._delta = Delta.of(old, new)
        return found

    def shard(self, doc: Shard) -> bytes:
        """``doc`` as ``model_dump_json(exclude_none=True)`` writes it."""
        small, grown = _small(doc), _grown(doc)
        present = (grown[0] is not None, grown[1] is not None, grown[2] is not None)
        skeleton = self._skeleton
        if (
            skeleton is None
            or skeleton.small != small
            or skeleton.present != present
            or skeleton.extra != doc.__pydantic_extra__
        ):
            skeleton = self._skeleton = _Skeleton.of(doc, small, present)
        cuts = skeleton.cuts
        out = [
            skeleton.head,
            b"%d" % doc.version,
            b',"commits":',
            self._commit_ids(doc.commits),
            cuts[0],
        ]
        runs = self._runs
        for i, name in enumerate(skeleton.names, 1):
            value = getattr(doc, name)
            old = runs.get(name)
            if isinstance(value, dict):
                run = self._mapping(old, value, _WHOLE[name])
            else:
                run = (self._sequence(old, value) if old is not None else None) or (
                    self._rebuilt(old, value)
                )
            runs[name] = run
            out.append(run.joined)
            out.append(cuts[i])
        return b"".join(out)

    def _commit_ids(self, commits: tuple[str, ...]) -> bytes:
        """``commits`` as JSON: a commit adds its id last and may drop the oldest, so the
        others are taken from the last ids encoded."""
        old, pieces, joined = self._ids
        if commits == old:
            return joined
        n = len(old)
        if commits[: n - 1] == old[1:]:
            pieces = pieces[1:] + [quoted(c) for c in commits[n - 1 :]]
        elif commits[:n] == old:
            pieces = pieces + [quoted(c) for c in commits[n:]]
        else:
            pieces = [quoted(c) for c in commits]
        joined = b"[" + b",".join(pieces) + b"]"
        self._ids = (commits, pieces, joined)
        return joined

    def _mapping(
        self, old: _Run | None, items: dict[str, BaseModel], whole: SchemaSerializer
    ) -> _Run:
        """A mapping's run: the old pieces and those of the items that are other objects
        (or new, last), once warm; encoded whole (by ``whole``) otherwise."""
        if old is None or old.source is None:
            return _Run(None, None, _inside(whole, items), 0, items)
        changed = self.delta(old.source, items).changed
        if changed is None or 2 * len(changed) > len(old.source):
            return _Run(None, None, _inside(whole, items), 0, items)
        warm = old.warm + 1
        if old.pieces is None or old.positions is None:
            if warm < self.WARM:
                return _Run(None, None, _inside(whole, items), warm, items)
            pieces = [_piece(k, v) for k, v in items.items()]
            index = dict(zip(items, range(len(pieces)), strict=True))
            return _Run(None, pieces, b",".join(pieces), warm, items, index)
        if not changed:
            return old._replace(warm=warm, source=items)
        pieces, index = old.pieces.copy(), old.positions
        added = [k for k in changed if k not in index]
        if added:  # last, in order
            index = {**index, **{k: len(pieces) + j for j, k in enumerate(added)}}
            pieces += [b""] * len(added)
        for k in changed:
            pieces[index[k]] = _piece(k, items[k])
        return _Run(None, pieces, b",".join(pieces), warm, items, index)

    @staticmethod
    def _sequence(old: _Run, values: Sequence[BaseModel]) -> _Run | None:
        """A sequence's run when it is the old one less some first items, more some new
        ones (a journal: records appended, a flushed block dropped); None otherwise."""
        if old.values is None or old.pieces is None:
            return None
        n = len(old.values)
        if n and values and old.values[0] is values[0]:
            first: int | None = 0  # the usual case: nothing dropped
        else:
            first = next((i for i, v in enumerate(old.values) if values and v is values[0]), None)
        kept = n - first if first is not None else 0
        if first is None or len(values) < kept:
            return None
        if any(map(is_not, values, islice(old.values, first, None))):
            return None
        pieces = old.pieces[first:] + [_piece(None, v) for v in values[kept:]]
        return _Run(values, pieces, b",".join(pieces))

    @staticmethod
    def _rebuilt(old: _Run | None, values: Sequence[BaseModel]) -> _Run:
        """A sequence's run made piece by piece, taking an old piece wherever the same object
        was (the old run holds its objects, so no other has their ids)."""
        known: dict[int, bytes] = {}
        if old is not None and old.values is not None and old.pieces is not None:
            known = {id(v): p for v, p in zip(old.values, old.pieces, strict=True)}
        pieces = [known.get(id(v)) or _piece(None, v) for v in values]
        return _Run(values, pieces, b",".join(pieces))
