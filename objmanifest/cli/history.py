"""The journal from the command line: ``log`` (with ``--since``, ``--by``, ``-f``),
``lineage``, ``migrate`` and ``trim``."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import objmanifest as om
from objmanifest.journal.history import record_dict, transitions_of

from ..cas.policy import Codec
from ..engine.settings import check_retention
from ..wire.errors import UsageError
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
        now = task.store.now()
        try:
            return now - timedelta(seconds=amount)
        except OverflowError:  # before year 1 (or no number at all: inf)
            most = (now - datetime.min.replace(tzinfo=timezone.utc)).days
            raise UsageError(
                f"--since {text!r} reaches back past year 1: give a duration of at most "
                f"{most}d, or a time (2030-01-01T12:00:00Z)"
            ) from None
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
    stage: str | None = ctx.opt("stage")
    since = since_time(task, ctx.opt("since"))
    agent: str | None = ctx.opt("by")
    if file_id is not None:
        stage = task.stage_of(file_id)
        shard = task.layout.shard_of(stage, file_id)
        objects: list[tuple[str, Codec[Any]]] = [(task.layout.shard(shard), task.codec(shard))]
    else:
        if stage is not None:
            task.check_stage(stage)  # NotFound, naming the stages, for a stage the task lacks
        objects = task.journal.of_stage(task.journaled_objects(), stage)
    stage_of = task.stage_namer() if file_id is None else None
    records = task.journal.log(
        since=since,
        agent=agent,
        objects=objects,
        stage=stage if file_id is None else None,
        stage_of=stage_of,
    )
    dropped = [d for key, _ in objects for d in task.journal.dropped(key)]
    said = [d.line() for d in dropped]
    if not ctx.opt("follow"):
        gone = [d.to_dict() for d in dropped]
        journaled, chosen = (
            task.schema_version >= 2,
            [
                f"{flag} {value}"
                for flag, value in (
                    ("--stage", ctx.opt("stage") if file_id is None else None),
                    ("--by", agent),
                    ("--since", ctx.opt("since")),
                )
                if value is not None
            ],
        )
        if file_id is not None:
            steps = transitions_of(file_id, records)
            ctx.out.result(
                {"file_id": file_id, "history": [t.to_dict() for t in steps], "dropped": gone},
                *said,
                *history_view(
                    file_id, steps, journaled=journaled, filters=chosen, dropped=bool(dropped)
                ),
            )
        else:
            records_json = [record_dict(r) for r in records]
            ctx.out.result(
                {"records": records_json, "dropped": gone},
                *said,
                *log_view(records, journaled=journaled, filters=chosen, dropped=bool(dropped)),
            )
        return 0
    for line in said:
        ctx.out.note(line)
    seen: dict[str, int] = {}
    for record in records:
        if record.object_key is not None:
            seen[record.object_key] = max(seen.get(record.object_key, 0), record.version)
    interval = float(ctx.opt("interval", 2.0))
    while True:
        for record in records:
            if agent is not None and record.actor != agent:
                continue
            _print_record(ctx, record, file_id)
        time.sleep(interval)
        if file_id is None:  # new upload states appear
            objects = task.journal.of_stage(task.journaled_objects(), stage)
        records = task.journal.narrowed(task.journal.newer(seen, objects), stage, stage_of)


def _print_record(ctx: Context, record: om.JournalRecord, file_id: str | None) -> None:
    """One followed record: a JSON line with ``--json``, else a line of text."""
    if file_id is not None:
        for step in transitions_of(file_id, [record]):
            if ctx.out.json_mode:
                ctx.out.json_line(step.to_dict())
            else:
                ctx.out.line(transition_line(step))
        return
    if ctx.out.json_mode:
        ctx.out.json_line(record_dict(record))
    else:
        ctx.out.line(record_line(record))


def cmd_lineage(ctx: Context) -> int:
    graph = ctx.task().lineage(ctx.args.file_id)
    ctx.out.result(graph.to_dict(), lineage_view(graph))
    return 0


def cmd_migrate(ctx: Context) -> int:
    task = ctx.task()
    moved = task.migrate()
    line = (
        f"moved task {task.task_id!r} to schema {task.schema_version}: {len(moved)} object(s)"
        if moved
        else f"task {task.task_id!r} is at schema {task.schema_version} already"
    )
    ctx.out.result({"schema_version": task.schema_version, "moved": moved}, line)
    return 0


def cmd_trim(ctx: Context) -> int:
    """Drop the journal blocks beyond the task's retention (or the options'), and say what."""
    task = ctx.task()
    seconds, versions = ctx.opt("keep_seconds"), ctx.opt("keep_versions")
    check_retention(seconds, versions)
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
