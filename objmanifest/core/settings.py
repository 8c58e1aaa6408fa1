"""The rules for a task's settings: lease, retries, retention, backoff and deadlines, each
refused with the value that would do, and ``TaskSettings``, what ``Task.create`` was given,
checked in one place before anything is written."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .layout import resolve_partitions, spread_by_default
from .model import LAYOUT_SCHEMA, READERS, SCHEMA_VERSION, SPREAD_SCHEMA

MAX_LEASE_SECONDS = 30 * 24 * 3600.0
"""The longest lease a task may set (30 days); a lease renews itself while its holder works."""


MAX_JOURNAL_KEEP_SECONDS = 10 * 366 * 24 * 3600.0
"""The longest journal retention by age a task may set (about ten years)."""
MAX_JOURNAL_KEEP_VERSIONS = 10**9


MAX_BACKOFF_SECONDS = 30 * 24 * 3600.0
"""The longest retry backoff or stage deadline a task may set (30 days)."""


def _finite(value: object) -> float | None:
    """``value`` as a float if it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _whole(value: object, low: int, high: int) -> int | None:
    """``value`` if it is an int (not a bool) from ``low`` to ``high``, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def check_settings(lease_seconds: object, max_retries: object) -> tuple[float, int]:
    """A task's lease and retry settings, or ``InvalidInput`` saying what is allowed."""
    lease = _finite(lease_seconds)
    if lease is None or not 0 < lease <= MAX_LEASE_SECONDS:
        raise InvalidInput(
            f"lease_seconds must be a number of seconds above 0 and at most "
            f"{MAX_LEASE_SECONDS:.0f} (30 days), not {lease_seconds!r}"
        )
    retries = _whole(max_retries, 0, 1000)
    if retries is None:
        raise InvalidInput(
            f"max_retries must be a whole number from 0 to 1000, not {max_retries!r}"
        )
    return lease, retries


def check_retention(keep_seconds: object, keep_versions: object) -> tuple[float | None, int | None]:
    """A task's journal retention settings (None: no bound), or ``InvalidInput`` saying
    what is allowed."""
    seconds = None if keep_seconds is None else _finite(keep_seconds)
    bounded = seconds is not None and 0 < seconds <= MAX_JOURNAL_KEEP_SECONDS
    if keep_seconds is not None and not bounded:
        raise InvalidInput(
            f"journal_keep_seconds must be a number of seconds above 0 and at most "
            f"{MAX_JOURNAL_KEEP_SECONDS:.0f} (about ten years), or None to keep every "
            f"record, not {keep_seconds!r}"
        )
    versions = _whole(keep_versions, 1, MAX_JOURNAL_KEEP_VERSIONS)
    if keep_versions is not None and versions is None:
        raise InvalidInput(
            f"journal_keep_versions must be a whole number from 1 to "
            f"{MAX_JOURNAL_KEEP_VERSIONS}, or None to keep every record, not {keep_versions!r}"
        )
    return seconds, versions


def _seconds(name: str, value: object) -> float:
    seconds = _finite(value)
    if seconds is None or not 0 <= seconds <= MAX_BACKOFF_SECONDS:
        raise InvalidInput(
            f"{name} must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:.0f} "
            f"(30 days), not {value!r}"
        )
    return seconds


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


@dataclass(frozen=True)
class TaskSettings:
    """A task's settings as ``Task.create`` was given them (see its docstring), unchecked:
    ``header_fields`` checks them."""

    stages: Iterable[str]
    lease_seconds: float = 300
    max_retries: int = 3
    journal_keep_seconds: float | None = None
    journal_keep_versions: int | None = None
    partitions: Mapping[str, int | str] | None = None
    layout: str | None = None
    retry_backoff: float = 0
    retry_backoff_max: float | None = None
    deadlines: Mapping[str, float] | None = None
    agents: int | None = None
    spread: bool | None = None

    def header_fields(self) -> dict[str, Any]:
        """The fields of the task's header these settings give, each checked (no I/O):
        ``InvalidInput`` naming the first one that is not allowed."""
        lease, retries = check_settings(self.lease_seconds, self.max_retries)
        keep_seconds, keep_versions = check_retention(
            self.journal_keep_seconds, self.journal_keep_versions
        )
        stages, partitions = self.stages, self.partitions
        if isinstance(stages, (str, bytes, dict)):
            raise InvalidInput(
                f"stages must be a list of stage names, not the {type(stages).__name__} "
                f"{stages!r}: write stages=[{stages!r}] for one stage"
                if not isinstance(stages, dict)
                else f"stages must be a list of stage names, not a dict: {stages!r}"
            )
        if partitions is not None and not isinstance(partitions, Mapping):
            raise InvalidInput(
                f"partitions must map stage names to partition counts, like "
                f'{{"collect": 16}}, not the {type(partitions).__name__} {partitions!r}'
            )
        names = tuple(stages)
        backoff, backoff_max, deadlines = check_timing(
            self.retry_backoff, self.retry_backoff_max, self.deadlines, names
        )
        counts = resolve_partitions(partitions, self.agents, self.spread)
        if self.spread is not None and not isinstance(self.spread, bool):
            raise InvalidInput(
                f"spread must be True, False or None (decide from the partitions), not "
                f"{self.spread!r}"
            )
        spread = spread_by_default(counts or {}) if self.spread is None else self.spread
        if spread and self.layout is not None:
            raise InvalidInput("a task with layout='task' keeps one shard: it cannot be spread")
        layered = self.layout is not None or any(n != 1 for n in (counts or {}).values())
        # A backoff or deadlines need header schema 3 too: 0.2.0 would claim a failed entry
        # at once, blind to its retry_at.
        timed = backoff is not None or deadlines is not None
        schema = SPREAD_SCHEMA if spread else LAYOUT_SCHEMA if layered or timed else SCHEMA_VERSION
        return {
            "stages": names,
            "lease_seconds": lease,
            "max_retries": retries,
            "schema_version": schema,
            "requires": READERS[schema],
            "journal_keep_seconds": keep_seconds,
            "journal_keep_versions": keep_versions,
            "layout": self.layout,
            "spread": True if spread else None,
            "partitions": counts,
            "retry_backoff": backoff,
            "retry_backoff_max": backoff_max,
            "deadlines": deadlines,
        }
