"""Input a command reads whole (``declare --from``, ``put-many --claims``): bounded.

A file or stdin read whole is refused past ``MAX_INPUT_BYTES`` (``/dev/zero`` piped in
would otherwise be read until the machine runs out of memory), and JSON nested deeper
than ``wire.inputs.MAX_NESTING`` is refused as such: each with exit 2 and the limit named
(the MCP server reads its stdio under the same bounds).
"""

from __future__ import annotations

import sys
from pathlib import Path

import objmanifest as om

from ..wire.errors import UsageError
from ..wire.inputs import ASCII_SPACE, MAX_INPUT_BYTES, lines, load_json


def read_whole(source: str, option: str) -> str:
    """The text of ``source`` (a path, or ``-`` for stdin) given to ``option``, as UTF-8,
    of at most ``MAX_INPUT_BYTES``."""
    name = "stdin" if source == "-" else repr(source)
    if source == "-":
        if sys.stdin is None:
            raise UsageError(f"stdin is closed: give {option} PATH, or pipe the input in")
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        path = Path(source)
        if path.is_dir():
            raise IsADirectoryError(f"cannot read {option} {source!r}: it is a directory")
        try:
            with path.open("rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
        except FileNotFoundError:
            raise FileNotFoundError(f"cannot read {option} {source!r}: no such file") from None
    if len(data) > MAX_INPUT_BYTES:
        raise om.InvalidInput(
            f"{option} {name} holds more than {MAX_INPUT_BYTES // (1024 * 1024)} MiB, the most "
            "read at once: split it into several commands; nothing was changed"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise om.InvalidInput(
            f"{option} {name} is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None


def shown(value: object, limit: int = 200) -> str:
    """``value`` as an error message may quote it: its repr, cut at ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


__all__ = ["ASCII_SPACE", "MAX_INPUT_BYTES", "lines", "load_json", "read_whole", "shown"]
