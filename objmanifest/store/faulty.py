"""``FaultyStore``: any ``ObjectStore`` with the faults of a real network planned around it.

A test (or the simulation) wraps a backend, in process or on a server, and plans what a
network does to calls (``faults.add``): a call that fails before it reaches the store
(``fail``), one that is applied and whose answer is lost (``lose``), a read whose
connection breaks part-way through the body (``cut``), or a body damaged on its way in
(``flip``, ``truncate``). Hooks run before every call (a fault of their own, a stall, a
switch of the simulation's scheduler) and every call is counted by its name.

The wrapper stands between the caller and the backend, so each effect is the same on every
backend: a damaged whole object is refused as a store that verifies ``Content-MD5``
refuses it (``BodyDamaged``, nothing stored) and sent again by the wrapper's own
``send_whole``, each send a call of its own through the faults; a damaged part reaches the
backend as it arrived, and is stored with the ETag of those bytes, as S3 stores a part sent
without a digest header. ``MemoryStore`` is this wrapper around ``MemoryBackend``, so
``MemoryStore(...).faults`` is a ``Faults``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

from ..core.runtime import Runtime
from ..errors import InvalidInput, ReadBrokeOff, StoreError
from .base import (
    CREATE,
    Blob,
    ByteStream,
    Head,
    Listed,
    ObjectStore,
    PartBody,
    PartsListed,
    Put,
    PutMode,
    Version,
    Versioned,
    Writes,
    list_keys,
    read_whole,
    send_whole,
    versions_of,
)
from .errors import BodyDamaged, NoSuchObject, OutcomeUnknown

T = TypeVar("T")

UNKNOWN_WHEN_LOST = frozenset({"put", "complete_upload"})
"""The writes whose lost answer is ``OutcomeUnknown``, as ``S3Store`` says it (the calls
whose outcome a caller must find out); a lost answer to any other call, a delete too, is a
``StoreError``, applied all the same."""

Effect = Literal["fail", "lose", "cut", "flip", "truncate"]
EFFECTS: tuple[str, ...] = ("fail", "lose", "cut", "flip", "truncate")
OPERATIONS: tuple[str, ...] = (
    "get",
    "head",
    "open",
    "put",
    "delete",
    "list",
    "create_upload",
    "upload_part",
    "list_parts",
    "complete_upload",
    "abort_upload",
    "list_uploads",
    "versions",
    "get_version",
)
"""The store calls a fault may be planned for (``Fault.op``)."""
DAMAGES = ("flip", "truncate")
"""Effects on a write's body on its way in: one bit of its middle byte inverted, or only
its first half arriving (with a length to match)."""


@dataclass
class Fault:
    """One planned fault: ``op`` (None: any call) on keys containing ``key`` (None: any).

    ``fail``: the call raises ``StoreError`` and is not applied. ``lose``: the call is
    applied and its answer lost (a ``put`` or ``complete_upload`` raises ``OutcomeUnknown``,
    any other call, a ``delete`` too, ``StoreError``: what ``S3Store`` raises).
    ``cut`` (only with ``op="open"``): the stream is returned, delivers the first half of
    its bytes (rounded down), then raises ``ReadBrokeOff`` on every further read: it never
    reaches its end, as when a connection breaks mid-body. A ``read()`` of everything
    raises at once, like a real connection that breaks before the body is complete.
    ``flip`` and ``truncate`` (only with ``op="put"`` or ``"upload_part"``) damage the body
    on its way in: a whole object is refused (its ``Content-MD5`` does not match) and sent
    again by the store's own retry; a part is stored as it arrived.
    """

    op: str | None = None
    key: str | None = None
    effect: Effect = "fail"
    times: int = 1

    def __post_init__(self) -> None:
        # A typo here would plan a fault that never fires, and a test pass for nothing.
        if self.op is not None and self.op not in OPERATIONS:
            raise InvalidInput(
                f"no store call is named {self.op!r}: use one of {', '.join(OPERATIONS)}, or "
                "None for any call"
            )
        if self.effect not in EFFECTS:
            raise InvalidInput(
                f"no fault effect is named {self.effect!r}: use one of {', '.join(EFFECTS)}"
            )
        if self.key is not None and not isinstance(self.key, str):
            raise InvalidInput(
                f"key is a part of the keys to fault (a str) or None, not {self.key!r}"
            )
        if not isinstance(self.times, int) or isinstance(self.times, bool) or self.times < 1:
            raise InvalidInput(f"times is how many calls to fault: 1 or more, not {self.times!r}")
        if self.effect == "cut" and self.op != "open":
            raise InvalidInput(
                f'a "cut" fault breaks a read stream: use op="open", not {self.op!r}'
            )
        if self.effect in DAMAGES and self.op not in ("put", "upload_part"):
            raise InvalidInput(
                f'a "{self.effect}" fault damages a body sent: use op="put" or '
                f'op="upload_part", not {self.op!r}'
            )

    def matches(self, op: str, key: str) -> bool:
        return (self.op is None or self.op == op) and (self.key is None or self.key in key)


@dataclass
class Faults:
    """The faults planned for one ``FaultyStore``, and hooks called before every call.

    A hook receives ``(op, key)`` and may raise (a fault of its own) or block (a stall);
    ``calls`` counts every call by its name.
    """

    planned: list[Fault] = field(default_factory=list)
    hooks: list[Callable[[str, str], None]] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(
        self, op: str | None = None, key: str | None = None, effect: Effect = "fail", times: int = 1
    ) -> Fault:
        fault = Fault(op, key, effect, times)
        with self._lock:
            self.planned.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.planned.clear()
            self.hooks.clear()

    def take(self, op: str, key: str) -> Effect | None:
        """Count the call and take the first planned fault it matches, if any."""
        with self._lock:
            self.calls[op] += 1
            for fault in self.planned:
                if fault.times > 0 and fault.matches(op, key):
                    fault.times -= 1
                    return fault.effect
        return None


def arrived(data: bytes, effect: Effect | None) -> bytes:
    """The body as it arrives under ``effect``: damaged, or as it was sent."""
    if effect == "truncate":
        return data[: len(data) // 2]
    if effect == "flip" and data:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
    return data


class CutStream:
    """A stream whose connection breaks after the first half of ``data`` (a ``cut`` fault)."""

    def __init__(self, data: bytes, where: str) -> None:
        self._data = data
        self._cut = len(data) // 2
        self._pos = 0
        self._where = where

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        if self._pos >= self._cut or size < 0:
            raise ReadBrokeOff(
                f"reading {self._where} broke off after {self._cut} of {len(self._data)} "
                "bytes (injected)"
            )
        end = min(self._pos + size, self._cut)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def close(self) -> None:
        self._pos = self._cut


def _read_all(stream: ByteStream) -> bytes:
    try:
        return stream.read()
    finally:
        stream.close()


class FaultyStore(Writes):
    """``inner`` with ``faults``: every call goes through the hooks and the planned faults,
    then to ``inner`` (or not: ``fail``)."""

    def __init__(self, inner: ObjectStore, faults: Faults | None = None) -> None:
        self.inner = inner
        self.faults = faults if faults is not None else Faults()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @property
    def runtime(self) -> Runtime:
        return self.inner.runtime

    @runtime.setter
    def runtime(self, runtime: Runtime) -> None:
        self.inner.runtime = runtime

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def connections(self) -> int:
        return self.inner.connections

    def describe(self, key: str) -> str:
        return self.inner.describe(key)

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under ``prefix`` (through the faults of ``list``)."""
        return list_keys(self, prefix)

    def _enter(self, op: str, key: str) -> Effect | None:
        for hook in list(self.faults.hooks):
            hook(op, key)
        effect = self.faults.take(op, key)
        if effect == "fail":
            raise StoreError(f"could not {op} {self.describe(key)}: injected fault")
        return effect

    def _answer_lost(self, op: str, key: str) -> Exception:
        if op in UNKNOWN_WHEN_LOST:
            return OutcomeUnknown(f"{self.describe(key)}: answer lost (injected)")
        return StoreError(f"could not {op} {self.describe(key)}: answer lost (injected)")

    def _read_lost(self, op: str, key: str, read: Callable[[], object]) -> Exception:
        """A read that reached the store, and whose answer (the object, or that there is
        none) never came back."""
        with contextlib.suppress(NoSuchObject):
            read()
        return self._answer_lost(op, key)

    def _read(self, op: str, key: str, read: Callable[[], T]) -> T:
        """A read of ``inner`` under the faults planned for ``op``."""
        if self._enter(op, key) == "lose":
            raise self._read_lost(op, key, read)
        return read()

    def _applied(self, op: str, key: str, call: Callable[[Effect | None], T]) -> T:
        """A call of ``inner`` (given the planned effect) that applies even when its answer
        is lost."""
        effect = self._enter(op, key)
        answer = call(effect)
        if effect == "lose":
            raise self._answer_lost(op, key)
        return answer

    def _listed(self, op: str, prefix: str, rows: Callable[[], Iterator[T]]) -> Iterator[T]:
        """A listing of ``inner``, read through to its end even when its answer is lost."""
        effect = self._enter(op, prefix)
        listed = rows()
        if effect == "lose":
            for _ in listed:
                pass
            raise self._answer_lost(op, prefix)
        yield from listed

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        return self._read("get", key, lambda: self.inner.get(key, if_none_match))

    def head(self, key: str) -> Head:
        return self._read("head", key, lambda: self.inner.head(key))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> ByteStream:
        effect = self._enter("open", key)
        if effect == "lose":
            raise self._read_lost("open", key, lambda: self.inner.open(key, byte_range).close())
        stream = self.inner.open(key, byte_range)
        if effect == "cut":
            return CutStream(_read_all(stream), self.describe(key))
        return stream

    def write(self, put: Put) -> str:
        data = put.data()
        key = put.key

        def send(effect: Effect | None) -> str:
            if effect in DAMAGES and arrived(data, effect) != data:
                # What a store does when the body's MD5 is not its Content-MD5: nothing is
                # stored, and the store layer sends the body again.
                raise BodyDamaged(f"{self.describe(key)}: BadDigest (injected)")
            return self.inner.put(
                key, data, mode=put.mode, metadata=put.metadata, content_type=put.content_type
            )

        return send_whole(lambda: self._applied("put", key, send), self.runtime, self.describe(key))

    def delete(self, key: str) -> None:
        self._applied("delete", key, lambda _: self.inner.delete(key))

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        return self._listed("list", prefix, lambda: self.inner.list(prefix, delimiter))

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        return self._applied("create_upload", key, lambda _: self.inner.create_upload(key))

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        sent = read_whole(body)
        return self._applied(
            "upload_part",
            key,
            lambda effect: self.inner.upload_part(key, upload_id, number, arrived(sent, effect)),
        )

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        return self._applied("list_parts", key, lambda _: self.inner.list_parts(key, upload_id))

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        self._applied(
            "complete_upload",
            key,
            lambda _: self.inner.complete_upload(key, upload_id, etags, mode),
        )

    def abort_upload(self, key: str, upload_id: str) -> bool:
        return self._applied("abort_upload", key, lambda _: self.inner.abort_upload(key, upload_id))

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        return self._listed("list_uploads", prefix, lambda: self.inner.list_uploads(prefix))

    # -- versions (``Versioned``): a store that keeps none answers None -------------------

    def versions(self, key: str) -> Iterator[Version] | None:
        effect = self._enter("versions", key)
        kept = versions_of(self.inner, key)
        if effect == "lose":
            for _ in kept or ():
                pass
            raise self._answer_lost("versions", key)
        return kept

    def get_version(self, key: str, version_id: str) -> Blob:
        effect = self._enter("get_version", key)
        inner = self.inner
        if not isinstance(inner, Versioned):
            raise NoSuchObject(f"{self.describe(key)} (version {version_id})")
        if effect == "lose":
            raise self._read_lost("get_version", key, lambda: inner.get_version(key, version_id))
        return inner.get_version(key, version_id)

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.inner.now()
