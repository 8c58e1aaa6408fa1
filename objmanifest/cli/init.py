"""``init``: a task created with its settings, or, with ``--exist-ok``, found with the same
ones (each other setting refused by name)."""

from __future__ import annotations

import argparse
import contextlib

import objmanifest as om

from ..core.layout import resolve_partitions
from ..core.model import TaskHeader
from ..core.settings import check_retention, check_settings, check_timing
from ..wire.errors import UsageError
from ..wire.shapes import jsonable
from .context import STAGES_ARROW, Context


def cmd_init(ctx: Context) -> int:
    """Create the task; with ``--exist-ok`` an identical existing task is success too (and
    is looked up first, so a rerun does not probe the store again)."""
    args = ctx.args
    check_settings(args.lease, args.retries)  # one rule and one message, before any request
    keep = check_retention(ctx.opt("journal_keep_seconds"), ctx.opt("journal_keep_versions"))
    if args.exist_ok:
        with contextlib.suppress(om.NotFound):
            return _report_init(ctx, _same_settings(ctx.task(), args), created=False)
    try:
        task = om.Task.create(
            ctx.store(),
            ctx.task_id(),
            args.stages,
            args.lease,
            args.retries,
            policy=ctx.policy(),
            journal_keep_seconds=keep[0],
            journal_keep_versions=keep[1],
            partitions=_partitions(args),
            agents=args.agents,
            spread=args.spread,
            layout="task" if args.layout == "task" else None,
            retry_backoff=args.retry_backoff,
            retry_backoff_max=args.retry_backoff_max,
            deadlines=_stage_values("--deadline", args.deadline),
        )
    except om.AlreadyExists:
        if not args.exist_ok:
            raise om.AlreadyExists(
                f"task {ctx.task_id()!r} already exists at {ctx.store().url}; pass --exist-ok "
                "to go on with it (its settings must match), or pick another --task"
            ) from None
        return _report_init(ctx, _same_settings(ctx.task(), args), created=False)
    return _report_init(ctx, task, created=True)


def _report_init(ctx: Context, task: om.Task, created: bool) -> int:
    header = task.header
    verb = "created" if created else "found existing"
    ctx.out.result(
        {**jsonable(header), "created": created},
        f"{verb} task {header.task_id} at {ctx.store().url}: stages "
        f"{STAGES_ARROW.join(header.stages)}, lease {header.lease_seconds:g}s, "
        f"up to {header.max_retries} retries, {describe_layout(header)}",
    )
    return 0


def describe_layout(header: TaskHeader) -> str:
    """The task's shard layout in words."""
    if header.layout == "task":
        return "one shard for the whole task"
    split = ", ".join(f"{s} in {n} partitions" for s, n in (header.partitions or {}).items())
    if split and header.spread:
        split += ", each under key prefixes of its own"
    return f"one shard per stage ({split})" if split else "one shard per stage"


def _partitions(args: argparse.Namespace) -> dict[str, int | str] | None:
    """``--partitions STAGE=N`` options as a mapping (each stage once)."""
    given: list[tuple[str, int | str]] = args.partitions or []
    found: dict[str, int | str] = {}
    for stage, count in given:
        if stage in found and found[stage] != count:
            raise UsageError(f"--partitions gives stage {stage!r} twice: {found[stage]}, {count}")
        found[stage] = count
    return found or None


def _stage_values(option: str, given: list[tuple[str, float]] | None) -> dict[str, float] | None:
    """``STAGE=SECONDS`` options as a mapping (each stage once)."""
    found: dict[str, float] = {}
    for stage, value in given or []:
        if stage in found and found[stage] != value:
            raise UsageError(f"{option} gives stage {stage!r} twice: {found[stage]:g}, {value:g}")
        found[stage] = value
    return found or None


def _same_settings(task: om.Task, args: argparse.Namespace) -> om.Task:
    """``task`` if its header has the settings this ``init`` gives, else ``AlreadyExists``
    (exit 9) naming the first that differs: a rerun with other settings must not go on
    quietly with the old ones. Stages, lease, retries, retry backoff and its cap, deadlines
    and the shard layout are compared always (their defaults included); journal retention
    only when given."""
    header = task.header
    backoff, backoff_max, deadlines = check_timing(
        args.retry_backoff,
        args.retry_backoff_max,
        _stage_values("--deadline", args.deadline),
        args.stages,
    )
    given = header.model_copy(update={"retry_backoff": backoff, "retry_backoff_max": backoff_max})
    settings: list[tuple[str, object, object]] = [
        ("stages", list(header.stages), list(args.stages)),
        ("--lease", header.lease_seconds, float(args.lease)),
        ("--retries", header.max_retries, int(args.retries)),
        ("--retry-backoff", header.retry_backoff or 0.0, backoff or 0.0),
        ("--retry-backoff-max", header.backoff_cap, given.backoff_cap),
        *(
            (
                f"--deadline {stage}",
                (header.deadlines or {}).get(stage),
                (deadlines or {}).get(stage),
            )
            for stage in task.stages
        ),
    ]
    for option, found, wanted in settings:
        if found != wanted:
            raise _other_settings(task, option, _shown(found), _shown(wanted))
    # The shard layout (it decides where every entry lives).
    wanted_layout = (
        "task" if args.layout == "task" else None,
        {
            s: n
            for s, n in (
                resolve_partitions(_partitions(args), args.agents, args.spread) or {}
            ).items()
            if n > 1
        },
    )
    found_layout = (header.layout, dict(header.partitions or {}))
    if wanted_layout != found_layout:
        raise om.AlreadyExists(
            f"task {task.task_id!r} already exists with another shard layout: "
            f"{describe_layout(header)}; give init the same --partitions and --layout, or "
            "pick another --task"
        )
    # Journal retention, compared when given: a rerun without the options still goes on.
    for option, given_value, kept in (
        ("--journal-keep-seconds", args.journal_keep_seconds, header.journal_keep_seconds),
        ("--journal-keep-versions", args.journal_keep_versions, header.journal_keep_versions),
    ):
        if given_value is not None and given_value != kept:
            raise _other_settings(
                task, option, kept if kept is not None else "not set", given_value
            )
    return task


def _shown(value: object) -> str:
    """A setting as a message shows it: seconds as ``900s``, a deadline not set as ``none``."""
    if value is None:
        return "not set"
    return f"{value:g}s" if isinstance(value, float) else str(value)


def _other_settings(task: om.Task, option: str, found: object, wanted: object) -> om.AlreadyExists:
    return om.AlreadyExists(
        f"task {task.task_id!r} already exists with other settings: {option} is {found} "
        f"there, {wanted} given; give init the task's settings, or pick another --task"
    )
