"""What a test needs of a backend beyond its store: a holder that stalls, a store whose
clock is off this machine's. On S3 both go through a fault-injecting proxy in front of the
real server (``faults.FaultProxy``); on the in-process ``MemoryStore`` through its call
hooks and its injectable clock; on the other backends (``file``) through the hooks of the
``FaultyStore`` they run in, and a clock shifted by a wrapper. Either way the library sees
only a store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, Protocol

from objmanifest.store import FaultyStore
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


class _HookStall:
    """A hook on every call of the stores it made (``make(prefix)``: a store with faults):
    while paused, each call waits."""

    def __init__(self, make: Callable[[str], Any]) -> None:
        self.make = make
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
        store = self.make(prefix)
        store.faults.hooks.append(self._hook)
        return store

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()


class SkewedStore(FaultyStore):
    """A store whose clock reads ``seconds`` off its own (a file server whose clock is off
    its clients')."""

    def __init__(self, inner: Any, seconds: float) -> None:
        super().__init__(inner)
        self.offset = timedelta(seconds=seconds)

    def now(self) -> datetime:
        return self.inner.now() + self.offset


@contextlib.contextmanager
def stalling(server: Server) -> Iterator[Stall]:
    """A stall for ``server``'s backend, always resumed at the end."""
    if not server.s3:
        stall: Any = _HookStall(memory_store if server.name == "memory" else server.connect)
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
    if not server.s3:
        yield lambda prefix: SkewedStore(server.open(prefix), seconds)
        return
    with FaultProxy(server.endpoint_url, date_offset=seconds) as proxy:
        yield lambda prefix: server.connect(prefix, endpoint_url=proxy.endpoint_url)
