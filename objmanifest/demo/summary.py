"""The summary of a run: as a JSON-ready dict, and as a few lines for a person."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TextIO

import objmanifest as om

from ..core.states import State
from . import display as d
from . import plan as p
from . import verify as v
from .agents import Pool
from .target import Settings, Target
from .worker import PART_SIZE


class Demo(Protocol):
    """What a summary reads of one run of the demo."""

    s: Settings
    target: Target
    pool: Pool
    task_id: str
    kill: v.Kill | None
    takeovers: list[dict[str, Any]]
    problems: list[str]

    def elapsed(self) -> float: ...


def _stat_total(demo: Demo, task: om.Task) -> dict[str, int]:
    total: dict[str, int] = task.request_counts()
    for pr in demo.pool.procs:
        for k, n in pr.stats.items():
            total[k] = total.get(k, 0) + int(n)
    return total


def _by_state(entries: dict[str, om.Entry]) -> dict[str, int]:
    return {s.value: sum(1 for e in entries.values() if e.state is s) for s in State}


def _large_file(task: om.Task, entries: dict[str, om.Entry]) -> dict[str, Any]:
    """The large artifact and how it was stored: as a chunked entry, in how many parts (its
    size over its part size: every store, not only those whose ETag counts the parts), or
    as a single object."""
    e = entries.get(p.ARCHIVE)
    info: dict[str, Any] = {"file_id": p.ARCHIVE, "size": e.size if e else None}
    parts = 1
    if e is not None and e.is_chunked and e.part_size and e.size:
        parts = -(-e.size // e.part_size)
    info.update(parts=parts, chunked=e is not None and e.is_chunked)
    return info


def build_summary(
    demo: Demo,
    task: om.Task,
    before: dict[str, om.Entry],
    after: dict[str, om.Entry],
    result: v.Audit,
    phases: dict[str, float],
) -> dict[str, Any]:
    stats = _stat_total(demo, task)
    procs = demo.pool.procs
    return {
        "ok": not demo.problems,
        "problems": demo.problems,
        "backend": demo.target.label,
        "endpoint_url": demo.target.endpoint_url,
        "url": demo.target.store.url,
        "task_id": demo.task_id,
        "settings": {
            "agents_per_stage": demo.s.agents,
            "files": demo.s.files,
            "big_mib": demo.s.big_mib,
            "lease_seconds": demo.s.lease,
            "part_size": PART_SIZE,
            "work_ms": demo.s.work_ms,
        },
        "entries": {
            "total": len(after),
            "states": _by_state(after),
            "by_stage": {
                s: _by_state({k: e for k, e in after.items() if e.stage == s}) for s in task.stages
            },
            "before_audit": _by_state(before),
        },
        "retries": sum(e.retry_count for e in after.values()),
        "takeovers": demo.takeovers,
        "killed": dataclasses.asdict(demo.kill) if demo.kill else None,
        "bytes": {
            "uploaded": sum(pr.bytes_up for pr in procs),
            "downloaded": sum(pr.bytes_down for pr in procs) + result.verified_bytes,
            "verified": result.verified_bytes,
            "large_file": _large_file(task, after),
        },
        "commits": stats.get("commits", 0),
        "conflicts": stats.get("conflicts", 0),
        "reads": stats.get("reads", 0),
        "not_modified": stats.get("not_modified", 0),
        "checksums": {"verified": result.verified, "mismatches": result.mismatches},
        "agents": [
            {
                "name": pr.name,
                "stage": pr.who.stage,
                "role": pr.who.role,
                "produced": pr.produced,
                "exit_code": pr.popen.returncode,
                "killed": pr.killed,
            }
            for pr in procs
        ],
        "elapsed_seconds": round(demo.elapsed(), 2),
        "kept": None,
        "phases": {k: round(x, 2) for k, x in phases.items()},
    }


def print_summary(summary: dict[str, Any], out: TextIO) -> None:
    """The summary for a person: a few aligned lines, then the verdict."""
    e, b = summary["entries"], summary["bytes"]
    states = ", ".join(f"{n} {s}" for s, n in e["states"].items() if n)
    stages = ", ".join(f"{s} {sum(c.values())}" for s, c in e["by_stage"].items())
    before = ", ".join(f"{n} {s}" for s, n in e["before_audit"].items() if n)
    big = b["large_file"]
    how = f"in {big['parts']} parts" if big["chunked"] else "as a single object"
    takeovers = (
        "; ".join(
            f"{t['file_id']} by {t['agent']} at epoch {t['epoch']}" for t in summary["takeovers"]
        )
        or "none"
    )
    killed = summary["killed"]
    through = f" at {summary['endpoint_url']}" if summary["endpoint_url"] else ""
    lines = [
        f"task        {summary['task_id']} on {summary['backend']} ({summary['url']}{through})",
        f"entries     {e['total']} ({stages}): {states} [before the audit: {before}]",
        "killed      "
        + (
            f"{killed['agent']} holding {killed['file_id']} (epoch "
            f"{killed['epoch']}) at {killed['at_seconds']}s"
            if killed
            else "none"
        ),
        f"takeovers   {len(summary['takeovers'])}: {takeovers}; retries {summary['retries']}",
        f"bytes       up {d.mib(b['uploaded'])}, down {d.mib(b['downloaded'])}; "
        f"{big['file_id']} {d.mib(big['size'])} stored {how}",
        f"commits     {summary['commits']} ({summary['conflicts']} conflicts retried), "
        f"{summary['reads']} reads ({summary['not_modified']} not modified)",
        f"checksums   {summary['checksums']['verified']} entries verified "
        f"({d.mib(b['verified'])}), {summary['checksums']['mismatches']} mismatches",
        f"elapsed     {summary['elapsed_seconds']}s ("
        + ", ".join(f"{k} {x}s" for k, x in summary["phases"].items())
        + ")",
    ]
    if summary.get("kept"):
        lines.append(f"kept        {summary['kept']}")
    print("\n".join(lines), file=out)
    if summary["ok"]:
        print(
            "OK: everything is consistent (states, checksums, dependencies, takeover)",
            file=out,
        )
    else:
        print(f"FAILED: {len(summary['problems'])} problem(s):", file=out)
        for problem in summary["problems"]:
            print(f"  - {problem}", file=out)
