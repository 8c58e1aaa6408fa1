"""objmanifest: agents on many machines hand files to each other safely through one bucket.

A manifest beside the data says, for every file, its stage, state, holder, lease, checksum
and dependencies; it is split into per-stage shards changed only by conditional writes.
"""

from . import metrics
from .agent import Agent
from .cas import CasPolicy
from .errors import (  # lifecycle verbs
    AccessDenied,
    AlreadyConsumed,
    AlreadyExists,
    ChecksumMismatch,
    ConflictRetriesExhausted,
    CorruptShard,
    DataRemoved,
    DeadWaitedFor,
    DeclarationConflict,
    DependencyCycle,
    HasDependents,
    Interrupted,
    InvalidFileId,
    InvalidInput,
    LeaseLost,
    LeasesLive,
    NotAConsumer,
    NotClaimable,
    NotFound,
    NotReady,
    ObjManifestError,
    Refused,
    SourceChanged,
    StoreError,
    UnsupportedSchema,
    UnsupportedStore,
    WaitTimeout,
    WrongState,
)
from .events import Change, CommitEvent
from .gc import GcItem, GcKept, GcReport
from .history import Dropped, Lineage, LineageNode, Transition
from .model import ArchiveReport, Claim, Declaration, Entry, JournalRecord, State, TaskStatus
from .repair import ObjectRepair, RepairReport, RestoredEntry
from .runtime import Runtime
from .store import MemoryStore, ObjectStore, S3Store, Store, connect
from .task import Task
from .transfer import TransferConfig, set_defaults

__version__ = "0.3.0"

__all__ = [
    "AccessDenied",
    "Agent",
    "AlreadyConsumed",
    "AlreadyExists",
    "ArchiveReport",
    "CasPolicy",
    "Change",
    "ChecksumMismatch",
    "Claim",
    "CommitEvent",
    "ConflictRetriesExhausted",
    "CorruptShard",
    "DataRemoved",
    "DeadWaitedFor",
    "Declaration",
    "DeclarationConflict",
    "DependencyCycle",
    "Dropped",
    "Entry",
    "GcItem",
    "GcKept",
    "GcReport",
    "HasDependents",
    "Interrupted",
    "InvalidFileId",
    "InvalidInput",
    "JournalRecord",
    "LeaseLost",
    "LeasesLive",
    "Lineage",
    "LineageNode",
    "MemoryStore",
    "NotAConsumer",
    "NotClaimable",
    "NotFound",
    "NotReady",
    "ObjManifestError",
    "ObjectRepair",
    "ObjectStore",
    "Refused",
    "RepairReport",
    "RestoredEntry",
    "Runtime",
    "S3Store",
    "SourceChanged",
    "State",
    "Store",
    "StoreError",
    "Task",
    "TaskStatus",
    "TransferConfig",
    "Transition",
    "UnsupportedSchema",
    "UnsupportedStore",
    "WaitTimeout",
    "WrongState",
    "connect",
    "metrics",
    "set_defaults",
]
