"""Everything the CLI writes: JSON objects for machines, rich text for humans, error lines.

With ``--json`` each command writes exactly one JSON object, success or error, to stdout
(or to stderr when stdout carries data, as in ``consume -o -``). Without it, results go to
stdout and messages to stderr. Keys and formats are documented in ``docs/cli.md``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from typing import Any, TextIO

from rich.console import Console, RenderableType

from ..local.errors import Stopped
from ..wire.errors import UsageError
from ..wire.exits import classify, expected
from ..wire.shapes import error_json, error_message, jsonable

PROG = "objmanifest"

UNWRAPPED = 10_000
"""The width of a console writing into a pipe or a file: wide enough that no line wraps."""


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a stand-in stream
        return False


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
        """A rich console on stdout, built on first use. Into a pipe or a file (and no
        ``COLUMNS`` set) a line is never wrapped at 80 columns, so a tree's or a table's
        row stays one line for ``grep`` and ``less -S``."""
        if self._console is None:
            piped = not _is_terminal(self.stdout) and not os.environ.get("COLUMNS")
            self._console = Console(
                file=self.stdout,
                highlight=False,
                soft_wrap=False,
                width=UNWRAPPED if piped else None,
            )
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
