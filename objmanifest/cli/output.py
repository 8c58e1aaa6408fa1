"""Everything the CLI writes: JSON objects for machines, rich text for humans, error lines.

With ``--json`` each command writes exactly one JSON object, success or error, to stdout
(or to stderr when stdout carries data, as in ``consume -o -``). Without it, results go to
stdout and messages to stderr. Keys and formats are documented in ``docs/cli.md``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import traceback
from datetime import datetime
from enum import Enum
from typing import Any, TextIO

from pydantic import BaseModel
from rich.console import Console, RenderableType

import objmanifest as om

from .exits import Stopped, UsageError, classify, expected

PROG = "objmanifest"


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


class Output:
    """Where results, messages and errors go for one invocation."""

    def __init__(
        self, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.json_mode = json_mode
        given = stdout or sys.stdout
        self.stdout_closed = given is None
        """The process started with stdout closed (``>&-``): nothing may rely on it."""
        self.stdout: TextIO = given if given is not None else io.StringIO()
        self.stderr: TextIO = stderr or sys.stderr or io.StringIO()
        self.json_stream = self.stderr if self.stdout_closed else self.stdout
        self._console: Console | None = None

    def data_on_stdout(self) -> None:
        """Stdout is about to carry data: move the JSON object to stderr."""
        self.json_stream = self.stderr

    @property
    def console(self) -> Console:
        """A rich console on stdout, built on first use."""
        if self._console is None:
            self._console = Console(file=self.stdout, highlight=False, soft_wrap=False)
        return self._console

    def emit_json(self, obj: dict[str, Any] | list[Any]) -> None:
        self.json_stream.write(json.dumps(obj, sort_keys=False) + "\n")
        self.json_stream.flush()

    def result(self, obj: dict[str, Any] | list[Any], *human: RenderableType) -> None:
        """The command's result: ``obj`` as JSON, or the human renderables."""
        if self.json_mode:
            self.emit_json(obj)
            return
        for item in human:
            if isinstance(item, str):
                self.line(item)
            else:
                self.console.print(item)

    def json_line(self, obj: dict[str, Any]) -> None:
        """One JSON object on a line of its own (``log --follow --json``: JSON Lines)."""
        self.stdout.write(json.dumps(jsonable(obj)) + "\n")
        self.stdout.flush()

    def line(self, text: str) -> None:
        """One plain line of human output on stdout, never parsed as rich markup."""
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        """A message for a human on stderr; silent with ``--json``."""
        if not self.json_mode:
            self.stderr.write(text + "\n")
            self.stderr.flush()

    def error(self, error: BaseException, debug: bool = False) -> int:
        """Report ``error`` in one line (or one JSON object) and return its exit code."""
        outcome = classify(error)
        if debug:
            traceback.print_exception(type(error), error, error.__traceback__, file=self.stderr)
        if self.json_mode:
            self.emit_json(error_json(error))
        else:
            self._error_line(error, outcome.label, error_message(error), debug)
        return int(outcome.code)

    def _error_line(self, error: BaseException, label: str, message: str, debug: bool) -> None:
        if isinstance(error, KeyboardInterrupt):
            self.stderr.write(f"{PROG}: interrupted\n")
        elif isinstance(error, Stopped):
            self.stderr.write(f"{PROG}: {message}\n")
        elif isinstance(error, UsageError):
            if error.usage:
                self.stderr.write(error.usage.rstrip("\n") + "\n")
            self.stderr.write(f"{PROG}: error: {message}\n")
        elif not expected(error):
            hint = "" if debug else " (run with --debug for the traceback)"
            self.stderr.write(f"{PROG}: unexpected error: {message}{hint}\n")
        else:
            self.stderr.write(f"{PROG}: {label}: {message}\n")
        self.stderr.flush()
