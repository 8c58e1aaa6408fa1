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

A ``SendRate`` paces one client's requests of a kind a store throttles as a whole (GCS:
about 1,000 writes a second per bucket at first, one update a second per object): not at
all until the store throttles one, then at ``decrease`` of the rate it was sending at,
regaining ``recovery`` requests a second every second without another throttle (additive
increase, multiplicative decrease). Many clients that each slow down at their own
throttles so settle together near what the store serves, without telling each other
anything, and each request waits its turn instead of its retries' growing backoff.
"""

from __future__ import annotations

import math
import threading
from collections import deque
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


DECREASE = 0.7
RECOVERY = 0.02
LEAST = 0.1
RECENT = 2.0
"""Seconds of sends a client's rate is measured over when it is first throttled."""


@dataclass
class SendRate:
    """The pace of one client's throttled requests (see the module's docstring); safe from
    any thread (each caller is given its own turn)."""

    decrease: float = DECREASE
    recovery: float = RECOVERY
    least: float = LEAST
    _rate: float | None = field(default=None, init=False, repr=False)
    _set_at: float = field(default=0.0, init=False, repr=False)
    _next: float = field(default=-math.inf, init=False, repr=False)
    _sent: deque[float] = field(default_factory=deque, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("recovery", "least"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InvalidInput(f"SendRate.{name} must be a finite number > 0")
        if not (isinstance(self.decrease, (int, float)) and 0 < self.decrease < 1):
            raise InvalidInput("SendRate.decrease must be a factor between 0 and 1")

    def rate(self, now: float) -> float | None:
        """Requests a second this client may send now; None: as many as it likes (no
        throttle seen yet)."""
        if self._rate is None:
            return None
        return self._rate + self.recovery * max(0.0, now - self._set_at)

    def throttled(self, now: float) -> None:
        """The store throttled one of these requests (the client's retry sends it again):
        send at ``decrease`` of the pace so far, the next request a full turn from now."""
        with self._lock:
            sending = self.rate(now)
            if sending is None:
                sending = sum(1 for t in self._sent if t > now - RECENT) / RECENT
            self._rate = max(self.least, sending * self.decrease)
            self._set_at = now
            self._next = max(self._next, now + 1.0 / self._rate)

    def turn(self, now: float) -> float:
        """How long to wait before sending a request now (0: at once); the request is
        counted as sent then."""
        with self._lock:
            rate = self.rate(now)
            start = now if rate is None else max(now, self._next)
            if rate is not None:
                self._next = start + 1.0 / rate
            sent = self._sent
            sent.append(start)
            while sent[0] < start - RECENT:
                sent.popleft()
            return start - now
