"""Cross-shard dependency index for objmanifest.

Maps every file id of a task to its stage (shard) and dependencies, so checking an entry
reads only the shards it needs. Pure data and (de)serialisation: it never does I/O and
never imports ``objmanifest`` (the standard library only).
"""

from shard_index._codec import Meta
from shard_index.errors import (
    DeclarationConflict,
    DependencyCycle,
    HasDependents,
    IndexFormatError,
    ShardIndexError,
    UnsupportedIndexSchema,
)
from shard_index.index import ShardIndex, differences
from shard_index.node import Node

__all__ = [
    "DeclarationConflict",
    "DependencyCycle",
    "HasDependents",
    "IndexFormatError",
    "Meta",
    "Node",
    "ShardIndex",
    "ShardIndexError",
    "UnsupportedIndexSchema",
    "differences",
]
