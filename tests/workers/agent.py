"""An agent in its own process, for the race tests (``tests/test_races.py``).

Run as ``python tests/workers/agent.py --bucket B --prefix P --task job --name NAME MODE ...``
with the ``AWS_*`` variables of the server in the environment, or with ``--url URL`` (a store of
any scheme) and the environment its backend reads (``STORAGE_EMULATOR_HOST`` ...). It writes
JSON lines to stdout, one object per line, each with an ``event``; the first is always ``start``
(with this process's ``time.time()``, so a test can see what clock the process runs on).

Modes:

* ``produce --stage S``: claim any entry of the stage and put ``FILE_ID|NAME|EPOCH`` as its
  data, until nothing is claimable; one ``produced`` line per entry, then ``done``.
* ``produce-many --stage S --limit N``: ``claim_many`` up to N entries and ``put_many``
  their data (as ``produce`` makes it), until nothing is claimable; one ``produced`` line
  per entry made ready, one ``error`` line per claim that was not, then ``done`` with the
  number of batches.
* ``hold --file-id X [--file-id Y ...]``: claim each, print each as ``claimed``, wait for a
  line on stdin, then try ``put`` on each and print ``put`` with ``outcome`` ``ok`` or the
  error's class name.
* ``claim-once [--file-id X ...] [--stage S]``: one claim attempt per file id, then one by
  stage; one ``claim`` line each with ``claim`` the claim (or null) and ``error``.

``--wait-go`` makes any mode print ``waiting`` and wait for a line on stdin before it starts,
so several processes can be released at once.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Any

import objmanifest as om

STDIN_TIMEOUT = 120.0
"""A worker whose test died must not wait forever."""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def wait_line(what: str) -> str:
    ready, _, _ = select.select([sys.stdin], [], [], STDIN_TIMEOUT)
    if not ready:
        emit("error", error="Timeout", message=f"no {what} on stdin in {STDIN_TIMEOUT}s")
        sys.exit(3)
    return sys.stdin.readline().strip()


def payload_of(file_id: str, name: str, epoch: int) -> bytes:
    return f"{file_id}|{name}|{epoch}".encode()


def claim_json(claim: om.Claim | None) -> dict[str, Any] | None:
    return claim.to_dict() if claim is not None else None


def stats_json(task: om.Task) -> dict[str, int]:
    return task.request_counts()


def produce(task: om.Task, agent: om.Agent, stage: str, deadline: float) -> None:
    produced = 0
    while time.monotonic() < deadline:
        claim = agent.claim(stage=stage)
        if claim is None:
            break
        try:
            entry = agent.put(claim, payload_of(claim.file_id, agent.name, claim.epoch))
        except om.ObjManifestError as e:
            emit(
                "error",
                file_id=claim.file_id,
                epoch=claim.epoch,
                error=type(e).__name__,
                message=str(e),
            )
            continue
        produced += 1
        emit(
            "produced",
            file_id=entry.file_id,
            epoch=entry.epoch,
            claim_epoch=claim.epoch,
            checksum=entry.checksum,
            key=entry.key,
        )
    emit("done", produced=produced, stats=stats_json(task))


def produce_many(task: om.Task, agent: om.Agent, stage: str, limit: int, deadline: float) -> None:
    produced = batches = 0
    while time.monotonic() < deadline:
        claims = agent.claim_many(stage, limit)
        if not claims:
            break
        batches += 1
        datas = [payload_of(c.file_id, agent.name, c.epoch) for c in claims]
        for claim, result in zip(claims, agent.put_many(claims, datas), strict=True):
            if isinstance(result, Exception):
                emit("error", file_id=claim.file_id, error=type(result).__name__)
                continue
            produced += 1
            emit("produced", file_id=result.file_id, epoch=result.epoch, key=result.key)
    emit("done", produced=produced, batches=batches, stats=stats_json(task))


def hold(task: om.Task, agent: om.Agent, file_ids: list[str], payload: str) -> None:
    claims = []
    for file_id in file_ids:
        claim = agent.claim(file_id)
        assert claim is not None
        claims.append(claim)
        emit("claimed", claim=claim_json(claim), store_now=task.store.now().isoformat())
    wait_line("go")
    for claim in claims:
        try:
            entry = agent.put(claim, payload.encode())
        except om.ObjManifestError as e:
            emit(
                "put",
                file_id=claim.file_id,
                outcome=type(e).__name__,
                message=str(e),
                stats=stats_json(task),
            )
            continue
        emit(
            "put",
            file_id=claim.file_id,
            outcome="ok",
            epoch=entry.epoch,
            key=entry.key,
            stats=stats_json(task),
        )


def claim_once(task: om.Task, agent: om.Agent, file_ids: list[str], stage: str | None) -> None:
    attempts: list[tuple[str | None, str | None]] = [(f, None) for f in file_ids]
    if stage is not None:
        attempts.append((None, stage))
    for file_id, by_stage in attempts:
        try:
            claim = agent.claim(file_id, stage=by_stage)
            error, message = None, None
        except om.ObjManifestError as e:
            claim, error, message = None, type(e).__name__, str(e)
        emit(
            "claim",
            file_id=file_id,
            stage=by_stage,
            claim=claim_json(claim),
            error=error,
            message=message,
            store_now=task.store.now().isoformat(),
            time=time.time(),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bucket", help="an S3 bucket (with --prefix)")
    where.add_argument("--url", help="the store's URL, of any scheme")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--task", required=True, help="task id")
    parser.add_argument("--name", required=True, help="agent name")
    parser.add_argument(
        "--wait-go", action="store_true", help="wait for a line on stdin before starting"
    )
    parser.add_argument("--max-seconds", type=float, default=60.0)
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("produce")
    p.add_argument("--stage", required=True)
    pm = modes.add_parser("produce-many")
    pm.add_argument("--stage", required=True)
    pm.add_argument("--limit", type=int, required=True)
    h = modes.add_parser("hold")
    h.add_argument("--file-id", action="append", required=True)
    h.add_argument("--payload", default="held")
    c = modes.add_parser("claim-once")
    c.add_argument("--file-id", action="append", default=[])
    c.add_argument("--stage")
    args = parser.parse_args(argv)

    emit("start", pid=os.getpid(), name=args.name, mode=args.mode, time=time.time())
    store = om.connect(args.url or f"s3://{args.bucket}/{args.prefix}")
    task = om.Task.open(store, args.task)
    agent = task.agent(args.name)
    if args.wait_go:
        emit("waiting", time=time.time())
        wait_line("go")
    deadline = time.monotonic() + args.max_seconds
    if args.mode == "produce":
        produce(task, agent, args.stage, deadline)
    elif args.mode == "produce-many":
        produce_many(task, agent, args.stage, args.limit, deadline)
    elif args.mode == "hold":
        hold(task, agent, args.file_id, args.payload)
    else:
        claim_once(task, agent, args.file_id, args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
