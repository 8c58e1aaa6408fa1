"""Errors raised by the shard index.

Each one carries the data a caller needs to react (ids, the cycle, the schema version) as
attributes, and a message that says what happened, so a log line alone is enough.
They pickle with their attributes intact, because agents run in several processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# A cycle longer than twice this is shown by its two ends only.
_CYCLE_ENDS = 10


class ShardIndexError(Exception):
    """Base class, so a caller can catch every index error in one place."""


class DeclarationConflict(ShardIndexError):
    """An id was declared again with a different stage or different dependencies.

    Re-declaring identically is allowed (agents restart); changing a declaration is not,
    because other agents may already rely on it.
    """

    def __init__(self, file_id: str, differences: Sequence[str]) -> None:
        self.file_id = file_id
        self.differences = tuple(differences)
        super().__init__(
            f"{file_id!r} is already declared differently (existing vs new): "
            + "; ".join(self.differences)
        )

    def __reduce__(self) -> tuple[type[DeclarationConflict], tuple[str, tuple[str, ...]]]:
        return (type(self), (self.file_id, self.differences))


class DependencyCycle(ShardIndexError):
    """A declaration would make an entry wait, directly or not, for itself.

    ``cycle`` lists each id once, in dependency order, starting with the id being
    declared; the message closes the loop (``a -> b -> a``).
    """

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        hint = " (an entry may not depend on itself)" if len(self.cycle) == 1 else ""
        super().__init__(f"dependency cycle: {cycle_path(self.cycle)}{hint}")

    def __reduce__(self) -> tuple[type[DependencyCycle], tuple[list[str]]]:
        return (type(self), (self.cycle,))


class HasDependents(ShardIndexError):
    """An id cannot be removed while declared ids depend on it; ``dependents`` names them."""

    def __init__(self, file_id: str, dependents: Iterable[str]) -> None:
        self.file_id = file_id
        self.dependents = tuple(sorted(dependents))
        shown = ", ".join(map(repr, self.dependents[: _CYCLE_ENDS * 2]))
        more = len(self.dependents) - _CYCLE_ENDS * 2
        super().__init__(
            f"{file_id!r} cannot be removed: {shown}"
            + (f" and {more} more" if more > 0 else "")
            + " depend on it"
        )

    def __reduce__(self) -> tuple[type[HasDependents], tuple[str, tuple[str, ...]]]:
        return (type(self), (self.file_id, self.dependents))


def cycle_path(cycle: Sequence[str]) -> str:
    """Show a cycle as ``a -> b -> a``; a very long one keeps its two ends, so logs stay sane."""
    if not cycle:
        return "(empty)"
    shown = [*cycle, cycle[0]]
    if len(shown) > 2 * _CYCLE_ENDS + 1:
        skipped = len(shown) - 2 * _CYCLE_ENDS
        shown = [*shown[:_CYCLE_ENDS], f"... {skipped} more ...", *shown[-_CYCLE_ENDS:]]
    return " -> ".join(shown)


class IndexFormatError(ShardIndexError, ValueError):
    """The stored index is not valid JSON of the expected shape; it is left as it is."""


class UnsupportedIndexSchema(ShardIndexError):
    """The stored index was written by a newer shard_index; refuse rather than misread it."""

    def __init__(self, version: int, supported: int | None = None) -> None:
        self.version = version
        self.supported = supported
        limit = f" (this shard_index reads up to {supported})" if supported is not None else ""
        super().__init__(
            f"index schema_version {version} is not supported{limit}: upgrade shard_index"
        )

    def __reduce__(self) -> tuple[type[UnsupportedIndexSchema], tuple[int, int | None]]:
        return (type(self), (self.version, self.supported))
