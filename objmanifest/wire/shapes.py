"""The JSON shapes of the faces: entries, claims, status, journal records and errors, as
``--json`` prints them, the MCP server replies with them and the web API answers them (its
rows of entries and notes, and its errors). Keys and formats are documented in
``docs/cli.md`` and ``docs/web.md``; times are ISO 8601 as ``isoformat`` writes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import objmanifest as om

from ..core.plain import jsonable as jsonable
from ..core.report import EntryNote
from ..local.errors import Stopped
from .exits import classify, expected


def entry_json(entry: om.Entry) -> dict[str, Any]:
    data: dict[str, Any] = jsonable(entry)
    return data


def claim_json(claim: om.Claim) -> dict[str, Any]:
    return claim.to_dict()


def status_json(status: om.TaskStatus) -> dict[str, Any]:
    data: dict[str, Any] = jsonable(status)
    data["totals"] = status.totals
    data["finished"] = status.finished
    if not any(status.archived.values()):
        del data["archived"]  # archiving: shown once an entry is archived
    if not status.damaged:
        del data["damaged"]  # shown once a manifest object does not read back sound
    if not status.contention:
        del data["contention"], data["contended"]  # shown once a stage has recent commits
    return data


def iso(at: datetime | None) -> str | None:
    """A time as the faces' JSON gives it (None stays null)."""
    return at.isoformat() if at is not None else None


def record_json(record: om.JournalRecord) -> dict[str, Any]:
    """A journal record as ``log --json`` prints it and the MCP server's ``log`` gives it
    (unset fields left out)."""
    data = record.model_dump(exclude_none=True)
    data["at"] = iso(record.at)
    data["transitions"] = [
        {k: iso(v) if isinstance(v, datetime) else v for k, v in vars(c).items() if v is not None}
        for c in record.transitions
    ]
    return data


def entry_row(entry: om.Entry, partition: str | None = None) -> dict[str, Any]:
    """One entry as the web API gives it (the page computes the lease left from
    ``lease_expires_at`` and the view's ``store_time``)."""
    return {
        "file_id": entry.file_id,
        "stage": entry.stage,
        "state": entry.state.value,
        "holder": entry.owner,
        "epoch": entry.epoch,
        "lease_expires_at": iso(entry.lease_expires_at),
        "retries": entry.retry_count,
        "size": entry.size,
        "checksum": entry.checksum,
        "error": entry.error,
        "declared_at": iso(entry.declared_at),
        "updated_at": iso(entry.updated_at),
        "claimed_at": iso(entry.claimed_at),
        "ready_at": iso(entry.ready_at),
        "retry_at": iso(entry.retry_at),
        "depends_on": list(entry.depends_on),
        "consumers": list(entry.consumers),
        "consumed_by": list(entry.consumed_by),
        "chunked": entry.is_chunked,
        "data_removed_at": iso(entry.data_removed_at),
        "partition": partition,
        "archived": False,
    }


def note_row(note: EntryNote) -> dict[str, Any]:
    """An entry a status names (blocked, overdue, dead ...) as the web API gives it."""
    return {
        "file_id": note.file_id,
        "stage": note.stage,
        "state": note.state.value,
        "reason": note.reason,
    }


def error_message(error: BaseException) -> str:
    """The one-line message of ``error``: an unexpected one is prefixed by its type."""
    message = str(error) or type(error).__name__
    if not expected(error):
        message = f"{type(error).__name__}: {message}"
    if isinstance(error, KeyboardInterrupt):
        message = "interrupted by a signal"
    elif isinstance(error, Stopped):
        message = f"stopped by {error}"
    return message


def api_error_json(error: BaseException) -> dict[str, Any]:
    """An error as the web API answers it: its name and message, and the exit code the
    command line and the MCP server give it; anything not ours is an internal error whose
    message stays in the server's log."""
    if isinstance(error, om.ObjManifestError):
        code = int(classify(error).code)
        return {"error": type(error).__name__, "message": str(error), "exit_code": code}
    return {"error": "InternalError", "message": "unexpected error; see the server's log"}


def error_json(error: BaseException) -> dict[str, Any]:
    """``error`` as ``--json`` reports it (``objmanifest mcp`` reports tool errors so too)."""
    outcome = classify(error)
    return {
        "error": type(error).__name__,
        "message": error_message(error),
        "exit_code": int(outcome.code),
        **outcome.fields,
    }
