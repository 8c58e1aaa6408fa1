"""The changes agents make to a shard's entries, as pure functions.

Each change is a pure function ``(shard, now, ...) -> (new shard | None, result)``. The CAS
loop (``cas.loop``) may apply one several times to fresher shards until its write wins, so
they read nothing but their arguments and change nothing outside. A new shard of ``None``
means "nothing to write". Refusals are raised as ``ObjManifestError``.

``core.commands`` names each change and its actor (``ClaimEntry``, ``Renew``, ``Finish``
...), so every commit is published as what it was; ``core.operator_changes`` holds the
operators' changes (release, revive, undeclare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import shard_index

from ..errors import (
    AlreadyConsumed,
    DataChanged,
    DataRemoved,
    DeclarationConflict,
    InvalidInput,
    LeaseLost,
    NotClaimable,
    NotFound,
    NotReady,
    ObjManifestError,
)
from . import leases
from .model import Archived, Claim, Declaration, Entry, Shard, Stored, declaration_digest
from .states import Event, State, next_state

Lookup = Callable[[str], "Entry | None"]
"""Finds a dependency's entry in any shard; None when it is not declared (yet)."""

Lookups = Callable[[Shard], Lookup]
"""Makes the look-up for one version of the shard being changed (its own entries come from
that version, other shards' from reads made before the commit)."""


@dataclass(frozen=True)
class Rules:
    """The task settings a change needs."""

    task_id: str
    lease_seconds: float
    max_retries: int
    retry_backoff: float = 0.0
    """Seconds a failed entry waits before its next claim, doubling per retry."""
    retry_backoff_max: float = 0.0
    """The longest such wait."""


def _update(entry: Entry, now: datetime, **fields: Any) -> Entry:
    return entry.replaced(**fields, updated_at=now)


def _entry(shard: Shard, file_id: str) -> Entry:
    entry = shard.entries.get(file_id)
    if entry is None:
        raise NotFound(f"{file_id!r} is not declared in shard {shard.stage!r}")
    return entry


def _failure(
    entry: Entry, event: Event, error: str, rules: Rules, now: datetime | None = None
) -> dict[str, Any]:
    """What one failure (``fail``, a takeover, an expired lease, bad data) changes: one
    retry more, the holder released, and the state the table gives: alive again (claimable
    once its backoff, if the task has one, has passed, counted from ``now``), or dead once
    the retries are spent. A takeover gives no ``now``: its taker claims the entry at once."""
    retries = entry.retry_count + 1
    state = next_state(entry.state, event, retry_count=retries, max_retries=rules.max_retries)
    retry = None
    if state is State.failed and now is not None:
        retry = leases.retry_at(now, retries, rules.retry_backoff, rules.retry_backoff_max)
    return {
        "state": state,
        "retry_count": retries,
        "error": error,
        "owner": None,
        "lease_expires_at": None,
        "retry_at": retry,
    }


def _expired_error(entry: Entry) -> str:
    return f"lease of {entry.owner} (epoch {entry.epoch}) expired"


# -- declare ---------------------------------------------------------------------------


def differences(entry: Entry, decl: Declaration) -> list[str]:
    """What a declaration says differently from the entry already there."""
    diffs = shard_index.differences(
        shard_index.Node(entry.stage, frozenset(entry.depends_on)),
        shard_index.Node(decl.stage, frozenset(decl.depends_on)),
    )
    old, new = set(entry.consumers), set(decl.consumers)
    if old != new:
        diffs.append(f"consumers: declared {sorted(old)}, now {sorted(new)}")
    return diffs


def declare(
    shard: Shard, now: datetime, decls: Iterable[Declaration]
) -> tuple[Shard | None, list[Entry]]:
    """Add entries; the same declaration again is a no-op, a different one a conflict."""
    added: dict[str, Entry] = {}
    result = []
    for decl in decls:
        existing = added.get(decl.file_id) or shard.entries.get(decl.file_id)
        if existing is not None:
            diffs = differences(existing, decl)
            if diffs:
                raise DeclarationConflict(
                    f"{decl.file_id!r} is already declared differently: {'; '.join(diffs)}. "
                    "Declare it as before, or use a new file id."
                )
            result.append(existing)
            continue
        archived = (shard.archived or {}).get(decl.file_id)
        if archived is not None:
            result.append(redeclared(decl, archived))
            continue
        entry = Entry(
            file_id=decl.file_id,
            stage=decl.stage,
            depends_on=decl.depends_on,
            consumers=decl.consumers,
            declared_at=now,
            updated_at=now,
        )
        added[decl.file_id] = entry
        result.append(entry)
    return (shard.with_entries(added) if added else None), result


def archived_stub(file_id: str, stage: str, archived: Archived) -> Entry:
    """An archived entry as the shard knows it (its state only): what dependency checks
    and re-declarations need, without reading its archive object."""
    return Entry(file_id=file_id, stage=stage, state=archived.state)


def redeclared(decl: Declaration, archived: Archived) -> Entry:
    """An archived id declared again: a no-op when identical, else ``DeclarationConflict``."""
    if archived.declared != declaration_digest(decl.stage, decl.depends_on, decl.consumers):
        raise DeclarationConflict(
            f"{decl.file_id!r} is already declared differently: it was archived as "
            f"{archived.state.value} (archive {archived.archive}) with other stage, "
            "dependencies or consumers. Declare it as before, or use a new file id."
        )
    return archived_stub(decl.file_id, decl.stage, archived)


# -- claim -----------------------------------------------------------------------------


def blockers(entry: Entry, lookup: Lookup) -> tuple[list[str], list[str]]:
    """(dependencies not yet ready, dead dependencies), each as readable strings."""
    waiting, dead = [], []
    for dep in entry.depends_on:
        found = lookup(dep)
        if found is None:
            waiting.append(f"{dep} (not declared)")
        elif found.state is State.dead:
            dead.append(dep)
        elif found.state not in (State.ready, State.consumed):
            waiting.append(f"{dep} ({found.state.value})")
    return waiting, dead


def failures(count: int) -> str:
    """``1 failure``, ``2 failures``."""
    return f"{count} failure{'' if count == 1 else 's'}"


def why_not_claimable(entry: Entry, now: datetime, lookup: Lookup) -> str | None:
    """None if the entry can be claimed now, else the reason in words."""
    if entry.state is State.writing and not leases.expired(entry, now):
        expiry = "?"
        if entry.lease_expires_at is not None:
            margin = leases.MARGIN.total_seconds()
            expiry = f"{entry.lease_expires_at.isoformat()} and {margin:g} s after it (a margin "
            expiry += "for the store's clock)"
        return f"state writing: held by {entry.owner} (epoch {entry.epoch}) until {expiry}"
    if entry.state is State.dead:
        return f"state dead after {failures(entry.retry_count)}; last error: {entry.error}"
    if entry.state in (State.ready, State.consumed):
        return f"state {entry.state.value}: already produced"
    if leases.backing_off(entry, now):
        assert entry.retry_at is not None
        return (
            f"backing off until {entry.retry_at.isoformat()} after "
            f"{failures(entry.retry_count)}; last error: {entry.error}"
        )
    waiting, dead = blockers(entry, lookup)
    if dead:
        return f"depends on dead entries: {', '.join(dead)}"
    if waiting:
        return f"waiting for dependencies: {', '.join(waiting)}"
    return None


def _take(entry: Entry, agent: str, now: datetime, rules: Rules) -> Entry:
    """Claim a claimable entry; a takeover of an expired lease counts one failure."""
    if entry.state is State.writing:
        fields = _failure(entry, Event.takeover, _expired_error(entry), rules)
        if fields["state"] is State.dead:
            return _update(entry, now, **fields)
    else:
        fields = {"state": next_state(entry.state, Event.claim)}
    lease = leases.expires_at(now, rules.lease_seconds)
    return _update(
        entry,
        now,
        **{
            **fields,
            "owner": agent,
            "epoch": entry.epoch + 1,
            "lease_expires_at": lease,
            "retry_at": None,
            "claimed_at": now,
        },
    )


def _claim_of(shard: Shard, entry: Entry, rules: Rules) -> Claim:
    assert entry.lease_expires_at is not None and entry.owner is not None
    return Claim(
        task_id=rules.task_id,
        file_id=entry.file_id,
        stage=entry.stage,
        agent=entry.owner,
        epoch=entry.epoch,
        lease_expires_at=entry.lease_expires_at,
        shard=shard.stage,
    )


def claim(
    shard: Shard, file_id: str, agent: str, now: datetime, rules: Rules, lookup: Lookup
) -> tuple[Shard | None, Claim | NotClaimable]:
    """Claim one entry. A takeover that exhausts the retries is written (dead) and refused."""
    entry = _entry(shard, file_id)
    reason = why_not_claimable(entry, now, lookup)
    if reason:
        raise NotClaimable(file_id, reason)
    taken = _take(entry, agent, now, rules)
    new = shard.with_entries({file_id: taken})
    if taken.state is State.dead:
        return new, NotClaimable(file_id, f"state dead after {failures(taken.retry_count)}")
    return new, _claim_of(new, taken, rules)


def claim_any(
    shard: Shard,
    agent: str,
    limit: int,
    now: datetime,
    rules: Rules,
    lookup: Lookup,
    stage: str | None = None,
) -> tuple[Shard | None, list[Claim]]:
    """Claim up to ``limit`` claimable entries (of ``stage`` only, when the shard holds
    several stages), oldest declared first, in one commit."""
    changed: dict[str, Entry] = {}
    taken_ok: list[Entry] = []
    for entry in shard.entries.values():
        if len(taken_ok) >= limit:
            break
        if stage is not None and entry.stage != stage:
            continue
        if why_not_claimable(entry, now, lookup) is not None:
            continue
        taken = _take(entry, agent, now, rules)
        changed[entry.file_id] = taken
        if taken.state is State.writing:
            taken_ok.append(taken)
    if not changed:
        return None, []
    new = shard.with_entries(changed)
    return new, [_claim_of(new, entry, rules) for entry in taken_ok]


# -- holder's changes --------------------------------------------------------------------


def _held(shard: Shard, claim: Claim) -> Entry:
    """The entry, if ``claim`` still holds it; else ``LeaseLost``, changing nothing."""
    entry = _entry(shard, claim.file_id)
    if entry.state is not State.writing or entry.epoch != claim.epoch or entry.owner != claim.agent:
        raise LeaseLost(
            f"lease on {claim.file_id!r} (epoch {claim.epoch}, agent {claim.agent}) is lost: "
            f"the entry is now {entry.state.value} at epoch {entry.epoch}"
            + (f", held by {entry.owner}" if entry.state is State.writing else "")
            + ". Stop working on it; claim it again if it is still wanted."
        )
    return entry


def renew(shard: Shard, claim: Claim, now: datetime, rules: Rules) -> tuple[Shard, Claim]:
    entry = _held(shard, claim)
    expiry = leases.expires_at(now, rules.lease_seconds)
    if entry.lease_expires_at is not None and entry.lease_expires_at > expiry:
        expiry = entry.lease_expires_at  # never move a lease backwards
    renewed = _update(entry, now, lease_expires_at=expiry)
    new = shard.with_entries({claim.file_id: renewed})
    return new, _claim_of(new, renewed, rules)


def finish(
    shard: Shard,
    claim: Claim,
    key: str,
    checksum: str,
    size: int,
    now: datetime,
    *,
    part_size: int | None = None,
    parts_key: str | None = None,
    whole_checksum: str | None = None,
) -> tuple[Shard | None, Entry]:
    """The holder's data is stored: the entry becomes ready. Repeating it is a no-op.

    ``part_size``, ``parts_key`` and ``whole_checksum`` are given for chunked data and
    cleared otherwise, so an entry produced again as a single object does not keep an
    earlier attempt's parts.
    """
    data = Stored(key, checksum, size, part_size, parts_key, whole_checksum)
    ready, changed = _made_ready(shard, claim, data, now)
    return (shard.with_entries({claim.file_id: ready}) if changed else None), ready


def _made_ready(shard: Shard, claim: Claim, data: Stored, now: datetime) -> tuple[Entry, bool]:
    """The entry ``finish`` makes of the claim's stored data, and whether it changed (a
    repeat of a finish that landed changes nothing); ``LeaseLost`` if the claim is fenced."""
    entry = _entry(shard, claim.file_id)
    stored = (
        data.key,
        data.checksum,
        data.size,
        data.part_size,
        data.parts_key,
        data.whole_checksum,
    )
    if (
        entry.state in (State.ready, State.consumed)
        and entry.epoch == claim.epoch
        and entry.owner == claim.agent
        and (
            entry.key,
            entry.checksum,
            entry.size,
            entry.part_size,
            entry.parts_key,
            entry.whole_checksum,
        )
        == stored
    ):
        return entry, False
    entry = _held(shard, claim)
    ready = _update(
        entry,
        now,
        state=next_state(entry.state, Event.finish),
        key=data.key,
        checksum=data.checksum,
        size=data.size,
        part_size=data.part_size,
        parts_key=data.parts_key,
        whole_checksum=data.whole_checksum,
        lease_expires_at=None,
        error=None,
        ready_at=now,
    )
    return ready, True


def finish_many(
    shard: Shard, finished: Sequence[tuple[Claim, Stored]], now: datetime
) -> tuple[Shard | None, list[Entry | ObjManifestError]]:
    """Several holders' data is stored: each entry becomes ready as ``finish`` would make
    it, each on its own, in one new shard. A claim ``finish`` refuses (fenced: ``LeaseLost``;
    no such entry: ``NotFound``) gets that refusal as its result and changes nothing; the
    others still become ready. Results are in the order of ``finished``. An entry named
    twice is refused for the whole batch (which of its data would win?)."""
    changed: dict[str, Entry] = {}
    results: list[Entry | ObjManifestError] = []
    seen: set[str] = set()
    for claim, data in finished:
        if claim.file_id in seen:
            raise InvalidInput(
                f"{claim.file_id!r} is finished twice in one batch: give each entry once"
            )
        seen.add(claim.file_id)
        try:
            ready, fresh = _made_ready(shard, claim, data, now)
        except (LeaseLost, NotFound) as e:
            results.append(e)
            continue
        if fresh:
            changed[claim.file_id] = ready
        results.append(ready)
    return (shard.with_entries(changed) if changed else None), results


def fail(
    shard: Shard, claim: Claim, reason: str, now: datetime, rules: Rules
) -> tuple[Shard, Entry]:
    entry = _held(shard, claim)
    failed = _update(entry, now, **_failure(entry, Event.fail, reason, rules, now))
    return shard.with_entries({claim.file_id: failed}), failed


# -- consumer's changes ------------------------------------------------------------------


def check_consumable(entry: Entry, consumer: str) -> bool:
    """Whether ``consumer`` may read the entry's data; True if it has consumed it before."""
    if entry.data_removed_at is not None:
        raise DataRemoved(
            f"{entry.file_id!r} was consumed and its data was removed by gc at "
            f"{entry.data_removed_at.isoformat()} (after its retention); its checksum "
            f"{entry.checksum} and history stay, produce it again under a new id if needed"
        )
    if consumer in entry.consumed_by and entry.state in (State.ready, State.consumed):
        return True
    if entry.state is State.consumed:
        raise AlreadyConsumed(
            f"{entry.file_id!r} was already consumed by {', '.join(entry.consumed_by)}"
        )
    if entry.state is not State.ready:
        raise NotReady(
            f"{entry.file_id!r} is {entry.state.value}, not ready"
            + (f" (last error: {entry.error})" if entry.error else ""),
            entry.state.value,
        )
    return False


def consume(
    shard: Shard, file_id: str, consumer: str, key: str, checksum: str, now: datetime
) -> tuple[Shard | None, Entry]:
    """Mark the entry consumed by ``consumer`` (an agent name for a queue, else a role)."""
    entry = _entry(shard, file_id)
    if (entry.key, entry.checksum) != (key, checksum):
        raise DataChanged(file_id)
    if check_consumable(entry, consumer):
        return None, entry
    marks = (*entry.consumed_by, consumer)
    done = entry.is_queue or set(entry.consumers) <= set(marks)
    state = next_state(entry.state, Event.consume, all_consumed=done)
    marked = _update(entry, now, state=state, consumed_by=marks)
    return shard.with_entries({file_id: marked}), marked


_NO_DATA: dict[str, Any] = {
    "key": None,
    "checksum": None,
    "size": None,
    "part_size": None,
    "parts_key": None,
    "consumed_by": (),
}
"""What bad data leaves behind: nothing. Marks made on it are void too, so every consumer
reads the data produced again."""


def mismatch(
    shard: Shard, file_id: str, key: str, checksum: str, detail: str, now: datetime, rules: Rules
) -> tuple[Shard | None, Entry]:
    """A consumer found bad data: produce it again (or give up once retries are spent)."""
    entry = _entry(shard, file_id)
    if entry.state is not State.ready or (entry.key, entry.checksum) != (key, checksum):
        return None, entry  # already handled, or produced again meanwhile
    fields = _failure(entry, Event.mismatch, detail, rules, now)
    # The producer's name stays: it says whose data was bad.
    failed = _update(entry, now, **{**fields, "owner": entry.owner, **_NO_DATA})
    return shard.with_entries({file_id: failed}), failed


# -- reaper ------------------------------------------------------------------------------


def reap(shard: Shard, now: datetime, rules: Rules) -> tuple[Shard | None, list[Entry]]:
    """Release every expired lease of the shard: failed, or dead once retries are spent."""
    changed = {
        entry.file_id: _update(
            entry, now, **_failure(entry, Event.expire, _expired_error(entry), rules, now)
        )
        for entry in shard.entries.values()
        if leases.expired(entry, now)
    }
    return (shard.with_entries(changed) if changed else None), list(changed.values())


# -- archive -----------------------------------------------------------------------------

TERMINAL = (State.consumed, State.dead)


def archive(
    shard: Shard, archive_id: str, entries: dict[str, Entry]
) -> tuple[Shard | None, list[str]]:
    """Move out of the shard the entries of archive object ``archive_id`` that the shard
    still holds exactly as written there (so still terminal and as old): anything changed
    since stays live, and the archive object's copy of it is never read."""
    moved = {
        fid: e for fid, e in entries.items() if e.state in TERMINAL and shard.entries.get(fid) == e
    }
    if not moved:
        return None, []
    refs = {
        fid: Archived(
            state=e.state,
            archive=archive_id,
            declared=declaration_digest(e.stage, e.depends_on, e.consumers),
        )
        for fid, e in moved.items()
    }
    live = {fid: e for fid, e in shard.entries.items() if fid not in moved}
    new = shard.model_copy(update={"entries": live, "archived": {**(shard.archived or {}), **refs}})
    return new, sorted(moved)


# -- the named commands the CAS loop commits ------------------------------------------------


# -- gc: the data of consumed entries past their retention ----------------------------------


def data_expired(entry: Entry, before: datetime) -> bool:
    """Whether gc may remove ``entry``'s data: consumed, its data still there, and last
    changed at or before ``before``."""
    return (
        entry.state is State.consumed
        and entry.key is not None
        and entry.data_removed_at is None
        and entry.updated_at is not None
        and entry.updated_at <= before
    )


def drop_data(
    shard: Shard, wanted: dict[str, str], before: datetime, now: datetime
) -> tuple[Shard | None, list[Entry]]:
    """Mark consumed entries whose data gc removes: each of ``wanted`` (file id -> the key
    gc saw) that is still consumed, still at that key and last changed at or before ``before``.
    The mark lands before the object goes, so a reader never finds it missing unmarked."""
    changed: dict[str, Entry] = {}
    for file_id, key in wanted.items():
        entry = shard.entries.get(file_id)
        if entry is None or entry.key != key or not data_expired(entry, before):
            continue
        changed[file_id] = entry.model_copy(update={"data_removed_at": now})
    if not changed:
        return None, []
    return shard.with_entries(changed), list(changed.values())


def drop_archived_data(
    shard: Shard, wanted: Iterable[str], now: datetime
) -> tuple[Shard | None, list[str]]:
    """Mark archived consumed entries whose data gc removes (the archive object, written
    once, keeps the entry; its shard's ``archived`` map says the data is gone). Each of
    ``wanted`` that is still archived as consumed, and not marked yet."""
    archived = dict(shard.archived or {})
    marked: list[str] = []
    for file_id in wanted:
        ref = archived.get(file_id)
        if ref is None or ref.state is not State.consumed or ref.data_removed_at is not None:
            continue
        archived[file_id] = ref.model_copy(update={"data_removed_at": now})
        marked.append(file_id)
    if not marked:
        return None, []
    return shard.model_copy(update={"archived": archived}), marked
