"""``Running``: what every local server shares once started: a ``stop()`` that runs once
(from any thread, from ``atexit``, or leaving a ``with`` block); and ``start_server``, how
each is started."""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

S = TypeVar("S", bound="Running")


def start_server(
    command: Sequence[str],
    log: IO[bytes],
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A local server's process: no input, its output and errors to ``log``, in ``cwd``,
    in a session of its own (its own process group: stopping it signals the server and
    all it spawned)."""
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )


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
