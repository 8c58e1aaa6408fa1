"""The end state of a chaos run judged against the agents' operation logs.

``judge`` reads the store directly (not through the proxy) and holds it to what the agents
believe they did (their logs, ``tests/chaos/agent.py``): first the invariants of
``tests/support/checker.py`` (the journal and shards against the operations), then the pipeline's
own (only documented errors, clean exits, the pipeline finishes, a finished entry's object
holds its holder's bytes, drafts and verdicts name their inputs as they were made ready).
Each invariant is named in the report; a violation says which entry broke it and how.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.store.errors import NoSuchObject
from tests.chaos.agent import big_payload, is_big, settled
from tests.support import checker


@dataclass
class Verdict:
    invariants: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def check(self, name: str, problems: list[str]) -> None:
        self.invariants.append(name)
        self.violations += [f"{name}: {p}" for p in problems]


def operations(lines: list[dict[str, Any]]) -> tuple[checker.OpLog, Counter[str]]:
    """The checker's operations from the agents' intents and outcomes (see
    ``agent.OpLog``), and the outcomes counted (``op outcome``: ``claim ok`` ...)."""
    intents = {(r["pid"], r["intent"]): r for r in lines if "intent" in r}
    outcomes = {(r["pid"], r["of"]): r for r in lines if "of" in r}
    log = checker.OpLog()
    counts: Counter[str] = Counter()
    for key, intent in intents.items():
        op, agent = intent["op"], intent["agent"]
        out = outcomes.get(key)
        outcome = out["outcome"] if out else "killed"
        counts[f"{op} {outcome}"] += 1
        told = {"ok": checker.OK, "refused": checker.REFUSED}.get(outcome, checker.UNKNOWN)
        if op == "claim":
            if told == checker.OK:
                for c in out["claims"] if out else []:
                    log.record(agent, checker.CLAIM, file_id=c["file_id"], epoch=c["epoch"])
            elif told == checker.UNKNOWN:  # which entries it took, if any, is unknown
                log.record(agent, checker.CLAIM_MANY, checker.UNKNOWN, stage=intent["stage"])
        elif op in ("renew", "fail", "release", "put"):
            fields = {"file_id": intent["file_id"], "epoch": intent["epoch"]}
            if told == checker.OK and op == "put":
                fields["checksum"] = out["checksum"] if out else None
            log.record(agent, op, told, **fields)
        elif op == "put_many":
            results = out["results"] if told == checker.OK and out else []
            for i, c in enumerate(intent["claims"]):
                r = results[i] if i < len(results) else {}
                one = checker.OK if "checksum" in r else checker.UNKNOWN
                if r.get("refused"):
                    one = checker.REFUSED
                log.record(
                    agent,
                    checker.PUT,
                    one,
                    file_id=c["file_id"],
                    epoch=c["epoch"],
                    checksum=r.get("checksum"),
                )
        elif op == "consume":
            log.record(
                agent,
                checker.CONSUME,
                told,
                file_id=intent["file_id"],
                checksum=out.get("checksum") if out else None,
                role=intent["role"],
            )
    return log, counts


def judge(
    task: om.Task,
    lines: list[dict[str, Any]],
    exits: dict[str, list[int]],
    finished: bool,
    extra: checker.OpLog | None = None,
) -> tuple[Verdict, Counter[str]]:
    """Every invariant of a run's end state (see the module's docstring), and the
    operations' outcomes counted. ``extra``: operations of the harness's own."""
    v = Verdict()
    oplog, counts = operations(lines)
    for op in extra or ():
        oplog.append(op)
        counts[f"{op.kind} {op.outcome}"] += 1
    found = checker.check(task, oplog, settled=finished)
    for invariant in checker.INVARIANTS:
        v.check(
            f"checker: {invariant}",
            [str(x) for x in found if x.invariant == invariant],
        )
    v.violations += [str(x) for x in found if x.invariant not in checker.INVARIANTS]

    entries = {e.file_id: e for e in task.entries()}
    v.check(
        "agents raise only the library's documented errors (om.ObjManifestError)",
        [
            f"{r['agent']}: {r['op']} raised {r['error']}: {r['message']}\n{r.get('trace')}"
            for r in lines
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
    problems = []
    for entry in entries.values():
        if entry.state in (om.State.ready, om.State.consumed):
            problems += _holders_bytes(task, entry)
    v.check("a finished entry's object holds exactly its holder's bytes", problems)
    v.check(
        "drafts and verdicts name their inputs as they were made ready", _contents(task, entries)
    )
    return v, counts


def _read(task: om.Task, key: str) -> bytes:
    blob = task.store.get(key)
    assert blob is not None  # no If-None-Match given
    return blob.body


def _unsettled(entries: dict[str, om.Entry]) -> str:
    left = [
        f"{f} {e.state.value}"
        for f, e in sorted(entries.items())
        if e.state.value not in ("consumed", "dead")
    ]
    return "not finished: " + ", ".join(left[:20])


def _holders_bytes(task: om.Task, entry: om.Entry) -> list[str]:
    assert entry.key is not None
    try:
        data = _read(task, entry.key)
    except (NoSuchObject, om.ObjManifestError) as e:
        return [f"{entry.file_id}: its object {entry.key} cannot be read: {e}"]
    if is_big(entry.file_id):  # the same bytes whoever produced them
        whole = entry.whole_checksum if entry.is_chunked else entry.checksum
        if not entry.is_chunked:
            return [f"{entry.file_id}: a big record is not a chunked entry"]
        if data != big_payload(entry.file_id):
            return [f"{entry.file_id}: {entry.key} does not hold its bytes"]
        if checksum.of_bytes(data) != whole:
            return [f"{entry.file_id}: {entry.key} does not match {whole}"]
        return []
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
