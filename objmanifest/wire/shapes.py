"""The JSON shapes of the faces: entries, claims, status and errors, as ``--json`` prints
them, the MCP server replies with them and the web API answers them. Keys and formats are
documented in ``docs/cli.md``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel

import objmanifest as om

from ..local.errors import Stopped
from .exits import classify, expected


def jsonable(value: Any) -> Any:
    """Plain JSON data, with datetimes as ISO 8601 strings and enums as their values."""
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


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
    return data


def iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "-"


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


def error_json(error: BaseException) -> dict[str, Any]:
    """``error`` as ``--json`` reports it (``objmanifest mcp`` reports tool errors so too)."""
    outcome = classify(error)
    return {
        "error": type(error).__name__,
        "message": error_message(error),
        "exit_code": int(outcome.code),
        **outcome.fields,
    }
