"""How an agent's data goes up and its entries become ready: one object or a chunked
upload per claim, a batch's uploads in parallel and one ready commit per shard, and what is
left of a fenced holder's write removed. ``Agent.put`` and ``Agent.put_many`` are built on
these."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from ..core import commands
from ..core.model import Claim, Entry, Stored
from ..data import chunked, sources, transfer
from ..errors import Interrupted, InvalidInput, LeaseLost, ObjManifestError
from .manifest import Manifest

log = logging.getLogger("objmanifest.agent")
"""The agent's log: what its puts report is logged where it always was."""


def check_batch(
    task: Manifest, agent: str, claims: Iterable[Claim], datas: Iterable[sources.Source]
) -> list[tuple[Claim, sources.Source]]:
    """The batch as pairs, or the error naming what to change."""
    if isinstance(claims, Claim):
        raise InvalidInput(
            "put_many() takes a list of claims, not one Claim: wrap it in a list ([...]), "
            "or call put() for one entry"
        )
    if isinstance(datas, (bytes, bytearray, memoryview, str, os.PathLike)) or callable(
        getattr(datas, "read", None)
    ):
        raise InvalidInput(
            f"put_many() takes a list of datas, one per claim, not one "
            f"{type(datas).__name__}: wrap it in a list ([...]), or call put() for one entry"
        )
    claims, datas = list(claims), list(datas)
    if len(claims) != len(datas):
        raise InvalidInput(
            f"put_many() got {len(claims)} claims and {len(datas)} datas: give one data "
            "per claim, in the same order"
        )
    first: dict[str, int] = {}
    for i, (claim, data) in enumerate(zip(claims, datas, strict=True)):
        if not isinstance(claim, Claim):
            raise TypeError(
                f"claims[{i}] is a {type(claim).__name__}, not a Claim: pass the claims "
                "claim() or claim_many() returned"
            )
        if claim.agent != agent or claim.task_id != task.task_id:
            raise InvalidInput(
                f"claims[{i}] on {claim.file_id!r} belongs to agent {claim.agent!r} of task "
                f"{claim.task_id!r}, not to {agent!r} of {task.task_id!r}: "
                f"call put_many() on the agent that claimed it"
            )
        if claim.file_id in first:
            raise InvalidInput(
                f"claims[{first[claim.file_id]}] and claims[{i}] are both on "
                f"{claim.file_id!r}: give each entry once per batch"
            )
        first[claim.file_id] = i
        sources.check_source(data, f"put_many() (datas[{i}], for {claim.file_id!r})")
    routed = [task.routed(claim) for claim in claims]
    return list(zip(routed, datas, strict=True))


def upload_many(
    task: Manifest,
    renew: Callable[[Claim], Claim],
    batch: list[tuple[Claim, sources.Source]],
    config: transfer.TransferConfig,
    explicit: bool,
    leases: Leases,
    interrupted: Callable[[], None],
    in_memory: bool = False,
) -> list[tuple[Claim, Stored | Exception]]:
    """Every claim's data stored, ``config.concurrency`` at a time (``in_memory``: as
    many as the store has connections, since holding them costs no more memory): where
    it landed, or the error that kept it from landing."""
    store = task.store
    wanted = store.connections if in_memory else config.concurrency
    workers = max(1, min(wanted, store.connections, len(batch)))
    one_upload = threading.Lock()  # one chunked upload at a time: memory as put()'s

    def one(claim: Claim, data: sources.Source) -> Stored | Exception:
        try:
            return store_data(
                task,
                claim,
                data,
                config,
                explicit,
                None,
                lambda: leases.lost(claim),
                one_upload,
                interrupted,
            )
        except (LeaseLost, Interrupted) as e:
            return e
        except ObjManifestError as e:
            try:
                raise_if_fenced(renew, claim, leases.lost(claim), e)
            except LeaseLost as lost:
                return lost
            return e
        except OSError as e:  # the data's file: missing, a directory, unreadable
            return e

    with store.runtime.pool(workers, "put-many") as pool:
        futures = [pool.submit(one, claim, data) for claim, data in batch]
        return [(claim, f.result()) for (claim, _), f in zip(batch, futures, strict=True)]


def finish_many(
    task: Manifest, agent: str, uploaded: list[tuple[Claim, Stored | Exception]]
) -> list[Entry | Exception]:
    """One ``finish_many`` commit per shard for the claims whose data is stored; a
    batch over several partitions commits them in parallel (each its own object, so
    they do not contend), one round trip for the batch rather than one per shard."""
    results: dict[int, Entry | Exception] = {}
    by_shard: dict[str, list[tuple[int, Claim, Stored]]] = {}
    for i, (claim, got) in enumerate(uploaded):
        if isinstance(got, Stored):
            by_shard.setdefault(claim.shard, []).append((i, claim, got))
        else:
            results[i] = got

    def finish(shard: str, items: list[tuple[int, Claim, Stored]]) -> list[Entry | Exception]:
        finished = tuple((claim, stored) for _, claim, stored in items)
        done: list[Entry | Exception]
        try:
            done = list(
                task.docs.commit(
                    task.layout.shard(shard),
                    task.codec(shard),
                    commands.FinishMany(finished, agent),
                )
            )
        except ObjManifestError as e:  # the shard's commit failed: each of its claims
            return [e] * len(items)
        for (_, _, stored), result in zip(items, done, strict=True):
            if isinstance(result, LeaseLost) and stored.parts_key is None:
                drop_fenced_object(task, stored.key)
        return done

    groups = list(by_shard.items())
    if len(groups) <= 1:
        outcomes = [finish(shard, items) for shard, items in groups]
    else:
        workers = max(1, min(len(groups), task.store.connections))
        with task.store.runtime.pool(workers, "finish-many") as pool:
            futures = [pool.submit(finish, shard, items) for shard, items in groups]
            outcomes = [f.result() for f in futures]
    for (_, items), done in zip(groups, outcomes, strict=True):
        for (i, _, _), result in zip(items, done, strict=True):
            results[i] = result
    return [results[i] for i in range(len(uploaded))]


def drop_fenced_object(task: Manifest, key: str) -> None:
    """A fenced holder's single object: no entry can ever point at its epoch's key."""
    try:
        task.store.delete(key)
    except ObjManifestError as e:
        log.warning("could not remove the fenced object %s: %s", task.store.describe(key), e)


def store_data(
    task: Manifest,
    claim: Claim,
    data: sources.Source,
    config: transfer.TransferConfig,
    explicit: bool,
    progress: transfer.Progress | None,
    lost: Callable[[], LeaseLost | None],
    one_upload: AbstractContextManager[object] | None = None,
    interrupted: Callable[[], None] = lambda: None,
) -> Stored:
    """One object for small data, a chunked upload for large data (inside ``one_upload``,
    which ``put_many`` uses to send one chunked entry at a time). ``lost`` says whether
    the lease is known to be lost, so a chunked upload stops early; ``interrupted``
    raises once the caller asked to stop (checked before the data and between parts)."""

    def stop() -> None:
        error = lost()
        if error is not None:
            raise error
        interrupted()

    with sources.open_source(data, config.threshold) as prepared:
        stop()
        if prepared.single is not None:
            key = task.layout.data(claim.stage, claim.file_id, claim.epoch)
            return transfer.upload(task.store, key, prepared.single)
        assert prepared.parts is not None
        with one_upload or contextlib.nullcontext():
            stored, stats = chunked.upload(
                task.uploads,
                claim,
                prepared.parts,
                config,
                explicit_part_size=explicit,
                progress=progress,
                stop=stop,
            )
        log.info("%s: %s", claim.file_id, stats)
        return stored


def raise_if_fenced(
    renew: Callable[[Claim], Claim], claim: Claim, lost: LeaseLost | None, error: Exception
) -> None:
    """A store error while the lease is lost is reported as the lost lease."""
    if lost is None:
        try:
            renew(claim)
        except LeaseLost as e:
            lost = e
        except ObjManifestError:
            return
    if lost is not None:
        raise lost from error


class Leases:
    """The leases of a ``put_many`` batch, renewed together in the background: each claim
    by its own commit, a lost one no more (``lost`` says which)."""

    def __init__(self, renew: Callable[[Claim], Claim], claims: list[Claim]) -> None:
        self._renew = renew
        self._claims = claims
        self._lost: dict[str, LeaseLost] = {}

    def renew(self) -> None:
        for claim in self._claims:
            if claim.file_id in self._lost:
                continue
            try:
                self._renew(claim)
            except LeaseLost as e:
                self._lost[claim.file_id] = e
            except ObjManifestError as e:  # a passing store fault: try again next round
                log.warning("renewing the lease on %r failed, will retry: %s", claim.file_id, e)

    def lost(self, claim: Claim) -> LeaseLost | None:
        return self._lost.get(claim.file_id)
