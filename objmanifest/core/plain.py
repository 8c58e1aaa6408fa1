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
