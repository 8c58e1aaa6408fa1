"""Holding work across processes, and waiting for work that is not there yet.

A claim is a value (task, file, stage, agent, epoch), so a later process can rebuild it from
the agent name and epoch an earlier one printed. Rebuilding checks nothing: fencing stays in
the core, which refuses a stale epoch with ``LeaseLost`` on the holder's next change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import objmanifest as om
from objmanifest.model import Shard, check_file_id

T = TypeVar("T")

FIRST_DELAY = 0.2
MAX_DELAY = 2.0
GROWTH = 1.5


def held_claim(task: om.Task, file_id: str, agent: str, epoch: int) -> om.Claim:
    """The claim ``agent`` got at ``epoch``, as the process that claimed it held it.

    The stage comes from the task's index and the lease expiry from the entry; an entry
    that no longer has a lease gets the store's current time (its holder's next change will
    be refused anyway unless it is a repeat of a change that already landed).
    """
    entry = task.entry(file_id)
    expiry = entry.lease_expires_at or task.store.now()
    return om.Claim(
        task_id=task.task_id,
        file_id=file_id,
        stage=entry.stage,
        agent=agent,
        epoch=epoch,
        lease_expires_at=expiry,
    )


def held_claims(task: om.Task, held: list[tuple[str, int]], agent: str) -> list[om.Claim]:
    """``held_claim`` for each (file id, epoch) of a batch, reading the index and each shard
    once (a 304 each when nothing changed), not once per file."""
    index = task.index()
    shards: dict[str, Shard] = {}
    claims = []
    for file_id, epoch in held:
        stage = index.stage_of(check_file_id(file_id))
        if stage is None:
            raise om.NotFound(f"{file_id!r} is not declared in task {task.task_id!r}")
        shard = task.layout.shard_of(stage, file_id)
        if shard not in shards:
            shards[shard] = task.read_shard(shard)
        entry = shards[shard].entries.get(file_id)
        if entry is None:  # archived, or a declaration interrupted: as held_claim finds it
            claims.append(held_claim(task, file_id, agent, epoch))
            continue
        expiry = entry.lease_expires_at or task.store.now()
        claims.append(
            om.Claim(
                task_id=task.task_id,
                file_id=file_id,
                stage=stage,
                agent=agent,
                epoch=epoch,
                lease_expires_at=expiry,
                shard=shard,
            )
        )
    return claims


def poll(
    attempt: Callable[[], T | None],
    wait: float,
    retry_on: tuple[type[Exception], ...] = (),
    on_wait: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Call ``attempt`` until it returns something, for at most ``wait`` seconds.

    A ``retry_on`` error counts as "nothing yet"; after the deadline the last such error is
    raised again, or None returned. Delays grow from 0.2 s to 2 s, so a long wait costs a
    request every two seconds and a short one still answers quickly. ``on_wait`` is called
    once, before the first sleep, to tell a human that the command is waiting.
    """
    deadline = time.monotonic() + max(0.0, wait)
    delay = FIRST_DELAY
    while True:
        last: Exception | None = None
        try:
            result = attempt()
        except retry_on as e:
            last, result = e, None
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if last is not None:
                raise last
            return None
        if on_wait is not None:
            on_wait()
            on_wait = None
        sleep(min(delay, remaining))
        delay = min(delay * GROWTH, MAX_DELAY)
