"""The task commands: each takes a ``Context`` and returns an exit code.

They mirror the Python API one to one and add only what a process boundary needs:
rebuilding a claim from ``--agent``/``--epoch``, waiting for work, stdin and stdout.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import objmanifest as om

from ..core.report import DamageNote
from ..wire.errors import NothingClaimable, UsageError
from ..wire.polling import poll
from ..wire.shapes import claim_json, entry_json, status_json
from . import progress
from .context import Context
from .inputs import ASCII_SPACE, lines, load_json, read_whole, shown
from .render import (
    claim_line,
    entries_table,
    entry_view,
    status_view,
)

# -- init --------------------------------------------------------------------------------


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
            for n, line in ((n, raw.strip(ASCII_SPACE)) for n, raw in enumerate(lines(text), 1))
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
        if obj.version is not None:
            lines.append(f"  {kept_version_line(obj.version, obj)}")
        elif obj.versions_note:
            lines.append(f"  not from a kept version: {obj.versions_note}")
        if obj.kind == "shard" and obj.action != "left alone" and obj.version is None:
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


def kept_version_line(version: om.KeptVersion, obj: om.ObjectRepair) -> str:
    """Which kept version an object was restored from, for a human."""
    at = f" of {version.at.isoformat()}" if version.at is not None else ""
    own = f" (its version {version.object_version})" if version.object_version else ""
    held = f": {len(obj.entries)} entr{'y' if len(obj.entries) == 1 else 'ies'}"
    carried = f", {obj.records} unflushed journal record(s)" if obj.records else ""
    kept = f"{held}{carried}, as they were" if obj.kind == "shard" else ""
    return f"from version {version.version_id}{at}{own}, exactly{kept}"


def cmd_reap(ctx: Context) -> int:
    released = ctx.task().reap()
    human: list[Any] = [f"released {len(released)} expired lease(s)"]
    if released:
        human.append(entries_table(released, "released"))
    ctx.out.result({"released": [entry_json(e) for e in released]}, *human)
    return 0


# -- history -----------------------------------------------------------------------------


# -- journal retention -------------------------------------------------------------------


# -- lifecycle verbs ------------------------------------------------------------


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
