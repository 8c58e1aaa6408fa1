"""objmanifest: agents on many machines hand files to each other safely through one bucket.

A manifest beside the data says, for every file, its stage, state, holder, lease, checksum
and dependencies; it is split into per-stage shards changed only by conditional writes.
"""

from .agent import Agent
from .errors import (
    AlreadyConsumed,
    AlreadyExists,
    ChecksumMismatch,
    ConflictRetriesExhausted,
    CorruptShard,
    DeclarationConflict,
    DependencyCycle,
    InvalidFileId,
    LeaseLost,
    NotAConsumer,
    NotClaimable,
    NotFound,
    NotReady,
    ObjManifestError,
    StoreError,
    UnsupportedSchema,
    UnsupportedStore,
)
from .model import Claim, Declaration, Entry, State, TaskStatus
from .shards import CasPolicy
from .store import Store, connect
from .task import Task
from .transfer import TransferConfig, set_defaults

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AlreadyConsumed",
    "AlreadyExists",
    "CasPolicy",
    "ChecksumMismatch",
    "Claim",
    "ConflictRetriesExhausted",
    "CorruptShard",
    "Declaration",
    "DeclarationConflict",
    "DependencyCycle",
    "Entry",
    "InvalidFileId",
    "LeaseLost",
    "NotAConsumer",
    "NotClaimable",
    "NotFound",
    "NotReady",
    "ObjManifestError",
    "State",
    "Store",
    "StoreError",
    "Task",
    "TaskStatus",
    "TransferConfig",
    "UnsupportedSchema",
    "UnsupportedStore",
    "connect",
    "set_defaults",
]
