"""An agent in its own process for the chunked-entry tests (``tests/test_chunked.py``).

Run as ``python tests/workers/chunked.py --bucket B --prefix P --task job --name NAME MODE ...``
with the ``AWS_*`` variables of the server in the environment. It writes JSON lines to
stdout, each with an ``event``; the first is ``start``.

Modes:

* ``put --file-id X --path F``: claim X (waiting up to ``--claim-wait`` seconds for an
  expired lease), put F, print ``claimed``, then ``result`` with the outcome (``ok`` or the
  error's class), the parts and bytes this process sent (counted on the wire, from the
  ``UploadPart`` calls) and the put's own ``UploadStats``.
* ``consume --file-id X --dest F``: consume X to F and print ``result``.

``result`` lines carry ``rss_before`` (RSS just before the transfer) and ``rss_peak`` (the
process's peak RSS at the end), both in KiB.

Faults for the tests: ``--stop-after-parts K`` makes the process SIGSTOP itself once its
K-th part is sent (a test then kills it, or lets it sleep past its lease and continues it);
``--stop-before-complete`` makes it SIGSTOP itself just before it first completes an upload.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
from typing import Any

import objmanifest as om
from objmanifest.data import chunked


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kib() -> int:
    """The most this process has held so far (KiB).

    ``VmHWM`` where there is one: on Linux ``getrusage``'s ``ru_maxrss`` survives ``exec``,
    so a child forked from a big test process (moto keeps its objects in memory) would
    report the parent's size.
    """
    hwm = _status_kib("VmHWM")
    return hwm if hwm is not None else int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def rss_kib() -> int:
    """What this process holds now (KiB): the baseline a transfer's peak is compared with."""
    rss = _status_kib("VmRSS")
    return rss if rss is not None else peak_rss_kib()


class Wire:
    """Counts the parts this process sends, and stops it after the K-th if asked."""

    def __init__(self, store: om.ObjectStore, stop_after: int | None) -> None:
        self.numbers: list[int] = []
        self.bytes = 0
        self.done = 0
        self.stop_after = stop_after
        self.lock = threading.Lock()
        events = store.client.meta.events
        events.register("provide-client-params.s3.UploadPart", self.sending)
        events.register("after-call.s3.UploadPart", self.sent)

    def sending(self, params: dict[str, Any], **_: Any) -> None:
        with self.lock:
            self.numbers.append(int(params["PartNumber"]))
            self.bytes += int(params["ContentLength"])

    def sent(self, **_: Any) -> None:
        with self.lock:
            self.done += 1
            count = self.done
        if self.stop_after is not None and count == self.stop_after:
            emit("stopping", parts=count)
            os.kill(os.getpid(), signal.SIGSTOP)


def stop_before_complete(store: Any) -> None:
    real = store.complete_upload

    def paused(*args: Any, **kwargs: Any) -> None:
        store.complete_upload = real  # once only
        emit("stopping", before="complete")
        os.kill(os.getpid(), signal.SIGSTOP)
        real(*args, **kwargs)

    store.complete_upload = paused


def claim(agent: om.Agent, file_id: str, wait: float) -> om.Claim:
    deadline = time.monotonic() + wait
    while True:
        try:
            got = agent.claim(file_id)
            assert got is not None
            return got
        except om.NotClaimable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def put(task: om.Task, agent: om.Agent, args: argparse.Namespace) -> None:
    wire = Wire(task.store, args.stop_after_parts)
    if args.stop_before_complete:
        stop_before_complete(task.store)
    held = claim(agent, args.file_id, args.claim_wait)
    emit("claimed", epoch=held.epoch, rss=peak_rss_kib())
    stats: dict[str, Any] = {}
    real_upload = chunked.upload

    def counting_upload(*a: Any, **kw: Any) -> Any:
        stored, upload_stats = real_upload(*a, **kw)
        stats.update(vars(upload_stats))
        return stored, upload_stats

    chunked.upload = counting_upload  # type: ignore[assignment]
    before = rss_kib()
    try:
        entry = agent.put(
            held,
            args.path,
            part_size=args.part_size,
            concurrency=args.concurrency,
            threshold=args.threshold,
        )
        outcome, key = "ok", entry.key
    except om.ObjManifestError as e:
        outcome, key = type(e).__name__, None
        emit("error", error=type(e).__name__, message=str(e))
    emit(
        "result",
        outcome=outcome,
        key=key,
        epoch=held.epoch,
        parts_sent=len(wire.numbers),
        part_numbers=sorted(wire.numbers),
        bytes_sent=wire.bytes,
        stats=stats,
        rss_before=before,
        rss_peak=peak_rss_kib(),
    )


def consume(task: om.Task, agent: om.Agent, args: argparse.Namespace) -> None:
    task.entry(args.file_id)  # warm up: the transfer alone is measured
    before = rss_kib()
    entry = agent.consume(args.file_id, dest=args.dest, concurrency=args.concurrency)
    emit(
        "result", outcome="ok", state=entry.state.value, rss_before=before, rss_peak=peak_rss_kib()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--task", required=True)
    parser.add_argument("--name", required=True)
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("put")
    p.add_argument("--file-id", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--part-size", type=int, default=5 * 1024 * 1024)
    p.add_argument("--threshold", type=int, default=8 * 1024 * 1024)
    p.add_argument("--claim-wait", type=float, default=0.0)
    p.add_argument("--stop-after-parts", type=int)
    p.add_argument("--stop-before-complete", action="store_true")
    c = modes.add_parser("consume")
    c.add_argument("--file-id", required=True)
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--dest", required=True)
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    emit("start", pid=os.getpid(), name=args.name, mode=args.mode, rss=peak_rss_kib())
    store = om.connect(f"s3://{args.bucket}/{args.prefix}")
    task = om.Task.open(store, args.task)
    agent = task.agent(args.name)
    if args.mode == "put":
        put(task, agent, args)
    else:
        consume(task, agent, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
