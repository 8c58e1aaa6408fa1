"""How long a waiter pauses between looks, from what its looks saw.

An object store cannot tell a waiter that something changed: it has to look, and every
look is a request. Looking often makes a handoff quick and an idle wait expensive; looking
seldom the reverse. A ``Pace`` looks often only while something is happening:

* while **the awaited entry is being written** (its producer holds a live lease), at most
  ``writing`` seconds apart: the put is near, and a quick look saves its consumer most of
  the wait;
* after **a change** of what it watches (a shard's new version: a claim, a put, a release
  of any entry there), ``first`` seconds, then growing by ``growth`` a look: work is moving;
* when **nothing happens**, growing to ``idle`` seconds apart: 30 looks a minute at 2 s,
  one request each.

A put that lands with nothing before it to see (a claim and a put in one idle pause, on
a shard where nothing else moves) is seen at the next idle look, up to ``idle`` seconds
later: that is the price of a cheap idle wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import InvalidInput

FIRST = 0.25
GROWTH = 1.5
IDLE = 2.0
WRITING = 0.5


@dataclass
class Pace:
    """The pauses of one wait (see the module's docstring)."""

    first: float = FIRST
    growth: float = GROWTH
    idle: float = IDLE
    writing: float = WRITING
    _next: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("first", "idle", "writing"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InvalidInput(f"Pace.{name} must be a finite number of seconds > 0")
        if not (math.isfinite(self.growth) and self.growth >= 1):
            raise InvalidInput("Pace.growth must be a finite factor of at least 1")
        self._next = min(self.first, self.idle)

    def after(self, *, changed: bool, writing: bool) -> float:
        """The pause before the next look, given what this look saw: whether what the
        wait watches ``changed`` since the look before, and whether the awaited entry is
        ``writing`` under a live lease."""
        if changed:
            self._next = min(self.first, self.idle)
        pause = min(self._next, self.writing) if writing else self._next
        self._next = min(self._next * self.growth, self.idle)
        return pause
