"""The cross-shard dependency index: which shard holds each file id, and what it waits for.

It lets "may I claim this?" read only the shards holding an entry's dependencies. It is
immutable because the caller applies changes inside a compare-and-swap loop and may
re-apply them to a fresher copy: a change is a pure function from index to index.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import ClassVar

from shard_index import _codec, _graph
from shard_index._codec import Meta
from shard_index.errors import (
    DeclarationConflict,
    DependencyCycle,
    HasDependents,
    IndexFormatError,
    cycle_path,
)
from shard_index.node import Node

_EMPTY: frozenset[str] = frozenset()

# A conflict message lists at most this many ids per side, so a log line stays readable.
_MAX_LISTED = 20


class ShardIndex:
    """Every declared file id with its stage and dependencies; immutable.

    Dependencies may name ids not declared yet. The index never holds a cycle among
    declared entries. Reverse edges and other derived views are built once, on first use,
    and carried over (updated, not rebuilt) to the indexes that declarations return.
    """

    SCHEMA_VERSION: ClassVar[int] = _codec.SCHEMA_VERSION

    __slots__ = (
        "_by_stage",
        "_cross_edges",
        "_dependents",
        "_meta",
        "_nodes",
        "_undeclared",
        "_version",
    )

    _nodes: Mapping[str, Node]
    _version: int
    _dependents: dict[str, frozenset[str]] | None
    _by_stage: dict[str, frozenset[str]] | None
    _undeclared: frozenset[str] | None
    _cross_edges: frozenset[tuple[str, str]] | None
    _meta: Meta

    def __init__(self) -> None:
        """Make an empty index (same as ``ShardIndex.empty()``)."""
        self._nodes = {}
        self._version = 0
        self._meta = Meta()
        self._dependents = None
        self._by_stage = None
        self._undeclared = None
        self._cross_edges = None

    @classmethod
    def empty(cls, schema_version: int = _codec.SCHEMA_VERSION) -> ShardIndex:
        """The index of a task where nothing is declared yet (version 0), to be written at
        ``schema_version``."""
        index = cls()
        index._meta = Meta(schema_version=schema_version)
        return index

    @classmethod
    def _create(
        cls,
        nodes: Mapping[str, Node],
        version: int,
        dependents: dict[str, frozenset[str]] | None,
        meta: Meta,
    ) -> ShardIndex:
        """Wrap already-checked content; the dicts passed in must not be changed later."""
        index = cls()
        index._nodes = nodes
        index._version = version
        index._dependents = dependents
        index._meta = meta
        return index

    # -------------------------------------------------------------------- meta

    @property
    def meta(self) -> Meta:
        """The schema version it is written at, its last commit ids and its journal."""
        return self._meta

    def with_meta(self, meta: Meta, version: int | None = None) -> ShardIndex:
        """The same entries with other ``meta`` (and ``version``, if given)."""
        index = ShardIndex._create(
            self._nodes, self._version if version is None else version, self._dependents, meta
        )
        index._by_stage, index._undeclared = self._by_stage, self._undeclared
        index._cross_edges = self._cross_edges
        return index

    # ----------------------------------------------------------------- reading

    @property
    def version(self) -> int:
        """Counts the changes that changed something, so a caller can tell copies apart."""
        return self._version

    def __contains__(self, file_id: object) -> bool:
        return file_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, file_id: str) -> Node | None:
        """The declaration of ``file_id``, or None if it is not declared (yet)."""
        return self._nodes.get(file_id)

    def stage_of(self, file_id: str) -> str | None:
        """The stage (shard) holding ``file_id``, or None if it is not declared (yet)."""
        node = self._nodes.get(file_id)
        return None if node is None else node.stage

    def dependencies(self, file_id: str) -> frozenset[str]:
        """The ids ``file_id`` waits for; empty if it is not declared."""
        node = self._nodes.get(file_id)
        return _EMPTY if node is None else node.depends_on

    def dependents(self, file_id: str) -> frozenset[str]:
        """The declared ids that wait for ``file_id`` (declared or not)."""
        return self._reverse().get(file_id, _EMPTY)

    def undeclared(self) -> frozenset[str]:
        """Ids that something depends on but nobody has declared yet."""
        if self._undeclared is None:
            nodes = self._nodes
            self._undeclared = frozenset(dep for dep in self._reverse() if dep not in nodes)
        return self._undeclared

    def stages_needed(self, file_id: str) -> frozenset[str]:
        """The shards to read to check ``file_id``'s declared dependencies."""
        nodes = self._nodes
        return frozenset(nodes[dep].stage for dep in self.dependencies(file_id) if dep in nodes)

    def cross_shard_edges(self) -> frozenset[tuple[str, str]]:
        """``(file_id, dependency)`` pairs whose stages differ.

        Only edges between declared entries: an undeclared dependency has no stage yet.
        """
        if self._cross_edges is None:
            nodes = self._nodes
            self._cross_edges = frozenset(
                (file_id, dep)
                for file_id, node in nodes.items()
                for dep in node.depends_on
                if dep in nodes and nodes[dep].stage != node.stage
            )
        return self._cross_edges

    def file_ids(self, stage: str | None = None) -> frozenset[str]:
        """All declared ids, or those of one stage."""
        if stage is None:
            return frozenset(self._nodes)
        if self._by_stage is None:
            groups: dict[str, set[str]] = {}
            for file_id, node in self._nodes.items():
                groups.setdefault(node.stage, set()).add(file_id)
            self._by_stage = {name: frozenset(ids) for name, ids in groups.items()}
        return self._by_stage.get(stage, _EMPTY)

    def _reverse(self) -> dict[str, frozenset[str]]:
        if self._dependents is None:
            self._dependents = _reverse_of(self._nodes)
        return self._dependents

    # ---------------------------------------------------------------- changing

    def declare(self, file_id: str, stage: str, depends_on: Iterable[str] = ()) -> ShardIndex:
        """Return an index with ``file_id`` declared; ``self`` if it already is, identically.

        Raises DeclarationConflict if it is declared differently, DependencyCycle if the
        declaration would close a cycle, ValueError for an empty or non-str id or stage.
        """
        return self.declare_many([(file_id, stage, depends_on)])

    def declare_many(self, decls: Iterable[tuple[str, str, Iterable[str]]]) -> ShardIndex:
        """Declare a batch at once: all of it or, if anything raises, nothing.

        Later declarations may depend on earlier ones in the same batch. The version goes up
        by one for the whole batch, and not at all if every declaration was a repeat.
        """
        draft = _Draft(self._nodes, self._reverse())
        for decl in decls:
            draft.add(*_unpack(decl))
        if not draft.added:
            return self
        nodes, dependents = draft.result()
        return ShardIndex._create(nodes, self._version + 1, dependents, self._meta)

    def remove(self, file_id: str) -> ShardIndex:
        """Return an index without ``file_id``; ``self`` if it is not declared.

        Raises HasDependents if declared ids depend on it: removing it would leave them
        waiting for an id nobody will declare. The version goes up by one.
        """
        if not isinstance(file_id, str) or not file_id:
            raise ValueError(f"file_id must be a non-empty str, got {file_id!r}")
        node = self._nodes.get(file_id)
        if node is None:
            return self
        waiting = self.dependents(file_id)
        if waiting:
            raise HasDependents(file_id, waiting)
        nodes = {fid: n for fid, n in self._nodes.items() if fid != file_id}
        dependents = dict(self._reverse())
        for dep in node.depends_on:
            rest = dependents.get(dep, _EMPTY) - {file_id}
            if rest:
                dependents[dep] = rest
            else:
                dependents.pop(dep, None)
        return ShardIndex._create(nodes, self._version + 1, dependents, self._meta)

    # ------------------------------------------------------------ serialising

    def to_json(self) -> bytes:
        """Compact, deterministic JSON: equal indexes give equal bytes."""
        return _codec.encode(self._version, self._nodes, self._meta)

    @classmethod
    def from_json(cls, data: bytes) -> ShardIndex:
        """Read what ``to_json`` wrote, checking it fully (shape, types, no cycles).

        Raises IndexFormatError (a ValueError) for anything malformed and
        UnsupportedIndexSchema for an index written by a newer schema.
        """
        version, nodes, meta = _codec.decode(data)
        dependents = _reverse_of(nodes)
        cycle = _graph.find_any_cycle(nodes, dependents)
        if cycle is not None:
            raise IndexFormatError(f"index contains a dependency cycle: {cycle_path(cycle)}")
        return cls._create(nodes, version, dependents, meta)

    # ------------------------------------------------------------- comparing

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return self._version == other._version and self._nodes == other._nodes

    def __hash__(self) -> int:
        # Cheap and consistent with __eq__; hashing every node would cost O(n).
        return hash((self._version, len(self._nodes)))

    def __repr__(self) -> str:
        return (
            f"ShardIndex(version={self._version}, entries={len(self._nodes)}, "
            f"undeclared={len(self.undeclared())})"
        )


class _Draft:
    """The pending changes of one declare_many, kept beside the untouched base.

    Nothing is copied until ``result``, so a batch of repeats costs no copy of a big index,
    and a failing batch leaves no trace.
    """

    def __init__(self, nodes: Mapping[str, Node], dependents: Mapping[str, frozenset[str]]):
        self.nodes = nodes
        self.dependents_base = dependents
        self.added: dict[str, Node] = {}
        self.dependents_added: dict[str, set[str]] = {}

    def get(self, file_id: str) -> Node | None:
        node = self.added.get(file_id)
        return self.nodes.get(file_id) if node is None else node

    def dependencies(self, file_id: str) -> frozenset[str]:
        node = self.get(file_id)
        return _EMPTY if node is None else node.depends_on

    def dependents(self, file_id: str) -> Iterable[str]:
        # The two parts are disjoint: added ids are not in the base.
        base = self.dependents_base.get(file_id, _EMPTY)
        extra = self.dependents_added.get(file_id)
        return base if extra is None else itertools.chain(base, extra)

    def add(self, file_id: str, stage: str, depends_on: frozenset[str]) -> None:
        new = Node(stage, depends_on)
        old = self.get(file_id)
        if old is not None:
            if old == new:
                return
            raise DeclarationConflict(file_id, differences(old, new))
        cycle = _graph.find_new_cycle(file_id, depends_on, self.dependencies, self.dependents)
        if cycle is not None:
            raise DependencyCycle(cycle)
        self.added[file_id] = new
        for dep in depends_on:
            self.dependents_added.setdefault(dep, set()).add(file_id)

    def result(self) -> tuple[dict[str, Node], dict[str, frozenset[str]]]:
        nodes = dict(self.nodes)
        nodes.update(self.added)
        dependents = dict(self.dependents_base)
        for dep, ids in self.dependents_added.items():
            dependents[dep] = self.dependents_base.get(dep, _EMPTY) | ids
        return nodes, dependents


def _reverse_of(nodes: Mapping[str, Node]) -> dict[str, frozenset[str]]:
    reverse: dict[str, set[str]] = {}
    for file_id, node in nodes.items():
        for dep in node.depends_on:
            reverse.setdefault(dep, set()).add(file_id)
    return {dep: frozenset(ids) for dep, ids in reverse.items()}


def _unpack(decl: object) -> tuple[str, str, frozenset[str]]:
    """Check one declaration's types here, so bad input never reaches the graph."""
    if not isinstance(decl, tuple | list) or len(decl) != 3:
        raise ValueError(f"a declaration must be (file_id, stage, depends_on), got {decl!r}")
    file_id, stage, depends_on = decl
    if not isinstance(file_id, str) or not file_id:
        raise ValueError(f"file_id must be a non-empty str, got {file_id!r}")
    if not isinstance(stage, str) or not stage:
        raise ValueError(f"stage of {file_id!r} must be a non-empty str, got {stage!r}")
    # A str is iterable too, and would silently become a set of one-letter ids.
    if isinstance(depends_on, str | bytes):
        raise ValueError(
            f"depends_on of {file_id!r} must be an iterable of file ids, not {depends_on!r}"
        )
    try:
        deps = frozenset(depends_on)
    except TypeError:
        raise ValueError(
            f"depends_on of {file_id!r} must be an iterable of file ids, got {depends_on!r}"
        ) from None
    for dep in deps:
        if not isinstance(dep, str) or not dep:
            raise ValueError(f"depends_on of {file_id!r} must hold non-empty str ids, got {dep!r}")
    return file_id, stage, deps


def differences(old: Node, new: Node) -> list[str]:
    """Say exactly what a conflicting declaration changes (existing vs new)."""
    differences = []
    if old.stage != new.stage:
        differences.append(f"stage: {old.stage!r} != {new.stage!r}")
    added = new.depends_on - old.depends_on
    removed = old.depends_on - new.depends_on
    if added or removed:
        parts = []
        if added:
            parts.append("+" + _show_ids(added))
        if removed:
            parts.append("-" + _show_ids(removed))
        differences.append("depends_on: " + " ".join(parts))
    return differences


def _show_ids(ids: frozenset[str]) -> str:
    shown = sorted(ids)
    text = ", ".join(map(repr, shown[:_MAX_LISTED]))
    if len(shown) > _MAX_LISTED:
        text += f", ... {len(shown) - _MAX_LISTED} more"
    return "{" + text + "}"
