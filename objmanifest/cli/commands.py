"""The task commands: each takes a ``Context`` and returns an exit code.

They mirror the Python API one to one and add only what a process boundary needs:
rebuilding a claim from ``--agent``/``--epoch``, waiting for work, stdin and stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, BinaryIO

import objmanifest as om
from objmanifest.engine.manifest import check_retention, check_settings, check_timing
from objmanifest.journal.history import record_dict, transitions_of

from ..cas.policy import Codec
from ..core.model import DamageNote, TaskHeader
from ..wire.errors import NothingClaimable, UsageError
from ..wire.polling import poll
from ..wire.shapes import claim_json, entry_json, jsonable, status_json
from . import progress
from .inputs import load_json, read_whole, shown
from .output import Output
from .render import (
    claim_line,
    entries_table,
    entry_view,
    history_view,
    lineage_view,
    log_view,
    record_line,
    status_view,
    transition_line,
)

STAGES_ARROW = " -> "


@dataclass
class Context:
    """One invocation: parsed arguments, where output goes, and the task, opened once."""

    args: argparse.Namespace
    out: Output
    _store: om.ObjectStore | None = field(default=None, repr=False)
    _task: om.Task | None = field(default=None, repr=False)

    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    def store(self) -> om.ObjectStore:
        if self._store is None:
            url = self.opt("url")
            if not url:
                raise UsageError(
                    "no store given: pass --url s3://BUCKET/PREFIX or set OBJMANIFEST_URL"
                )
            if str(url).startswith("memory:"):
                raise UsageError(
                    "memory:// stores live inside one process, and every objmanifest command "
                    "is a process of its own: use an s3:// URL (`objmanifest serve` starts a "
                    "local S3 server)"
                )
            self._store = om.connect(str(url), endpoint_url=self.opt("endpoint_url"))
        return self._store

    def task_id(self) -> str:
        task_id = self.opt("task")
        if not task_id:
            raise UsageError("no task given: pass --task ID or set OBJMANIFEST_TASK")
        return str(task_id)

    def policy(self) -> om.CasPolicy | None:
        attempts = self.opt("cas_attempts")
        return om.CasPolicy(max_attempts=int(attempts)) if attempts else None

    def task(self) -> om.Task:
        if self._task is None:
            self._task = om.Task.open(self.store(), self.task_id(), policy=self.policy())
        return self._task

    def agent(self) -> om.Agent:
        name = self.opt("agent")
        if not name:
            raise UsageError("no agent name given: pass --agent NAME or set OBJMANIFEST_AGENT")
        return self.task().agent(str(name), self.opt("role"))

    def holder_claim(self) -> tuple[om.Agent, om.Claim]:
        """The agent and the claim named by ``FILE_ID --agent --epoch``."""
        agent = self.agent()
        return agent, agent.resume(self.args.file_id, self.args.epoch)

    def waiting(self, what: str) -> Callable[[], None]:
        """A note for a human that the command waits, shown once if it has to."""
        wait = float(self.opt("wait", 0.0))
        return lambda: self.out.note(f"objmanifest: {what} yet; waiting up to {wait:g}s")

    def show_progress(self) -> bool:
        return progress.wanted(self.out.stderr, bool(self.opt("no_progress")))


# -- init --------------------------------------------------------------------------------


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
    return f"one shard per stage ({split})" if split else "one shard per stage"


def _partitions(args: argparse.Namespace) -> dict[str, int] | None:
    """``--partitions STAGE=N`` options as a mapping (each stage once)."""
    given: list[tuple[str, int]] = args.partitions or []
    found: dict[str, int] = {}
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
        {s: n for s, n in (_partitions(args) or {}).items() if n > 1},
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


# -- declare -----------------------------------------------------------------------------


def cmd_declare(ctx: Context) -> int:
    """Declare one file from the arguments, or many from ``--from`` (one commit per shard)."""
    args = ctx.args
    if args.source is not None:
        if args.file_id is not None:
            raise UsageError("give either FILE_ID or --from, not both")
        decls = read_declarations(
            read_whole(args.source, "--from"), args.stage, args.depends_on, args.consumer
        )
    else:
        if args.file_id is None or args.stage is None:
            raise UsageError("declare needs FILE_ID and --stage (or --from FILE for a batch)")
        decls = [
            {
                "file_id": args.file_id,
                "stage": args.stage,
                "depends_on": args.depends_on,
                "consumers": args.consumer,
            }
        ]
    if not decls:
        ctx.out.result({"entries": []}, "nothing to declare: the input has no declarations")
        return 0
    listed = ctx.task().declare_many(decls)
    entries = list({e.file_id: e for e in listed}.values())  # an id listed twice, once
    ctx.out.result(
        {"entries": [entry_json(e) for e in entries]},
        *_declared_lines(entries, len(listed) - len(entries)),
    )
    return 0


def _declared_lines(entries: list[om.Entry], repeats: int = 0) -> list[str]:
    again = f" ({repeats} repeated in the input)" if repeats else ""
    if len(entries) == 1:
        e = entries[0]
        return [f"declared {e.file_id} in stage {e.stage} ({e.state.value}){again}"]
    per_stage = Counter(e.stage for e in entries)
    detail = ", ".join(f"{n} in {stage}" for stage, n in per_stage.items())
    return [f"declared {len(entries)} entries: {detail}{again}"]


def read_declarations(
    text: str, stage: str | None, depends_on: list[str], consumers: list[str]
) -> list[dict[str, Any]]:
    """Declarations from a JSON array, or from lines that are each a JSON object or a bare
    file id. ``--stage``, ``--depends-on`` and ``--consumer`` fill in what an item omits."""
    defaults: dict[str, Any] = {"depends_on": depends_on, "consumers": consumers}
    if stage:
        defaults["stage"] = stage
    stripped = text.lstrip()
    if stripped.startswith("["):
        items = _json(stripped, "the --from input")
        if not isinstance(items, list):
            raise om.InvalidInput("the --from input must be a JSON array of objects")
        numbered = list(enumerate(items, 1))
    else:
        numbered = [
            (n, _json(line, f"line {n}") if line.startswith("{") else {"file_id": line})
            for n, line in ((n, raw.strip()) for n, raw in enumerate(text.splitlines(), 1))
            if line
        ]
    decls = []
    for n, item in numbered:
        if not isinstance(item, dict):
            raise om.InvalidInput(
                f"item {n} of the --from input is not a JSON object: {_short(item)}"
            )
        if "file_id" not in item:
            raise om.InvalidInput(f"item {n} of the --from input has no file_id: {_short(item)}")
        unknown = sorted(set(item) - set(DECLARATION_KEYS))
        if unknown:
            raise om.InvalidInput(
                f"item {n} of the --from input has unknown keys {unknown}; an item has "
                f"{', '.join(DECLARATION_KEYS)}"
            )
        decl = {**defaults, **item}
        if "stage" not in decl:
            raise om.InvalidInput(f"item {n} ({decl.get('file_id')!r}) has no stage; add --stage")
        decls.append(decl)
    return decls


DECLARATION_KEYS = ("file_id", "stage", "depends_on", "consumers")


def _short(value: Any, limit: int = 200) -> str:
    return shown(value, limit)


def _json(text: str, where: str) -> Any:
    return load_json(text, where)


# -- claim, renew, fail ------------------------------------------------------------------


def cmd_claim(ctx: Context) -> int:
    """Claim a file by id, or any claimable entry of a stage; ``--wait`` polls for one."""
    args = ctx.args
    if args.file_id is None and args.stage is None:
        raise UsageError("claim needs a FILE_ID or --stage")
    if args.file_id is not None and args.limit is not None:
        raise UsageError("--limit claims by stage; give --stage instead of FILE_ID")
    agent = ctx.agent()
    if args.file_id is not None:
        claim = poll(
            lambda: agent.claim(args.file_id, stage=args.stage),
            args.wait,
            (om.NotClaimable,),
            on_wait=ctx.waiting(f"{args.file_id} is not claimable"),
        )
        assert claim is not None
        claims = [claim]
    else:
        limit = args.limit or 1
        found = poll(
            lambda: agent.claim_many(args.stage, limit) or None,
            args.wait,
            on_wait=ctx.waiting(f"nothing in stage {args.stage} is claimable"),
        )
        claims = found or []
        if not claims:
            waited = f" after waiting {args.wait:g}s" if args.wait else ""
            if not ctx.task().shard(args.stage).entries:
                raise NothingClaimable(
                    f"stage {args.stage!r} has no entries{waited}: declare some first "
                    "(`objmanifest declare FILE_ID --stage STAGE`)"
                )
            raise NothingClaimable(
                f"no entry of stage {args.stage!r} is claimable{waited}: "
                f"{ctx.task().unclaimable(args.stage)}"
            )
    obj = {"claims": [claim_json(c) for c in claims]} if args.limit else claim_json(claims[0])
    ctx.out.result(obj, *(claim_line(c) for c in claims))
    return 0


def cmd_renew(ctx: Context) -> int:
    agent, claim = ctx.holder_claim()
    renewed = agent.renew(claim)
    ctx.out.result(claim_json(renewed), claim_line(renewed))
    return 0


def cmd_fail(ctx: Context) -> int:
    agent, claim = ctx.holder_claim()
    entry = agent.fail(claim, ctx.args.reason)
    again = "claimable again" if entry.state is om.State.failed else "retries exhausted"
    ctx.out.result(
        entry_json(entry),
        f"{entry.file_id} is {entry.state.value} ({again}; "
        f"failures {entry.retry_count}, max retries {ctx.task().max_retries})",
    )
    return 0


# -- put, consume ------------------------------------------------------------------------


def local_source(path: str) -> Path | BinaryIO:
    """What to upload: a file, or stdin streamed as it comes (``-``), so a pipeline's
    output needs neither memory nor disk for its whole size. A named pipe, a process
    substitution (``<(cmd)``) or ``/dev/stdin`` is streamed the same way; a directory is
    refused."""
    if path == "-":
        if sys.stdin is None:
            raise UsageError("stdin is closed: give a PATH, or pipe the data into `put FILE_ID -`")
        return sys.stdin.buffer
    source = Path(path)
    if source.is_dir():
        raise IsADirectoryError(f"cannot upload {path!r}: it is a directory; put one file")
    if not source.exists():
        raise FileNotFoundError(f"cannot read {path!r}: no such file")
    return source


def cmd_put(ctx: Context) -> int:
    """Upload the holder's data and make the entry ready (``LeaseLost`` if fenced)."""
    args = ctx.args
    source = local_source(args.path)  # before the claim is looked up: a typo changes nothing
    agent, claim = ctx.holder_claim()
    with progress.bar(ctx.show_progress(), f"put {claim.file_id}", ctx.out.stderr) as bar:
        entry = agent.put(
            claim,
            source,
            part_size=args.part_size,
            concurrency=args.concurrency,
            threshold=args.threshold,
            progress=bar,
        )
    ctx.out.result(
        entry_json(entry),
        f"{entry.file_id} is {entry.state.value}: {entry.size} bytes, {entry.checksum}",
    )
    return 0


def cmd_consume(ctx: Context) -> int:
    """Download, verify and mark consumed; to a file, or to stdout only once verified."""
    args = ctx.args
    agent = ctx.agent()
    target = args.output
    if target == "-":
        ctx.out.data_on_stdout()
        with tempfile.TemporaryDirectory(prefix="objmanifest-consume-") as tmp:
            path = Path(tmp) / "data"
            entry = _consume_to(ctx, agent, path)
            with path.open("rb") as data:
                _copy_to_stdout(data)
        ctx.out.result(entry_json(entry))
        return 0
    entry = _consume_to(ctx, agent, target, parents=args.parents)
    ctx.out.result(entry_json(entry), f"consumed {entry.file_id} -> {target} ({entry.size} bytes)")
    return 0


def _consume_to(ctx: Context, agent: om.Agent, path: str | Path, parents: bool = False) -> om.Entry:
    args = ctx.args
    with progress.bar(ctx.show_progress(), f"consume {args.file_id}", ctx.out.stderr) as bar:
        entry = poll(
            lambda: agent.consume(
                args.file_id,
                path,
                part_size=args.part_size,
                concurrency=args.concurrency,
                progress=bar,
                parents=parents,
            ),
            args.wait,
            (om.NotReady,),
            on_wait=ctx.waiting(f"{args.file_id} is not ready"),
        )
    assert entry is not None
    return entry


def _copy_to_stdout(data: BinaryIO) -> None:
    stdout = sys.stdout.buffer
    try:
        shutil.copyfileobj(data, stdout, 1024 * 1024)
        stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OSError(
            f"cannot write the data to stdout: {e.strerror or e}; it was verified and marked "
            "consumed, so consuming it again as the same consumer gives it again"
        ) from None


# -- status, show, reap ------------------------------------------------------------------


def cmd_status(ctx: Context) -> int:
    status = ctx.task().status()
    if not (status.damaged and ctx.out.json_mode):
        ctx.out.result(status_json(status), status_view(status))
    if status.damaged:
        raise damage_found(status.damaged)
    return 0


def damage_found(damaged: list[DamageNote]) -> om.CorruptShard:
    """A damaged object makes ``status`` exit 12 (as any corrupt manifest object does),
    naming the first and counting the rest; the report printed before lists them all."""
    first, rest = damaged[0], damaged[1:]
    detail = f"{first.kind}: {first.problem}"
    if rest:
        detail += f"; also damaged: {', '.join(n.address or n.key for n in rest)}"
    return om.CorruptShard(first.key, detail, first.address, "run `objmanifest repair`")


def cmd_wait(ctx: Context) -> int:
    stages = list(ctx.args.stage) or None
    until = ctx.args.until
    timeout = ctx.args.timeout

    def note(waiting: list[str]) -> None:
        limit = f"up to {timeout:g}s" if timeout is not None else "without a timeout"
        ctx.out.note(f"objmanifest: {len(waiting)} entries are not {until} yet; waiting {limit}")

    found = ctx.task().wait(stages, until=until, timeout=timeout, on_wait=note)
    where = ", ".join(stages or ctx.task().stages)
    ctx.out.result(
        {"until": until, "stages": stages or list(ctx.task().stages), "entries": len(found)},
        f"all {len(found)} entries of {where} are {until}",
    )
    return 0


def cmd_show(ctx: Context) -> int:
    entry = ctx.task().entry(ctx.args.file_id)
    ctx.out.result(entry_json(entry), entry_view(entry))
    return 0


def cmd_repair(ctx: Context) -> int:
    report = ctx.task().repair(dry_run=bool(ctx.opt("dry_run")))
    ctx.out.result(report.to_dict(), *repair_lines(report))
    return 0


def repair_lines(report: om.RepairReport) -> list[str]:
    """What ``repair`` found and did, for a human: one line per object, then one per entry
    that is not as it was or lost something."""
    if report.clean:
        return [
            "nothing is damaged: every shard, the index, their journal blocks and the upload "
            "states of ready chunked entries read back sound"
        ]
    lines: list[str] = []
    for obj in report.objects:
        where = f" (its bytes copied to {obj.moved_to})" if obj.moved_to else ""
        lines.append(f"{obj.key}: {obj.damage} ({obj.problem}): {obj.action}{where}")
        if obj.kind == "shard" and obj.action != "left alone":
            complete = "complete" if obj.journal_complete else "up to its last block"
            lines.append(
                f"  from {obj.records} journal record(s) ({complete}): "
                f"{len(obj.entries)} entr{'y' if len(obj.entries) == 1 else 'ies'}"
            )
            for e in obj.entries:
                if e.state != e.seen_state or e.lost:
                    lost = f"; not restored: {', '.join(e.lost)}" if e.lost else ""
                    lines.append(f"  {e.file_id}: {e.state} at epoch {e.epoch}: {e.rule}{lost}")
        if obj.kind == "index" and obj.action != "left alone":
            lines.append(f"  {len(obj.indexed)} file id(s) from the shards")
        for item in obj.not_restored if obj.kind != "shard" else ():
            lines.append(f"  not restored: {item}")
    if report.added:
        verb = "would add" if report.dry_run else "added"
        shown = ", ".join(report.added[:20]) + (" ..." if len(report.added) > 20 else "")
        lines.append(f"repaired the index: {verb} {len(report.added)} file id(s): {shown}")
    if report.dry_run:
        lines.append("dry run: nothing was written")
    return lines


def cmd_reap(ctx: Context) -> int:
    released = ctx.task().reap()
    human: list[Any] = [f"released {len(released)} expired lease(s)"]
    if released:
        human.append(entries_table(released, "released"))
    ctx.out.result({"released": [entry_json(e) for e in released]}, *human)
    return 0


# -- history -----------------------------------------------------------------------------


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


# -- journal retention -------------------------------------------------------------------


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


# -- lifecycle verbs (issue 10) ------------------------------------------------------------


def cmd_release(ctx: Context) -> int:
    agent, claim = ctx.holder_claim()
    entry = agent.release(claim)
    ctx.out.result(
        entry_json(entry),
        f"{entry.file_id} is {entry.state.value} again (released by {agent.name}, "
        f"failures {entry.retry_count})",
    )
    return 0


# -- gc (cleanup) ------------------------------------------------------------------------


def cmd_gc(ctx: Context) -> int:
    report = ctx.task().gc(
        dry_run=bool(ctx.args.dry_run), consumed_older_than=ctx.args.consumed_older_than
    )
    verb = "would remove" if report.dry_run else "removed"
    human: list[Any] = [
        f"{verb} {len(report.removed)} object(s)/upload(s), {report.bytes_freed} bytes"
    ]
    for kind, items in report.by_kind().items():
        if items:
            size = sum(i.size or 0 for i in items)
            human.append(f"  {kind}: {len(items)} ({size} bytes)")
            human.extend(f"    {i.key}" for i in items)
    for kept in report.kept:
        human.append(f"kept {kept.key}: {kept.reason}")
    human.extend(f"error: {e}" for e in report.errors)
    ctx.out.result(report.to_json(), *human)
    return 1 if report.errors else 0


def cmd_archive(ctx: Context) -> int:
    report = ctx.task().archive(older_than=ctx.args.older_than)
    moved = sum(len(ids) for ids in report.archived.values())
    per_stage = ", ".join(f"{stage} {len(ids)}" for stage, ids in report.archived.items() if ids)
    line = f"archived {moved} entr{'y' if moved == 1 else 'ies'}" + (
        f" ({per_stage})" if per_stage else ""
    )
    ctx.out.result(report.model_dump(mode="json"), line)
    return 0


def cmd_revive(ctx: Context) -> int:
    entry = ctx.task().revive(ctx.args.file_id)
    ctx.out.result(entry_json(entry), f"{entry.file_id} is {entry.state.value}, retries reset")
    return 0


def cmd_undeclare(ctx: Context) -> int:
    file_id = ctx.args.file_id
    ctx.task().undeclare(file_id)
    ctx.out.result({"undeclared": file_id}, f"undeclared {file_id}")
    return 0


def cmd_tasks(ctx: Context) -> int:
    ids: list[Any] = om.Task.list(ctx.store())
    ctx.out.result(ids, *ids)
    return 0


def cmd_delete(ctx: Context) -> int:
    task_id = ctx.task_id()
    if not ctx.opt("yes"):
        raise UsageError(
            f"delete removes task {task_id!r} with all its data; nothing was deleted: "
            "add --yes to do it"
        )
    done = om.Task.delete_by_id(ctx.store(), task_id, force=bool(ctx.opt("force")))
    ctx.out.result(
        {"deleted": done.task_id, "objects": done.objects, "uploads_aborted": done.uploads_aborted},
        f"deleted task {done.task_id!r}: {done.objects} object(s), "
        f"{done.uploads_aborted} upload(s) aborted",
    )
    return 0
