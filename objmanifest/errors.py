"""The public errors: one tree, under ``ObjManifestError``, that users catch.

Each message says what happened and, where there is one, what to do about it. A user's bad
argument is an ``InvalidInput`` (also a ``ValueError``), never a bare ``ValueError`` from
deep inside.

How the layers talk to each other lives with them: store outcomes in ``store/errors.py``
(the store tells the CAS loop it lost a race), the data path's in ``data/errors.py``, the
faces' in ``wire/errors.py`` and ``local/errors.py``. None of those reaches a user as it
is: the layer above turns each into a decision or into one of these.
"""

from __future__ import annotations


class ObjManifestError(Exception):
    """Base class of every error objmanifest raises on purpose."""


# -- what a user asked for that cannot be done -------------------------------------------


class InvalidInput(ObjManifestError, ValueError):
    """An argument that is not valid (a name, a lease, a part size, a URL ...)."""


class InvalidFileId(InvalidInput):
    """A file id that cannot be a relative object key."""


class NotFound(ObjManifestError):
    """A task, entry or object that does not exist."""


class AlreadyExists(ObjManifestError):
    """A task (or object written once) that exists already."""


class DeclarationConflict(ObjManifestError):
    """An entry was declared again with a different stage, dependencies or consumers."""


class DependencyCycle(DeclarationConflict):
    """A declaration would make entries depend on themselves."""


# -- the lifecycle refusing a move -------------------------------------------------------


class LeaseLost(ObjManifestError):
    """The claim's epoch is stale: another holder took the entry over, or it was reaped.

    Nothing was changed. Stop working on this entry; claim again if it is still wanted.
    """


class NotClaimable(ObjManifestError):
    """The entry cannot be claimed now; `reason` says why (state, holder, dependencies)."""

    def __init__(self, file_id: str, reason: str) -> None:
        super().__init__(f"{file_id!r} is not claimable: {reason}")
        self.file_id = file_id
        self.reason = reason


class NotReady(ObjManifestError):
    """The entry has no finished data yet (it is not `ready`). ``state`` is the state it is
    in, where known (``"writing"``: a producer holds it)."""

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


class AlreadyConsumed(ObjManifestError):
    """A queue entry that another agent consumed already."""


class DataRemoved(ObjManifestError):
    """A consumed entry's data was removed by ``gc`` after its retention; the entry (and
    its checksum, history and lineage) stays, its bytes cannot be read again."""


class NotAConsumer(ObjManifestError):
    """The agent's role is not among the entry's declared consumers."""


class Interrupted(ObjManifestError):
    """A ``put``, ``put_many`` or ``consume`` given ``stop=`` saw it set at a checkpoint
    (between the data and its commit, or between parts) and stopped before its commit.

    Nothing was committed: a put's entry stays writing under its claim (put it again,
    release or fail it, or leave it to a takeover once the lease expires); a consume
    marked nothing and left ``dest`` as it was. ``objmanifest.aio`` raises it in the
    thread of a cancelled coroutine."""


# -- data -----------------------------------------------------------------------------------


class Refused(ObjManifestError):
    """An operator's verb that would break something still in use (lifecycle verbs)."""


class WrongState(Refused):
    """The entry is not in the state the verb needs (revive needs dead, undeclare
    pending)."""


class HasDependents(Refused):
    """Entries depend on the one to undeclare; ``dependents`` names them."""

    def __init__(self, message: str, dependents: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.dependents = dependents


class TaskBeingDeleted(NotFound):
    """A task whose delete started (its header is marked): run the delete again to finish."""


class LeasesLive(Refused):
    """The task still has entries held under unexpired leases; ``holders`` names them."""

    def __init__(self, message: str, holders: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.holders = holders


class ChecksumMismatch(ObjManifestError):
    """Bytes read from the store differ from the checksum recorded at `ready`."""


class SourceChanged(ObjManifestError):
    """The source's bytes changed while they were uploaded (the file grew or shrank)."""


# -- the store and the manifest objects in it ------------------------------------------------


class ConflictRetriesExhausted(ObjManifestError):
    """A compare-and-swap kept losing the race; the change was not applied."""


class UnsupportedStore(ObjManifestError):
    """The store does not enforce conditional writes, so the protocol cannot be safe there."""


class CorruptShard(ObjManifestError):
    """A manifest object does not parse. It is left untouched for a human to inspect.

    ``key`` is the object's key under the store's prefix, ``address`` its full address
    (``s3://bucket/prefix/key``) once the layer that read it knows it, and ``repair`` what a
    user can do about this kind of object.
    """

    def __init__(self, key: str, detail: str, address: str = "", repair: str = "") -> None:
        self.key = key
        self.detail = detail
        self.address = address or key
        self.repair = repair
        advice = "restore a good copy if you have one (a versioned bucket keeps earlier versions)"
        if repair:
            advice += f"; otherwise {repair}"
        super().__init__(
            f"manifest object {self.address} is corrupt ({detail}); it was left as it is. "
            f"Inspect it, then {advice}."
        )

    def at(self, address: str, repair: str = "") -> CorruptShard:
        """The same error, naming the object's full address (and how to repair it)."""
        return CorruptShard(self.key, self.detail, address, repair or self.repair)


class UnsupportedSchema(ObjManifestError):
    """A manifest object written by a newer objmanifest."""

    def __init__(
        self, key: str, version: int, supported: int, address: str = "", requires: str = ""
    ) -> None:
        self.key = key
        self.version = version
        self.supported = supported
        self.address = address or key
        self.requires = requires
        upgrade = f"install objmanifest {requires} or newer" if requires else "upgrade objmanifest"
        super().__init__(
            f"{self.address} has schema_version {version}, this objmanifest reads up to "
            f"{supported}; {upgrade} to work on this task."
        )

    def at(self, address: str, repair: str = "") -> UnsupportedSchema:
        return UnsupportedSchema(self.key, self.version, self.supported, address, self.requires)


class StoreError(ObjManifestError):
    """The store answered with an unexpected error (permissions, network, server fault)."""


class AccessDenied(StoreError):
    """The store refused a request for lack of permission (S3 ``AccessDenied``):
    ``objmanifest iam-policy`` prints the policy objmanifest needs, ``objmanifest doctor``
    names the permission a call lacked."""


class ReadBrokeOff(StoreError):
    """A read of an object's bytes stopped before its end (the connection broke)."""


# -- waiting ---------------------------------------------------------------------------------


class WaitTimeout(ObjManifestError):
    """``wait`` gave up: some entries waited for had not reached the state asked for when
    its timeout ran out. ``file_ids`` names them."""

    def __init__(self, message: str, file_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.file_ids = file_ids


class DeadWaitedFor(ObjManifestError):
    """``wait`` stopped at once: an entry it waits for is dead, so it can never be ready
    (revive it, or stop waiting). ``file_ids`` names them."""

    def __init__(self, message: str, file_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.file_ids = file_ids


# -- a transfer stopped: the data changed under a consumer, or a sibling part failed ------


class DataChanged(ObjManifestError):
    """The entry no longer points at the data a consumer verified: it was produced again."""


class Cancelled(ObjManifestError):
    """Another part of the same transfer failed first; this one stopped."""
