"""How far back an age may reach: ``archive`` and ``gc`` take entries older than an age,
``log --since`` a duration before now. Each is subtracted from the store's clock, which
cannot go back past year 1, so one bound serves them all and each refuses what is past it
with the same words."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from ..errors import InvalidInput

MAX_AGE_SECONDS = 1000 * 365.25 * 86400
"""The longest age or duration (1000 years, 31557600000 seconds): anything older is as
good as never."""

MAX_AGE_DAYS = int(MAX_AGE_SECONDS // 86400)

AGE_RULE = f"a finite number of seconds from 0 to {MAX_AGE_SECONDS:.0f} (1000 years)"
"""What an age may be, as every refusal of one says it."""


def age_problem(value: object) -> str | None:
    """Why ``value`` is not an age (seconds, a number, not a bool), or None."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_AGE_SECONDS
    ):
        return None
    return f"must be {AGE_RULE}"


def check_age(name: str, value: object) -> float:
    """An age argument (``older_than``, ``consumed_older_than``) as seconds, or
    ``InvalidInput`` naming it and the bound."""
    problem = age_problem(value)
    if problem is not None:
        raise InvalidInput(f"{name} {problem}, not {value!r}")
    assert isinstance(value, (int, float))
    return float(value)


__all__ = ["AGE_RULE", "MAX_AGE_DAYS", "MAX_AGE_SECONDS", "age_problem", "check_age"]


LATEST = datetime.max.replace(tzinfo=timezone.utc)


def older_than_cutoff(now: datetime, seconds: float) -> datetime:
    """What a change must be stamped at or before to be ``seconds`` old at ``now``; for 0,
    any change at all. (A process that has just started knows the store's clock to the
    second of a ``Date`` header, so a change another process made a moment ago may be
    stamped after its ``now``: "older than 0" still means it.)"""
    return now - timedelta(seconds=seconds) if seconds > 0 else LATEST
