"""``Running``: what every local server shares once started: a ``stop()`` that runs once
(from any thread, from ``atexit``, or leaving a ``with`` block)."""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

S = TypeVar("S", bound="Running")


class Running:
    """A started server. It keeps what stops it in ``_stopper`` (None once stopped) and a
    ``_lock``; ``atexit`` holds its ``stop`` until it ran."""

    _stopper: Callable[[], None] | None
    _lock: threading.Lock

    @property
    def running(self) -> bool:
        """False once ``stop()`` has been called."""
        return self._stopper is not None

    def stop(self) -> None:
        """Stop the server; safe to call more than once and from ``atexit``."""
        with self._lock:
            stopper, self._stopper = self._stopper, None
        if stopper is not None:
            stopper()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()
