"""Is the finished demo consistent? The checks that decide its exit code.

``check_manifest`` is pure: it judges the final entries against the plan and the record of
the kill. ``audit`` reads every entry back as the ``auditor`` role (so every checksum is
verified while streaming) and checks each file's content and the chain of digests that
proves every file was made from finished dependencies.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import objmanifest as om

from ..core.model import Entry
from ..core.states import State
from . import plan as p

FINISHED = (State.ready, State.consumed)


@dataclass(frozen=True)
class Kill:
    """The agent the demo killed, and what it held at that moment."""

    agent: str
    file_id: str
    epoch: int
    at_seconds: float


def check_manifest(entries: Mapping[str, Entry], plan: p.Plan, kill: Kill | None) -> list[str]:
    """Everything wrong with the final manifest: states, dependencies and the takeover."""
    problems: list[str] = []
    expected = set(plan.all_ids)
    for fid in sorted(expected - set(entries)):
        problems.append(f"{fid} is missing from the manifest")
    for fid in sorted(set(entries) - expected):
        problems.append(f"{fid} is in the manifest but not in the plan")
    for fid in sorted(expected & set(entries)):
        problems += _entry_problems(entries[fid], plan)
    problems += _takeover_problems(entries, kill)
    return problems


def _entry_problems(e: Entry, plan: p.Plan) -> list[str]:
    problems = []
    if e.state not in FINISHED:
        why = f" ({e.error})" if e.error else ""
        problems.append(f"{e.file_id} ended {e.state.value}{why}, not ready or consumed")
    if set(e.depends_on) != set(plan.depends_on(e.file_id)):
        problems.append(
            f"{e.file_id} depends on {sorted(e.depends_on)}, the plan says "
            f"{sorted(plan.depends_on(e.file_id))}"
        )
    if e.state in FINISHED and (e.checksum is None or e.size is None or e.key is None):
        problems.append(f"{e.file_id} is {e.state.value} without a checksum, size and key")
    return problems


def _takeover_problems(entries: Mapping[str, Entry], kill: Kill | None) -> list[str]:
    if kill is None:
        return ["no agent was killed while holding a claim, so no takeover was shown"]
    e = entries.get(kill.file_id)
    if e is None:
        return []
    problems = []
    if e.owner == kill.agent:
        problems.append(f"{kill.file_id} was finished by {kill.agent}, the agent that was killed")
    if e.epoch <= kill.epoch:
        problems.append(
            f"{kill.file_id} is at epoch {e.epoch}, not above the killed holder's "
            f"epoch {kill.epoch}"
        )
    if e.retry_count < 1:
        problems.append(
            f"{kill.file_id} has retry_count {e.retry_count}: the takeover of an "
            "expired lease was not counted"
        )
    return problems


def check_all_consumed(entries: Mapping[str, Entry]) -> list[str]:
    """After the audit every role has read every entry."""
    return [
        f"{fid} is still {e.state.value} after the audit (consumed by "
        f"{', '.join(e.consumed_by) or 'nobody'})"
        for fid, e in sorted(entries.items())
        if e.state is not State.consumed
    ]


def snapshot(task: om.Task) -> dict[str, Entry]:
    """Every entry of the task, one fresh read per stage."""
    return {fid: e for stage in task.stages for fid, e in task.shard(stage).entries.items()}


@dataclass
class Audit:
    """What reading everything back found."""

    problems: list[str] = field(default_factory=list)
    verified: int = 0
    verified_bytes: int = 0
    mismatches: int = 0
    output_sha256: dict[str, str] = field(default_factory=dict)


def audit(task: om.Task, plan: p.Plan, big_size: int) -> Audit:
    """Consume every entry as the auditor, verifying checksums and content."""
    result = Audit()
    auditor = task.agent("auditor", role=p.AUDITOR)
    entries = snapshot(task)
    with tempfile.TemporaryDirectory(prefix="objmanifest-demo-audit-") as tmp:
        order = [*plan.parts, *plan.outputs, *plan.verdicts]
        for fid in order:
            entry = entries.get(fid)
            if entry is None:
                continue
            try:
                read = _read(auditor, fid, Path(tmp) / "file", result)
            except om.ChecksumMismatch as e:
                result.mismatches += 1
                result.problems.append(f"{fid}: checksum mismatch: {e}")
                continue
            except om.ObjManifestError as e:
                result.problems.append(f"{fid}: could not be read back: {e}")
                continue
            result.problems += _content_problems(entry, read, plan, big_size, result)
    return result


def _read(auditor: om.Agent, fid: str, path: Path, result: Audit) -> p.Inspected:
    """Stream one entry to a file (verified on the way), then digest it."""
    try:
        auditor.consume(fid, path)
        read = p.inspect_file(path)
        result.verified += 1
        result.verified_bytes += path.stat().st_size
        return read
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _content_problems(
    entry: Entry, read: p.Inspected, plan: p.Plan, big_size: int, result: Audit
) -> list[str]:
    fid = entry.file_id
    holder = (entry.owner, entry.epoch)
    if fid.startswith("raw/"):
        if read.file_sha256 != p.expected_input_digest(fid):
            return [f"{fid}: holds other bytes than the collector made"]
        return []
    if fid.startswith("out/"):
        result.output_sha256[fid] = read.file_sha256
        big = big_size if fid == p.ARCHIVE else None
        return p.check_output(fid, entry.depends_on, read, holder, big)
    checked = p.checked_by(fid)
    return p.check_verdict(fid, read, holder, result.output_sha256.get(checked))
