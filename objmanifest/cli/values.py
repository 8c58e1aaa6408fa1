"""The types of option values: whole numbers, seconds, sizes, ports and per-stage settings,
each refused as a usage error that says what would do."""

from __future__ import annotations

import argparse
import math
import re

from ..core.ages import age_problem


def in_range(text: str, low: int, high: int | None = None, what: str = "") -> int:
    """A whole number from ``low`` (to ``high``): every integer option says its bound in
    these words, as the API does (``must be a whole number from 0 to 1000``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"of at least {low}" if high is None else f"from {low} to {high}"
        raise argparse.ArgumentTypeError(f"must be a whole number {bound}{what}, not {value}")
    return value


def positive_int(text: str) -> int:
    return in_range(text, 1)


def epoch(text: str) -> int:
    """``--epoch``: the fencing token ``claim`` printed (every claim's is 1 or more)."""
    return in_range(text, 1, what=" (the epoch `claim` printed)")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def port(text: str) -> int:
    return in_range(text, 1, 65535, " (a TCP port)")


def number(text: str) -> float:
    """Any number; the command checks its range (``init --lease``, with the API's rule)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def partition_count(text: str) -> tuple[str, int | str]:
    """``STAGE=N`` or ``STAGE=auto`` of ``init --partitions``; the API checks the stage and
    the range."""
    stage, eq, count = text.partition("=")
    if not eq or not stage:
        raise argparse.ArgumentTypeError(
            f"write STAGE=N or STAGE=auto (like collect=16), not {text!r}"
        )
    return stage, "auto" if count == "auto" else _int(count)


def stage_seconds(text: str) -> tuple[str, float]:
    """``STAGE=SECONDS`` of ``init --deadline``; the API checks the stage and the range."""
    stage, eq, seconds = text.partition("=")
    if not eq or not stage:
        raise argparse.ArgumentTypeError(f"write STAGE=SECONDS (like collect=600), not {text!r}")
    return stage, number(seconds)


def whole(text: str) -> int:
    """Any whole number; the command checks its range (``init --retries``)."""
    return _int(text)


def positive_seconds(text: str) -> float:
    """A polling interval: from 0.05 to 3600 seconds (the one message for any other)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be from 0.05 to 3600 seconds, not {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more (``--wait``, ``--older-than`` ...)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, 0 or more, not {text!r}"
        )
    return value


def age(text: str) -> float:
    """An age (``archive --older-than``, ``gc --consumed-older-than``): the API's bound
    (``core.ages``), said before anything is read."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    problem = age_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}, not {text!r}")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size(text: str) -> int:
    """Bytes, with an optional binary unit: ``8388608``, ``8MiB``, ``8M``, ``512k``."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 8MiB or 8388608)")
    unit = (match.group(2) or "").lower()[:1]
    value = int(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise argparse.ArgumentTypeError("a size must be at least 1 byte")
    return value


def web_port(text: str) -> int:
    """``web --port``: a TCP port, or 0 for any free one."""
    return in_range(text, 0, 65535, " (a TCP port; 0: any free one)")


def hold_seconds(text: str) -> float:
    """``mcp --max-hold``: above 0, at most a day (one message for every value outside)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 86400 seconds, not {text}")
    return value


def racers(text: str) -> int:
    return in_range(text, 2, 64, " (writers in a race)")
