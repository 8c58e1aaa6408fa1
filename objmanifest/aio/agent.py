"""``AsyncAgent``: the ``Agent`` API as coroutines; a put or consume that is cancelled
stops its thread at the next checkpoint, and a claim that landed unwanted is released."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import TypedDict, TypeVar, overload

from ..agent import Agent
from ..core.model import (
    Claim,
    Entry,
)
from ..data.sources import Source
from ..data.transfer import Progress
from ..errors import Interrupted, ObjManifestError
from .pool import Pool, Twin, forwarded, in_pool

if sys.version_info >= (3, 11):
    from typing import Unpack
else:
    from typing_extensions import Unpack

log = logging.getLogger("objmanifest.aio")

T = TypeVar("T")


class PutManyOptions(TypedDict, total=False):
    """The keyword arguments of ``Agent.put_many`` a coroutine passes on (not ``stop``)."""

    part_size: int | None
    concurrency: int | None
    threshold: int | None


class PutOptions(PutManyOptions, total=False):
    """The keyword arguments of ``Agent.put`` a coroutine passes on (not ``stop``)."""

    progress: Progress | None


class ConsumeOptions(TypedDict, total=False):
    """The keyword arguments of ``Agent.consume`` a coroutine passes on (not ``stop``)."""

    part_size: int | None
    concurrency: int | None
    progress: Progress | None
    parents: bool
    wait: float | None


class AsyncAgent(Twin[Agent]):
    """An ``Agent`` whose calls are coroutines, run in its task's pool (``task.agent``).

    Each coroutine takes the arguments of its ``Agent`` call (``put``, ``put_many`` and
    ``consume`` their keyword arguments as typed ``**options``) but ``stop``: cancelling it
    stops it. ``progress`` callbacks are called in the pool's threads.
    """

    def __init__(self, agent: Agent, pool: Pool) -> None:
        self.agent = agent
        self._pool = pool

    def __repr__(self) -> str:
        return f"Async{self.agent!r}"

    @property
    def _sync(self) -> Agent:
        return self.agent

    name = forwarded(Agent, lambda agent: agent.name)
    role = forwarded(Agent, lambda agent: agent.role)

    # -- claiming ----------------------------------------------------------------------

    async def claim(self, file_id: str | None = None, *, stage: str | None = None) -> Claim | None:
        """``Agent.claim``; cancelled after the claim landed, it is released."""
        return await self._pool.run(
            lambda: self.agent.claim(file_id, stage=stage), cancelled=self._release_landed
        )

    async def claim_many(self, stage: str, limit: int = 50) -> list[Claim]:
        """``Agent.claim_many``; cancelled after the claims landed, they are released."""
        return await self._pool.run(
            lambda: self.agent.claim_many(stage, limit), cancelled=self._release_landed
        )

    async def _release_landed(self, outcome: object) -> None:
        """Claims nobody will hold, released before the cancellation goes on."""
        landed = [outcome] if isinstance(outcome, Claim) else outcome
        if isinstance(landed, list):
            claims = [c for c in landed if isinstance(c, Claim)]
            for claim in claims:
                await self._pool.settle(functools.partial(self._release_quietly, claim))

    def _release_quietly(self, claim: Claim) -> None:
        try:
            self.agent.release(claim)
            log.info("released %r: its claim landed after the claim was cancelled", claim.file_id)
        except ObjManifestError as e:
            log.warning(
                "could not release %r, claimed after the claim was cancelled (it is free "
                "once its lease expires): %s",
                claim.file_id,
                e,
            )

    # -- holding -----------------------------------------------------------------------

    resume = in_pool(Agent.resume)

    async def resume_many(self, held: Iterable[tuple[str, int]]) -> list[Claim]:
        pairs = list(held)
        return await self._pool.run(lambda: self.agent.resume_many(pairs))

    renew = in_pool(Agent.renew)

    async def put(self, claim: Claim, data: Source, **options: Unpack[PutOptions]) -> Entry:
        """``Agent.put``. Cancelled, it stops before the ready commit (the entry stays
        writing under the claim), or, if the commit was sent, waits for its outcome."""
        return await self._stoppable(
            lambda stop: self.agent.put(claim, data, stop=stop, **options),
            lambda outcome: _report(f"put of {claim.file_id!r}", outcome),
        )

    async def put_many(
        self, claims: Iterable[Claim], datas: Iterable[Source], **options: Unpack[PutManyOptions]
    ) -> list[Entry | Exception]:
        """``Agent.put_many``. Cancelled, it stops before the ready commits (every entry
        stays writing under its claim), or, if they were sent, waits for their outcome."""
        batch = list(claims) if not isinstance(claims, Claim) else claims
        return await self._stoppable(
            lambda stop: self.agent.put_many(batch, datas, stop=stop, **options),
            lambda outcome: _report("put_many", outcome),
        )

    fail = in_pool(Agent.fail)
    release = in_pool(Agent.release)

    # -- consuming ---------------------------------------------------------------------

    @overload
    async def consume(
        self, file_id: str, dest: None = None, **options: Unpack[ConsumeOptions]
    ) -> bytes: ...
    @overload
    async def consume(
        self, file_id: str, dest: str | os.PathLike[str], **options: Unpack[ConsumeOptions]
    ) -> Entry: ...

    async def consume(
        self,
        file_id: str,
        dest: str | os.PathLike[str] | None = None,
        **options: Unpack[ConsumeOptions],
    ) -> bytes | Entry:
        """``Agent.consume`` (``wait``: look again until the entry is ready, for up to that
        many seconds). Cancelled, it stops before the data is put in place and marked
        (nothing at ``dest`` changes; a wait stops at its next look), or, if the mark was
        sent, waits for it."""
        return await self._stoppable(
            lambda stop: self.agent.consume(file_id, dest, stop=stop, **options),
            lambda outcome: _report(f"consume of {file_id!r}", outcome),
        )

    async def _stoppable(
        self,
        call: Callable[[threading.Event], T],
        cancelled: Callable[[T | BaseException], Awaitable[None]],
    ) -> T:
        """``call(stop)`` in the pool: cancelled, ``stop`` is set, so the call stops at its
        next checkpoint, and ``cancelled`` is told what it ended with."""
        stop = threading.Event()
        return await self._pool.run(lambda: call(stop), stop, cancelled)


async def _report(what: str, outcome: object) -> None:
    """What a cancelled transfer's thread ended with."""
    if isinstance(outcome, Interrupted):
        log.info("%s was cancelled and stopped before its commit: %s", what, outcome)
    elif isinstance(outcome, BaseException):
        log.info("%s was cancelled; its thread ended with %r", what, outcome)
    else:
        log.info("%s was cancelled after its commit was sent; the commit landed", what)
