"""``put-many``: the data of many claims, then one commit per shard (``Agent.put_many``).

The claims come as ``claim --stage S --limit N`` printed them (tab-separated lines, or its
``--json`` object), so one step claims a batch and the next finishes it. Everything the
command is given is checked before anything is sent: a typo changes nothing. What happens
to each file afterwards is reported per file, and the exit code is not 0 unless every
file was made ready.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import objmanifest as om

from ..core.names import check_file_id
from ..wire.errors import NotAllReady, UsageError
from ..wire.exits import ExitCode, classify
from ..wire.shapes import entry_json
from .commands import local_source
from .context import Context
from .inputs import ASCII_SPACE, lines, load_json, read_whole, shown
from .output import PROG

CLAIM_FIELDS = ("FILE_ID", "STAGE", "EPOCH", "LEASE_EXPIRES_AT")


@dataclass(frozen=True)
class Item:
    """One file of the batch: its claim as printed (file id, epoch) and where its data is."""

    where: str
    file_id: str
    epoch: int
    path: Path


def cmd_put_many(ctx: Context) -> int:
    """Upload the data of many held claims and make the entries ready (one commit per
    shard); each file's outcome is reported, and the exit code says whether all landed."""
    args = ctx.args
    text = read_whole(args.claims, "--claims")
    directory = _directory(args.dir)
    items = read_items(text, directory)
    if not items:
        ctx.out.result(
            {"results": [], "ready": 0, "failed": 0, "exit_code": 0},
            "nothing to put: the input has no claims",
        )
        return 0
    agent = ctx.agent()
    claims = agent.resume_many([(i.file_id, i.epoch) for i in items])
    results = agent.put_many(
        claims,
        [i.path for i in items],
        part_size=args.part_size,
        concurrency=args.concurrency,
        threshold=args.threshold,
    )
    return _report(ctx, items, results)


def _directory(given: str | None) -> Path | None:
    if given is None:
        return None
    path = Path(given)
    if not path.is_dir():
        raise NotADirectoryError(
            f"--dir {given!r} is not a directory: name the directory holding the files, "
            "each at DIR/FILE_ID"
        )
    return path


def read_items(text: str, directory: Path | None) -> list[Item]:
    """The batch: from the JSON ``claim --json`` printed (one CLAIM, or ``{"claims": [...]}``;
    a claim may carry ``"path"``), or from lines as ``claim`` prints them
    (``FILE_ID STAGE EPOCH LEASE_EXPIRES_AT``, tab-separated), each optionally followed by a
    fifth field, the PATH of its data. Without a PATH the data is ``DIR/FILE_ID``."""
    stripped = text.strip()
    if stripped.startswith("{"):
        raw = _json_claims(stripped)
    else:
        raw = [
            (f"line {n}", *_fields(line, n))
            for n, line in enumerate(lines(text), 1)
            if line.strip(ASCII_SPACE)
        ]
    first: dict[str, str] = {}
    for where, file_id, _, _ in raw:
        if file_id in first:
            raise om.InvalidInput(
                f"{first[file_id]} and {where} both name {file_id!r}: give each file once"
            )
        first[file_id] = where
    return [
        Item(where, file_id, epoch, _data_path(where, file_id, path, directory))
        for where, file_id, epoch, path in raw
    ]


def _fields(line: str, n: int) -> tuple[str, int, str | None]:
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) not in (4, 5):
        raise om.InvalidInput(
            f"line {n} has {len(fields)} tab-separated field(s), not 4 or 5: give each claim as "
            f"`claim` prints it ({' '.join(CLAIM_FIELDS)}), optionally followed by the PATH "
            f"of its data: {shown(line)}"
        )
    return fields[0], _epoch(fields[2], f"line {n}"), fields[4] if len(fields) == 5 else None


def _json_claims(text: str) -> list[tuple[str, str, int, str | None]]:
    obj = load_json(text, "the --claims input")
    listed = obj.get("claims", [obj]) if isinstance(obj, dict) else None
    if not isinstance(listed, list):
        raise om.InvalidInput(
            "the --claims JSON must be what `claim --json` prints: one CLAIM object, or "
            '{"claims": [CLAIM, ...]}'
        )
    out = []
    for n, claim in enumerate(listed, 1):
        where = f"claim {n}"
        if not isinstance(claim, dict) or not isinstance(claim.get("file_id"), str):
            raise om.InvalidInput(f"{where} of the --claims JSON has no file_id: {shown(claim)}")
        path = claim.get("path")
        if path is not None and not isinstance(path, str):
            raise om.InvalidInput(f"{where} of the --claims JSON has a path that is not text")
        out.append((where, claim["file_id"], _epoch(claim.get("epoch"), where), path))
    return out


def _epoch(value: Any, where: str) -> int:
    try:
        epoch = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else -1
    except ValueError:
        epoch = -1
    if epoch < 1:
        raise om.InvalidInput(
            f"{where}: the epoch {value!r} is not a whole number of at least 1 (the EPOCH "
            "`claim` printed)"
        )
    return epoch


def _data_path(where: str, file_id: str, path: str | None, directory: Path | None) -> Path:
    if path is None:
        if directory is None:
            raise UsageError(
                f"{where} ({file_id!r}) gives no PATH for its data: add it as a fifth field, "
                "or pass --dir DIR to read each file from DIR/FILE_ID"
            )
        path = str(directory / check_file_id(file_id))
    if path == "-":
        raise UsageError(f"{where} ({file_id!r}): put-many reads no data from stdin; name a file")
    source = local_source(path)  # a missing file or a directory: refused before any upload
    assert isinstance(source, Path)
    return source


# -- the report ------------------------------------------------------------------------


def _report(ctx: Context, items: list[Item], results: list[om.Entry | Exception]) -> int:
    rows: list[dict[str, Any]] = []
    failed: list[tuple[Item, Exception]] = []
    lines: list[str] = []
    for item, result in zip(items, results, strict=True):
        head = {"file_id": item.file_id, "epoch": item.epoch}
        if isinstance(result, om.Entry):
            rows.append({**head, "entry": entry_json(result)})
            lines.append(
                f"{result.file_id} is {result.state.value}: {result.size} bytes, {result.checksum}"
            )
            continue
        outcome = classify(result)
        rows.append(
            {
                **head,
                "error": type(result).__name__,
                "message": str(result) or type(result).__name__,
                "exit_code": int(outcome.code),
                **outcome.fields,
            }
        )
        failed.append((item, result))
    ready = len(items) - len(failed)
    obj: dict[str, Any] = {"results": rows, "ready": ready, "failed": len(failed), "exit_code": 0}
    if not failed:
        ctx.out.result(obj, *lines)
        return 0
    error, code = _outcome([e for _, e in failed])
    labels = Counter(classify(e).label for _, e in failed)
    why = ", ".join(f"{n} {label}" for label, n in labels.items())
    summary = f"{ready} of {len(items)} file(s) made ready; {len(failed)} not ({why})"
    obj.update(error=error, message=summary, exit_code=code)
    ctx.out.result(obj, *lines)
    if not ctx.out.json_mode:
        err = ctx.out.stderr
        for item, e in failed:
            err.write(f"{PROG}: {item.file_id}: {classify(e).label}: {e}\n")
        err.write(f"{PROG}: {summary}\n")
        err.flush()
    return code


def _outcome(errors: list[Exception]) -> tuple[str, int]:
    """The batch's ``error`` and exit code: the failures' own when they share one (exit 5:
    only leases were lost, claim again), else ``NotAllReady`` and 1."""
    codes = {classify(e).code for e in errors}
    names = {type(e).__name__ for e in errors}
    if len(codes) == 1:
        name = names.pop() if len(names) == 1 else NotAllReady.__name__
        return name, int(codes.pop())
    return NotAllReady.__name__, int(ExitCode.ERROR)
