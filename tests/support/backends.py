"""What a test needs of a backend beyond its store: a holder that stalls, a store whose
clock is off this machine's. On S3 both go through a fault-injecting proxy in front of the
real server (``faults.FaultProxy``); on the in-process ``MemoryStore`` through its call
hooks and its injectable clock. Either way the library sees only a store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tests.support.faults import FaultProxy
from tests.support.stores import Server, memory_store


class Stall(Protocol):
    """Stores whose calls are held while the stall is paused (a GC pause, a SIGSTOP, a
    network partition), without stopping the process."""

    held: int

    def connect(self, prefix: str) -> Any: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class _ProxyStall:
    def __init__(self, server: Server, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy

    @property
    def held(self) -> int:
        return self.proxy.held

    def connect(self, prefix: str) -> Any:
        return self.server.connect(prefix, endpoint_url=self.proxy.endpoint_url)

    def pause(self) -> None:
        self.proxy.pause()

    def resume(self) -> None:
        self.proxy.resume()


class _MemoryStall:
    """A hook on every call of the stores it made: while paused, each call waits."""

    def __init__(self) -> None:
        self.held = 0
        self._running = threading.Event()
        self._running.set()
        self._lock = threading.Lock()

    def _hook(self, op: str, key: str) -> None:
        if self._running.is_set():
            return
        with self._lock:
            self.held += 1
        try:
            self._running.wait(300)
        finally:
            with self._lock:
                self.held -= 1

    def connect(self, prefix: str) -> Any:
        store = memory_store(prefix)
        store.faults.hooks.append(self._hook)
        return store

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()


@contextlib.contextmanager
def stalling(server: Server) -> Iterator[Stall]:
    """A stall for ``server``'s backend, always resumed at the end."""
    if server.name == "memory":
        stall: Any = _MemoryStall()
        try:
            yield stall
        finally:
            stall.resume()
        return
    with FaultProxy(server.endpoint_url) as proxy:
        try:
            yield _ProxyStall(server, proxy)
        finally:
            proxy.resume()


@contextlib.contextmanager
def skewed(server: Server, seconds: float) -> Iterator[Callable[[str], Any]]:
    """``connect(prefix)`` for stores whose clock is ``seconds`` off this machine's: a proxy
    that shifts the ``Date`` of every S3 answer, or a MemoryStore's own clock."""
    if server.name == "memory":
        yield lambda prefix: memory_store(prefix, skew=seconds)
        return
    with FaultProxy(server.endpoint_url, date_offset=seconds) as proxy:
        yield lambda prefix: server.connect(prefix, endpoint_url=proxy.endpoint_url)
