"""The journal from the command line: ``log`` (with ``--since``, ``--by``, ``-f``),
``lineage``, ``migrate`` and ``trim``."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

import objmanifest as om

from ..core.ages import AGE_RULE, MAX_AGE_DAYS, age_problem
from ..wire.errors import UsageError
from ..wire.shapes import record_json
from .context import Context
from .render import (
    history_view,
    lineage_view,
    log_view,
    record_line,
    transition_line,
)


def since_time(task: om.Task, text: str | None) -> datetime | None:
    """``--since``: an ISO 8601 time, or a duration before the store's now (``90s``,
    ``10m``, ``2h``, ``1d``)."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if match:
        amount = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
        if age_problem(amount) is not None:
            raise UsageError(
                f"--since {text!r} reaches back more than 1000 years: give a duration of at "
                f"most {MAX_AGE_DAYS}d ({AGE_RULE}), or a time (2030-01-01T12:00:00Z)"
            )
        return task.store.now() - timedelta(seconds=amount)
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since {text!r} is neither a time (2030-01-01T12:00:00Z) nor a duration "
            "(90s, 10m, 2h, 1d)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])?\s*$", re.IGNORECASE)


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def cmd_log(ctx: Context) -> int:
    """The task's journal, or one entry's transitions; ``--follow`` keeps printing what
    is committed from then on (Ctrl-C stops it)."""
    task = ctx.task()
    file_id: str | None = ctx.opt("file_id")
    stage: str | None = ctx.opt("stage") if file_id is None else None
    since = since_time(task, ctx.opt("since"))
    agent: str | None = ctx.opt("by")
    steps: list[om.Transition] = []
    records: list[om.JournalRecord] = []
    if file_id is not None:
        steps = [
            t
            for t in task.history(file_id)
            if (since is None or t.at >= since) and (agent is None or t.actor == agent)
        ]
        dropped = task.dropped(file_id)
    else:
        records = task.log(since, stage, agent)
        dropped = task.dropped(stage=stage)
    said = [d.line() for d in dropped]
    if not ctx.opt("follow"):
        gone = [d.to_dict() for d in dropped]
        journaled, chosen = (
            task.header.objects_schema >= 2,
            [
                f"{flag} {value}"
                for flag, value in (
                    ("--stage", stage),
                    ("--by", agent),
                    ("--since", ctx.opt("since")),
                )
                if value is not None
            ],
        )
        if file_id is not None:
            ctx.out.result(
                {"file_id": file_id, "history": [t.to_dict() for t in steps], "dropped": gone},
                *said,
                *history_view(
                    file_id, steps, journaled=journaled, filters=chosen, dropped=bool(dropped)
                ),
            )
        else:
            ctx.out.result(
                {"records": [record_json(r) for r in records], "dropped": gone},
                *said,
                *log_view(records, journaled=journaled, filters=chosen, dropped=bool(dropped)),
            )
        return 0
    for line in said:
        ctx.out.note(line)
    seen: dict[str, int] = {}
    done = [(r.object_key, r.version) for r in records] + [(t.object_key, t.version) for t in steps]
    for key, version in done:
        if key:
            seen[key] = max(seen.get(key, 0), version)
    interval = float(ctx.opt("interval", 2.0))
    while True:
        for step in steps:
            if agent is None or step.actor == agent:
                _print_step(ctx, step)
        for record in records:
            if agent is None or record.actor == agent:
                _print_record(ctx, record)
        time.sleep(interval)
        if file_id is not None:
            steps = task.history(file_id, after=seen)
        else:
            records = task.log(stage=stage, after=seen)


def _print_step(ctx: Context, step: om.Transition) -> None:
    """One followed transition of an entry: a JSON line with ``--json``, else a line."""
    if ctx.out.json_mode:
        ctx.out.json_line(step.to_dict())
    else:
        ctx.out.line(transition_line(step))


def _print_record(ctx: Context, record: om.JournalRecord) -> None:
    """One followed record: a JSON line with ``--json``, else a line of text."""
    if ctx.out.json_mode:
        ctx.out.json_line(record_json(record))
    else:
        ctx.out.line(record_line(record))


def cmd_lineage(ctx: Context) -> int:
    graph = ctx.task().lineage(ctx.args.file_id)
    ctx.out.result(graph.to_dict(), lineage_view(graph))
    return 0


def cmd_migrate(ctx: Context) -> int:
    task = ctx.task()
    moved = task.migrate()
    schema = task.header.objects_schema
    line = (
        f"moved task {task.task_id!r} to schema {schema}: {len(moved)} object(s)"
        if moved
        else f"task {task.task_id!r} is at schema {schema} already"
    )
    ctx.out.result({"schema_version": schema, "moved": moved}, line)
    return 0


def cmd_trim(ctx: Context) -> int:
    """Drop the journal blocks beyond the task's retention (or the options'), and say what."""
    task = ctx.task()
    seconds, versions = ctx.opt("keep_seconds"), ctx.opt("keep_versions")
    if seconds is None and versions is None:
        seconds, versions = task.header.journal_keep_seconds, task.header.journal_keep_versions
        if seconds is None and versions is None:
            raise UsageError(
                f"task {task.task_id!r} keeps its whole journal (it was made without "
                "--journal-keep-seconds or --journal-keep-versions): pass --keep-seconds or "
                "--keep-versions"
            )
    dry_run = bool(ctx.opt("dry_run"))
    dropped = task.trim_journal(seconds, versions, dry_run=dry_run)
    verb = "would drop" if dry_run else "dropped"
    lines = [
        f"{verb} versions {d.first}..{d.last} of {d.object_key} ({d.records} record(s))"
        for d in dropped
    ]
    total = sum(d.records for d in dropped)
    lines.append(f"{verb} {total} journal record(s) of task {task.task_id!r}")
    ctx.out.result(
        {"dry_run": dry_run, "dropped": [d.to_dict() for d in dropped], "records": total},
        *lines,
    )
    return 0
