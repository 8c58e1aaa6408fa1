"""The bounds of what a face reads whole from a person or a program (the command line's
``declare --from`` and ``put-many --claims``, a line of the MCP server's stdio): its size,
how deep its JSON nests, and what separates its lines, so every face refuses the same
input the same way.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

from ..errors import InvalidInput

MAX_INPUT_BYTES = 64 * 1024 * 1024
"""The most read whole at once (64 MiB): about a million declarations or claims."""

MAX_NESTING = 100
"""The deepest JSON read (arrays and objects inside each other): a declaration, a claim or
a tool call nests a handful deep, and a parser that recursed 100,000 deep would crash."""

ASCII_SPACE = string.whitespace
"""What is stripped around a line: ASCII white space only, so a character a name may not
hold (U+2028, U+00A0 ...) stays in it and is refused there, never cut off silently."""


def lines(text: str) -> list[str]:
    """``text`` split at line feeds only (a CRLF line keeps its CR, for ``ASCII_SPACE``):
    ``str.splitlines`` also splits at U+2028, U+2029, U+0085 and form feeds, which would
    make one refused name two accepted ones."""
    return text.split("\n")


TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A JSON string (skipped whole, in C) or a bracket: what nesting is counted from."""


def nesting(text: str | bytes, limit: int = MAX_NESTING) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest, counted without
    recursion and outside strings; it stops counting past ``limit``."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    for token in TOKENS.finditer(data):
        bracket = token.group()
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif bracket in (b"]", b"}"):
            depth -= 1
    return deepest


def too_deep(where: str) -> str:
    """The message of JSON nested past ``MAX_NESTING``."""
    return (
        f"{where} is nested too deeply to read (arrays or objects inside each other more "
        f"than {MAX_NESTING} deep)"
    )


def load_json(text: str, where: str) -> Any:
    """``text`` parsed as JSON, or ``InvalidInput`` naming ``where`` (nested past
    ``MAX_NESTING`` included)."""
    if nesting(text) > MAX_NESTING:
        raise InvalidInput(f"{too_deep(where)}: a declaration or a claim is one object")
    try:
        return json.loads(text)
    except RecursionError:  # not reached below MAX_NESTING; kept for a smaller stack
        raise InvalidInput(f"{too_deep(where)}: a declaration or a claim is one object") from None
    except ValueError as e:
        raise InvalidInput(f"{where} is not valid JSON: {e}") from None


__all__ = [
    "ASCII_SPACE",
    "MAX_INPUT_BYTES",
    "MAX_NESTING",
    "TOKENS",
    "lines",
    "load_json",
    "nesting",
    "too_deep",
]
