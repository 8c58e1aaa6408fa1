"""Store outcomes: what a backend answers that the layers above decide on (an object that
is not there, a condition that failed, an answer that never came, an upload that is gone).
They are not the public errors users catch: every caller of the store turns each into a
retry, a result or a public error from ``objmanifest.errors``."""

from __future__ import annotations


class StoreOutcome(Exception):
    """An answer of the store that the layer above decides on; never shown to a user."""


class NoSuchObject(StoreOutcome):
    """``get``, ``head`` or ``open`` of a key that holds no object (S3's ``NoSuchKey``).

    Not the public ``NotFound``: a missing object means something different to each caller
    (a task that does not exist, data that is gone, a block a trim removed, a write that
    did not land), so each says it in its own words. ``address`` is the object's full
    address, for those words."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} does not exist")
        self.address = address


class PreconditionFailed(StoreOutcome):
    """412 or 409 on a conditional write: someone else changed the object first.

    ``answer`` is how the store said it (``412 PreconditionFailed``, ``409
    ConditionalRequestConflict``, ``404 NoSuchKey``), where a backend has one to tell."""

    def __init__(self, message: str = "", answer: str = "") -> None:
        super().__init__(message)
        self.answer = answer


class OutcomeUnknown(StoreOutcome):
    """A write was sent but no answer came back: it may or may not have been applied."""


class BodyDamaged(StoreOutcome):
    """The store refused a body that did not match the digest sent with it (``BadDigest``,
    ``XAmzContentChecksumMismatch`` ...): it was damaged or cut short on its way, and nothing
    was stored. A transient fault: the store layer sends it again."""


class UploadGone(StoreOutcome):
    """The multipart upload no longer exists: it was completed or aborted."""


class PartsRejected(StoreOutcome):
    """Completion named a part the store does not hold with that ETag (``InvalidPart``)."""
