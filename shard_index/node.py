"""One declared entry of the index."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Node:
    """Where an entry lives (its stage, i.e. shard) and which file ids it waits for.

    Frozen so an index can hand nodes out without copying them.
    """

    stage: str
    depends_on: frozenset[str]
