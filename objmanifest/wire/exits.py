"""Exit codes and how every error a face can meet maps to one.

Scripts and agents branch on the exit code, so each outcome a caller may want to handle
differently (wait and retry, claim again, produce again, give up) has its own number.
The table is documented in ``docs/cli.md``; numbers never change meaning. The MCP server
and the web API name errors from the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import objmanifest as om

from ..local.errors import LocalServerError, Stopped
from .errors import ExtraMissing, NotAllReady, NothingClaimable, UsageError


class ExitCode(IntEnum):
    """What a caller needs to know about how a command ended."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NOTHING_CLAIMABLE = 3
    NOT_READY = 4
    LEASE_LOST = 5
    CHECKSUM_MISMATCH = 6
    CONFLICT_RETRIES_EXHAUSTED = 7
    NOT_FOUND = 8
    ALREADY_EXISTS = 9
    ALREADY_CONSUMED = 10
    NOT_A_CONSUMER = 11
    UNSUPPORTED = 12
    STORE_ERROR = 13
    REFUSED = 14
    WAIT_TIMEOUT = 15
    WAITED_FOR_DEAD = 16
    INTERRUPTED = 130


@dataclass(frozen=True)
class Outcome:
    """How one error is reported: its exit code, a short label and extra JSON fields."""

    code: ExitCode
    label: str
    fields: dict[str, Any]


# Most specific first: the first class an error is an instance of decides.
_TABLE: tuple[tuple[type[BaseException], ExitCode, str], ...] = (
    (UsageError, ExitCode.USAGE, "usage error"),
    (om.InvalidInput, ExitCode.USAGE, "invalid input"),
    (NothingClaimable, ExitCode.NOTHING_CLAIMABLE, "nothing claimable"),
    (om.NotClaimable, ExitCode.NOTHING_CLAIMABLE, "nothing claimable"),
    (om.NotReady, ExitCode.NOT_READY, "not ready"),
    (om.LeaseLost, ExitCode.LEASE_LOST, "lease lost"),
    (om.ChecksumMismatch, ExitCode.CHECKSUM_MISMATCH, "checksum mismatch"),
    (om.ConflictRetriesExhausted, ExitCode.CONFLICT_RETRIES_EXHAUSTED, "too much contention"),
    (om.NotFound, ExitCode.NOT_FOUND, "not found"),
    (om.AlreadyExists, ExitCode.ALREADY_EXISTS, "already exists"),
    (om.DeclarationConflict, ExitCode.ALREADY_EXISTS, "declaration conflict"),
    (om.AlreadyConsumed, ExitCode.ALREADY_CONSUMED, "already consumed"),
    (om.NotAConsumer, ExitCode.NOT_A_CONSUMER, "not a consumer"),
    (om.UnsupportedStore, ExitCode.UNSUPPORTED, "unsupported store"),
    (om.CorruptShard, ExitCode.UNSUPPORTED, "corrupt manifest"),
    (om.UnsupportedSchema, ExitCode.UNSUPPORTED, "unsupported schema"),
    (ExtraMissing, ExitCode.UNSUPPORTED, "not installed"),
    (om.StoreError, ExitCode.STORE_ERROR, "store error"),
    (om.Refused, ExitCode.REFUSED, "refused"),
    (om.WaitTimeout, ExitCode.WAIT_TIMEOUT, "timed out"),
    (om.DeadWaitedFor, ExitCode.WAITED_FOR_DEAD, "dead entries"),
    (LocalServerError, ExitCode.ERROR, "server error"),
    (om.ObjManifestError, ExitCode.ERROR, "error"),
    (OSError, ExitCode.ERROR, "i/o error"),
    (KeyboardInterrupt, ExitCode.INTERRUPTED, "interrupted"),
    (Stopped, ExitCode.INTERRUPTED, "interrupted"),
)


def expected(error: BaseException) -> bool:
    """Errors the CLI reports in one line; anything else is a bug worth a traceback."""
    return any(isinstance(error, cls) for cls, _, _ in _TABLE)


def classify(error: BaseException) -> Outcome:
    """The exit code, label and structured fields for ``error``."""
    for cls, code, label in _TABLE:
        if isinstance(error, cls):
            return Outcome(code, label, _fields(error))
    return Outcome(ExitCode.ERROR, "unexpected error", {})


def _fields(error: BaseException) -> dict[str, Any]:
    """Structured details some errors carry, for callers that parse JSON."""
    fields: dict[str, Any] = {}
    if isinstance(error, om.NotClaimable):
        fields.update(file_id=error.file_id, reason=error.reason)
    if isinstance(error, (om.CorruptShard, om.UnsupportedSchema)):
        fields["key"] = error.key
        fields["address"] = error.address
    if isinstance(error, om.HasDependents):
        fields["dependents"] = list(error.dependents)
    if isinstance(error, (om.WaitTimeout, om.DeadWaitedFor)):
        fields["file_ids"] = list(error.file_ids)
    if isinstance(error, om.LeasesLive):
        fields["holders"] = list(error.holders)
    return fields


__all__ = [
    "ExitCode",
    "NotAllReady",
    "NothingClaimable",
    "Outcome",
    "Stopped",
    "UsageError",
    "classify",
    "expected",
]
