"""Plain JSON data of the library's records: one conversion for every report and shape."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel


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


def fields_json(record: Any) -> dict[str, Any]:
    """A dataclass's fields, in their order, as plain JSON data (``jsonable``)."""
    data: dict[str, Any] = jsonable(record)
    return data


MAX_NESTING = 100
"""The deepest JSON read (arrays and objects inside each other): every object and input of
the library nests a handful deep, and a parser that recursed 100,000 deep would crash."""

_BRACKETS = bytes.maketrans(b"[]{}", b"()()")
_NOT_BRACKETS = bytes(range(256)).translate(None, b'"[]{}')


def nesting_bound(body: bytes, limit: int = MAX_NESTING) -> int:
    """How deep the arrays and objects of the JSON ``body`` nest (exact for well-formed
    JSON, never less for any other bytes), found at C speed, without recursion, before a
    parser that recurses is given it; it stops counting past ``limit``.

    Escaped quotes and backslashes go first, so every quote left delimits a string; the
    body is cut to its quotes and brackets, strings (with the brackets inside them) are
    dropped, and the innermost pairs of brackets are taken away one level at a time. A
    bracket left unpaired (a cut-off body) counts as one level more."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = body.translate(_BRACKETS, _NOT_BRACKETS).replace(b'""', b"")
    outside = b"".join(marks.split(b'"')[::2]) if b'"' in marks else marks
    depth = 0
    while outside and depth <= limit:
        fewer = outside.replace(b"()", b"")
        if len(fewer) == len(outside):
            break
        outside, depth = fewer, depth + 1
    return depth + outside.count(b"(")
