"""objmanifest: agents on many machines hand files to each other safely through one bucket.

A manifest beside the data says, for every file, its stage, state, holder, lease, checksum
and dependencies; it is split into per-stage shards changed only by conditional writes.

This module is the public face: ``__all__`` is what users may rely on. It is never imported
by a package below the face.
"""

from . import metrics
from .agent import Agent
from .cas.policy import CasPolicy
from .core.commit_events import Change, CommitEvent
from .core.model import ArchiveReport, Claim, Declaration, Entry, JournalRecord
from .core.report import TaskStatus
from .core.runtime import Runtime
from .core.states import State
from .data.transfer import TransferConfig
from .errors import (
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
from .journal.history import Dropped, Lineage, LineageNode, Transition
from .ops.gc import GcItem, GcKept, GcReport
from .ops.reports import KeptVersion, ObjectRepair, RepairReport, RestoredEntry
from .store import MemoryStore, ObjectStore, S3Store, connect
from .task import Task

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
    "KeptVersion",
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
]
