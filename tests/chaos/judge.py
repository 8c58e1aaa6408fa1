"""The end state of a chaos run judged against the agents' operation logs.

``judge`` reads the store directly (not through the proxy): every shard, the journal of
every entry (``task.history``) and the data a finished entry points at, and holds them to
what the agents believe they did (their logs, ``tests/chaos/agent.py``). Each invariant is
named in the report; a violation says which entry broke it and how.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import objmanifest as om
from objmanifest import checksum
from tests.chaos.agent import settled


@dataclass
class Verdict:
    invariants: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def check(self, name: str, problems: list[str]) -> None:
        self.invariants.append(name)
        self.violations += [f"{name}: {p}" for p in problems]


def _ok(records: list[dict[str, Any]], op: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("op") == op and r.get("ok")]


def judge(
    task: om.Task, records: list[dict[str, Any]], exits: dict[str, list[int]], finished: bool
) -> Verdict:
    """Every invariant of a run's end state (see the module's docstring)."""
    v = Verdict()
    entries = {e.file_id: e for e in task.entries()}
    history = {f: task.history(f) for f in entries}
    ready_sums: dict[str, set[str]] = defaultdict(set)
    for f, steps in history.items():
        for t in steps:
            if t.to_state == om.State.ready.value and t.from_state == om.State.writing.value:
                ready_sums[f].add(t.checksum or "")

    v.check(
        "agents raise only the library's documented errors (om.ObjManifestError)",
        [
            f"{r['agent']}: {r['op']} raised {r['error']}: {r['message']}\n{r.get('trace')}"
            for r in records
            if r.get("outcome") == "unexpected"
        ],
    )
    v.check(
        "every agent process exits cleanly (or by the harness's SIGTERM)",
        [f"{name} exited {codes}" for name, codes in exits.items() if set(codes) - {0, -15}],
    )
    v.check(
        "the pipeline finishes once the faults stop",
        [] if finished and settled(list(entries.values())) else [_unsettled(entries)],
    )

    claimed: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in _ok(records, "claim"):
        claimed[(r["file_id"], r["epoch"])].add(r["agent"])
    v.check(
        "no two agents hold one epoch of an entry",
        [f"{f} epoch {e}: {sorted(a)}" for (f, e), a in claimed.items() if len(a) > 1],
    )

    problems = []
    for entry in entries.values():
        if entry.state in (om.State.ready, om.State.consumed):
            problems += _holders_bytes(task, entry)
    v.check(
        "a finished entry's object holds exactly the bytes of the holder that made it", problems
    )

    problems = []
    for r in _ok(records, "put"):
        f, epoch, agent = r["file_id"], r["epoch"], r["agent"]
        landed = [
            t
            for t in history.get(f, [])
            if t.to_state == om.State.ready.value and t.epoch == epoch and t.actor == agent
        ]
        if not landed:
            problems.append(f"{agent}'s put of {f} at epoch {epoch} is in no version")
        elif r["checksum"] != r["data_checksum"] or landed[-1].checksum != r["checksum"]:
            problems.append(f"{f} epoch {epoch}: recorded {landed[-1].checksum}, sent {r}")
        entry = entries.get(f)
        if entry is not None and entry.epoch == epoch and entry.checksum != r["checksum"]:
            problems.append(f"{f} epoch {epoch}: ends with {entry.checksum}, put {r['checksum']}")
    v.check("no acknowledged put is missing or changed", problems)

    v.check(
        "every consumed byte matched a checksum its entry was made ready with",
        [
            f"{r['agent']} consumed {r['file_id']} as {r['checksum']}, "
            f"made ready as {sorted(ready_sums[r['file_id']])}"
            for r in _ok(records, "consume")
            if r["checksum"] not in ready_sums[r["file_id"]]
        ],
    )

    problems = []
    for f, steps in history.items():
        holders: dict[int, str] = {}
        for t in steps:
            if t.command in ("claim", "claim_any", "takeover") or (
                t.from_state != om.State.writing.value and t.to_state == om.State.writing.value
            ):
                holders[t.epoch or 0] = t.actor
            elif t.from_state == om.State.writing.value and t.command in ("finish", "fail"):
                latest = max(holders, default=0)
                if t.epoch != latest or holders.get(latest) != t.actor:
                    problems.append(f"{f}: {t.command} by {t.actor} at epoch {t.epoch}")
    v.check("a fenced holder never finished or failed an entry (the journal)", problems)

    v.check("drafts and verdicts name inputs as they were made ready", _contents(task, entries))
    return v


def _read(task: om.Task, key: str) -> bytes:
    blob = task.store.get(key)
    assert blob is not None  # no If-None-Match given
    return blob.body


def _unsettled(entries: dict[str, om.Entry]) -> str:
    left = [f"{f} {e.state.value}" for f, e in sorted(entries.items()) if e.state.value != "ready"]
    return "not finished: " + ", ".join(left[:20])


def _holders_bytes(task: om.Task, entry: om.Entry) -> list[str]:
    assert entry.key is not None
    try:
        data = _read(task, entry.key)
    except om.ObjManifestError as e:
        return [f"{entry.file_id}: its object {entry.key} cannot be read: {e}"]
    problems = []
    if checksum.of_bytes(data) != entry.checksum:
        problems.append(f"{entry.file_id}: {entry.key} does not match {entry.checksum}")
    try:
        record = json.loads(data)
    except ValueError:
        return [*problems, f"{entry.file_id}: {entry.key} is not a record"]
    who = (record.get("file_id"), record.get("agent"), record.get("epoch"))
    if who != (entry.file_id, entry.owner, entry.epoch):
        problems.append(
            f"{entry.file_id}: written by {who}, entry says {entry.owner}@{entry.epoch}"
        )
    return problems


def _contents(task: om.Task, entries: dict[str, om.Entry]) -> list[str]:
    problems = []
    for f, entry in entries.items():
        if entry.stage == "collect" or entry.state not in (om.State.ready, om.State.consumed):
            continue
        assert entry.key is not None
        record = json.loads(_read(task, entry.key))
        if entry.stage == "write":
            if sorted(record["inputs"]) != sorted(entry.depends_on):
                problems.append(f"{f} names inputs {sorted(record['inputs'])}")
            for dep, digest in record["inputs"].items():
                made = {t.checksum for t in task.history(dep) if t.to_state == "ready"}
                if digest != checksum.of_bytes(_read(task, entries[dep].key or "")) and (
                    digest not in made
                ):
                    problems.append(f"{f} read {dep} as {digest}, never made ready so")
        else:
            if not record.get("ok"):
                problems.append(f"{f}: its checker found its draft wrong: {record}")
    return problems
