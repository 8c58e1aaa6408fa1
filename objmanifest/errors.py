"""The errors a user of objmanifest can see.

Every expected condition is one of these, never a bare botocore traceback. Each message
says what happened and, where there is one, what to do about it.
"""

from __future__ import annotations


class ObjManifestError(Exception):
    """Base class of every error objmanifest raises on purpose."""


class NotFound(ObjManifestError):
    """A task, entry or object that does not exist."""


class AlreadyExists(ObjManifestError):
    """A task (or object written once) that exists already."""


class LeaseLost(ObjManifestError):
    """The claim's epoch is stale: another holder took the entry over, or it was reaped.

    Nothing was changed. Stop working on this entry; claim again if it is still wanted.
    """


class ChecksumMismatch(ObjManifestError):
    """Bytes read from the store differ from the checksum recorded at `ready`."""


class NotClaimable(ObjManifestError):
    """The entry cannot be claimed now; `reason` says why (state, holder, dependencies)."""

    def __init__(self, file_id: str, reason: str) -> None:
        super().__init__(f"{file_id!r} is not claimable: {reason}")
        self.file_id = file_id
        self.reason = reason


class NotReady(ObjManifestError):
    """The entry has no finished data yet (it is not `ready`)."""


class AlreadyConsumed(ObjManifestError):
    """A queue entry that another agent consumed already."""


class NotAConsumer(ObjManifestError):
    """The agent's role is not among the entry's declared consumers."""


class DeclarationConflict(ObjManifestError):
    """An entry was declared again with a different stage, dependencies or consumers."""


class DependencyCycle(DeclarationConflict):
    """A declaration would make entries depend on themselves."""


class ConflictRetriesExhausted(ObjManifestError):
    """A compare-and-swap kept losing the race; the change was not applied."""


class UnsupportedStore(ObjManifestError):
    """The store does not enforce conditional writes, so the protocol cannot be safe there."""


class CorruptShard(ObjManifestError):
    """A manifest object does not parse. It is left untouched for a human to inspect."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(
            f"manifest object {key!r} is corrupt ({detail}); it was left as it is. "
            "Inspect it, then restore it from its journal or a backup."
        )
        self.key = key


class UnsupportedSchema(ObjManifestError):
    """A manifest object written by a newer objmanifest."""

    def __init__(self, key: str, version: int, supported: int) -> None:
        super().__init__(
            f"{key!r} has schema_version {version}, this objmanifest reads up to {supported}; "
            "upgrade objmanifest to work on this task."
        )
        self.key = key
        self.version = version


class InvalidFileId(ObjManifestError, ValueError):
    """A file id that cannot be a relative object key."""


class StoreError(ObjManifestError):
    """The store answered with an unexpected error (permissions, network, server fault)."""
