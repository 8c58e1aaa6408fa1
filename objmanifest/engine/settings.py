"""A task's settings checked before anything is written: lease, retries, retention, backoff
and deadlines, each refused with the value that would do."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..errors import (
    InvalidInput,
)

MAX_LEASE_SECONDS = 30 * 24 * 3600.0
"""The longest lease a task may set (30 days); a lease renews itself while its holder works."""


MAX_JOURNAL_KEEP_SECONDS = 10 * 366 * 24 * 3600.0
"""The longest journal retention by age a task may set (about ten years)."""
MAX_JOURNAL_KEEP_VERSIONS = 10**9


MAX_BACKOFF_SECONDS = 30 * 24 * 3600.0
"""The longest retry backoff or stage deadline a task may set (30 days)."""


def check_settings(lease_seconds: object, max_retries: object) -> tuple[float, int]:
    """A task's lease and retry settings, or ``InvalidInput`` saying what is allowed."""
    lease_ok = (
        isinstance(lease_seconds, (int, float))
        and not isinstance(lease_seconds, bool)
        and math.isfinite(lease_seconds)
        and 0 < lease_seconds <= MAX_LEASE_SECONDS
    )
    if not lease_ok:
        raise InvalidInput(
            f"lease_seconds must be a number of seconds above 0 and at most "
            f"{MAX_LEASE_SECONDS:.0f} (30 days), not {lease_seconds!r}"
        )
    if (
        not isinstance(max_retries, int)
        or isinstance(max_retries, bool)
        or not (0 <= max_retries <= 1000)
    ):
        raise InvalidInput(
            f"max_retries must be a whole number from 0 to 1000, not {max_retries!r}"
        )
    return float(lease_seconds), max_retries  # type: ignore[arg-type]


def check_retention(keep_seconds: object, keep_versions: object) -> tuple[float | None, int | None]:
    """A task's journal retention settings (None: no bound), or ``InvalidInput`` saying
    what is allowed."""
    seconds_ok = keep_seconds is None or (
        isinstance(keep_seconds, (int, float))
        and not isinstance(keep_seconds, bool)
        and math.isfinite(keep_seconds)
        and 0 < keep_seconds <= MAX_JOURNAL_KEEP_SECONDS
    )
    if not seconds_ok:
        raise InvalidInput(
            f"journal_keep_seconds must be a number of seconds above 0 and at most "
            f"{MAX_JOURNAL_KEEP_SECONDS:.0f} (about ten years), or None to keep every "
            f"record, not {keep_seconds!r}"
        )
    if keep_versions is not None and (
        not isinstance(keep_versions, int)
        or isinstance(keep_versions, bool)
        or not (1 <= keep_versions <= MAX_JOURNAL_KEEP_VERSIONS)
    ):
        raise InvalidInput(
            f"journal_keep_versions must be a whole number from 1 to "
            f"{MAX_JOURNAL_KEEP_VERSIONS}, or None to keep every record, not {keep_versions!r}"
        )
    seconds = float(keep_seconds) if keep_seconds is not None else None  # type: ignore[arg-type]
    return seconds, keep_versions


def _seconds(name: str, value: object) -> float:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_BACKOFF_SECONDS
    )
    if not ok:
        raise InvalidInput(
            f"{name} must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:.0f} "
            f"(30 days), not {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def check_timing(
    retry_backoff: object, retry_backoff_max: object, deadlines: object, stages: Iterable[str]
) -> tuple[float | None, float | None, dict[str, float] | None]:
    """A task's retry backoff and stage deadlines (None: unset), or ``InvalidInput``."""
    base = _seconds("retry_backoff", retry_backoff) or None
    cap = None
    if retry_backoff_max is not None:
        cap = _seconds("retry_backoff_max", retry_backoff_max)
        if base is None or cap < base:
            raise InvalidInput(
                f"retry_backoff_max ({retry_backoff_max!r}) needs a retry_backoff of at most "
                f"it (retry_backoff is {retry_backoff!r})"
            )
    if deadlines is None:
        return base, cap, None
    if not isinstance(deadlines, Mapping):
        raise InvalidInput(
            f"deadlines must map stage names to seconds, like {{'collect': 600}}, not the "
            f"{type(deadlines).__name__} {deadlines!r}"
        )
    known = list(stages)
    out: dict[str, float] = {}
    for stage, seconds in deadlines.items():
        if stage not in known:
            raise InvalidInput(
                f"deadlines name {stage!r}, which is not a stage of the task "
                f"(its stages are {', '.join(known)})"
            )
        value = _seconds(f"the deadline of stage {stage!r}", seconds)
        if value <= 0:
            raise InvalidInput(f"the deadline of stage {stage!r} must be above 0 seconds")
        out[stage] = value
    return base, cap, out or None


PARALLEL_READS = 16
"""The most shards read at once for a view of a split stage."""


def some_ids(file_ids: list[str], shown: int = 10) -> str:
    """Up to ``shown`` file ids, and how many more."""
    more = len(file_ids) - shown
    return ", ".join(file_ids[:shown]) + (f" and {more} more" if more > 0 else "")
