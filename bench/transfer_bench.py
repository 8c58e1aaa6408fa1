"""Chunked transfer benchmark: objmanifest against boto3's own transfer manager.

Uploads and downloads one large file to a local SeaweedFS started here, with objmanifest
(``Agent.put`` / ``Agent.consume``: xxh3 per part, upload state recorded by compare-and-swap,
lease renewal, completion checks, verified ranged downloads, the manifest's own commits) and
with boto3's ``upload_file`` / ``download_file`` (s3transfer) using the same boto3 client
settings, part size and concurrency. Every transfer runs in a child process of its own, so
its peak RSS is its own. A round runs the sides A B B A (the order flips each round), and every
transfer starts after ``sync`` and a pause, so none pays for the writes of the one before.

    python bench/transfer_bench.py --size-mib 2048

Prints a Markdown table: MiB/s of each side (median), the ratio objmanifest / boto3 (median of
the rounds' ratios, and each round's), the client's CPU time and peak RSS (the most of any
transfer).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import xxhash

MiB = 1024 * 1024
BUCKET = "objmanifest-bench"
TASK = "bench"


# -- children: one transfer each ---------------------------------------------------------------


def _status_kib(field: str) -> int:
    """From /proc/self/status; ``VmHWM`` is the peak RSS of this process only (``ru_maxrss``
    would include the parent's size at fork, as Linux keeps it across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def child(args: argparse.Namespace) -> None:
    from boto3.s3.transfer import TransferConfig as S3TransferConfig

    import objmanifest as om
    from objmanifest.store import make_client

    part, conc = args.part_size_mib * MiB, args.concurrency
    client = make_client(args.endpoint)
    store = om.connect(f"s3://{BUCKET}/{args.prefix}", client=client)
    s3config = S3TransferConfig(
        multipart_threshold=8 * MiB, multipart_chunksize=part, max_concurrency=conc
    )
    task = om.Task.open(store, TASK)
    agent = task.agent(f"{args.side}-{args.op}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    if (args.side, args.op) == ("boto3", "upload"):
        client.upload_file(
            args.path, BUCKET, f"{args.prefix}/boto3/{args.file_id}", Config=s3config
        )
    elif (args.side, args.op) == ("boto3", "download"):
        client.download_file(
            BUCKET, f"{args.prefix}/boto3/{args.file_id}", args.path, Config=s3config
        )
    elif args.op == "upload":
        claim = agent.claim(args.file_id)
        assert claim is not None
        agent.put(claim, args.path, part_size=part, concurrency=conc)
    else:
        agent.consume(args.file_id, dest=args.path, concurrency=conc)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_rss_kib": _status_kib("VmHWM")}))


# -- the parent: set up, run the rounds, report ---------------------------------------------------


def make_file(path: Path, size: int) -> None:
    rnd = random.Random(2048)
    block = rnd.randbytes(MiB)
    with path.open("wb") as f:
        for i in range(size // MiB):
            f.write(i.to_bytes(8, "little") + block[8:])  # every MiB differs
        f.write(block[: size % MiB])


def digest_of(path: Path) -> str:
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def settle(seconds: float) -> None:
    """Start each transfer from a quiet machine: without this, whatever ran first in a round
    leaves the server's written data to be flushed during the next one, which then looks
    slower (seen here as a steady first-runs-faster pattern)."""
    os.sync()
    time.sleep(seconds)


def run_child(args: argparse.Namespace, env: dict[str, str], **fields: Any) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--endpoint",
        args.endpoint,
        "--part-size-mib",
        str(args.part_size_mib),
        "--concurrency",
        str(args.concurrency),
    ]
    for name, value in fields.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {fields} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def bench(args: argparse.Namespace) -> None:
    import objmanifest as om
    from objmanifest import servers
    from objmanifest.store import make_client

    size = args.size_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="objmanifest-bench-", dir=args.tmp))
    server = servers.start("seaweedfs")
    try:
        server.create_bucket(BUCKET)
        args.endpoint = server.endpoint_url
        env = {**os.environ, **server.env()}
        os.environ.update(server.env())
        src = work / "source.bin"
        make_file(src, size)
        expected = digest_of(src)
        prefix = f"run-{uuid.uuid4().hex[:8]}"
        store = om.connect(f"s3://{BUCKET}/{prefix}", client=make_client(server.endpoint_url))
        task = om.Task.create(store, TASK, stages=["data"], lease_seconds=60)
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_no in range(args.rounds):
            first, second = ("boto3", "objmanifest")[:: 1 if round_no % 2 == 0 else -1]
            order = [(first, "a"), (second, "a"), (second, "b"), (first, "b")]  # A B B A
            task.declare_many([(f"r{round_no}{copy}", "data") for copy in "ab"])
            for op in ("upload", "download"):
                for side, copy in order:
                    file_id = f"r{round_no}{copy}"
                    path = src if op == "upload" else work / f"{side}.out"
                    settle(args.settle)
                    result = run_child(
                        args, env, side=side, op=op, path=path, prefix=prefix, file_id=file_id
                    )
                    result["round"] = round_no
                    rows.setdefault((op, side), []).append(result)
                    print(
                        f"round {round_no + 1} {op:8} {side:11} "
                        f"{size / MiB / result['seconds']:7.1f} MiB/s  "
                        f"client CPU {result['cpu']:5.1f} s  "
                        f"peak RSS {result['peak_rss_kib'] / 1024:6.0f} MiB",
                        file=sys.stderr,
                    )
                    if op == "download":
                        if round_no == 0 and digest_of(path) != expected:
                            raise SystemExit(f"{side} downloaded other bytes")
                        path.unlink()
            for key in list(store.list_keys("")):  # free the server's disk for the next round
                if "/data/" in key or "/boto3/" in key:
                    store.delete(key)
        report(args, rows, size)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(
    args: argparse.Namespace, rows: dict[tuple[str, str], list[dict[str, Any]]], size: int
) -> None:
    """Each side's median speed, and per round the ratio of the two sides' mean speeds: a
    round runs them A B B A, so neither gains from going first or last."""

    def speeds(op: str, side: str, round_no: int | None = None) -> list[float]:
        return [
            size / MiB / r["seconds"]
            for r in rows[(op, side)]
            if round_no is None or r["round"] == round_no
        ]

    def most(op: str, side: str, field: str) -> float:
        return max(r[field] for r in rows[(op, side)])

    print(
        f"SeaweedFS (local, one `weed server`), {args.size_mib} MiB file, part size "
        f"{args.part_size_mib} MiB, concurrency {args.concurrency}, {args.rounds} rounds of "
        f"A B B A; {os.cpu_count()} CPUs, Python {platform.python_version()}\n"
    )
    print(
        "| transfer | boto3 MiB/s | objmanifest MiB/s | ratio | ratio per round | "
        "client CPU s (boto3 / objmanifest) | peak RSS MiB (boto3 / objmanifest) |"
    )
    print("|---|---:|---:|---:|---|---:|---:|")
    for op in ("upload", "download"):
        ratios = [
            statistics.mean(speeds(op, "objmanifest", n)) / statistics.mean(speeds(op, "boto3", n))
            for n in range(args.rounds)
        ]
        cpu = f"{most(op, 'boto3', 'cpu'):.1f} / {most(op, 'objmanifest', 'cpu'):.1f}"
        rss = (
            f"{most(op, 'boto3', 'peak_rss_kib') / 1024:.0f} / "
            f"{most(op, 'objmanifest', 'peak_rss_kib') / 1024:.0f}"
        )
        print(
            f"| {op} | {statistics.median(speeds(op, 'boto3')):.1f} | "
            f"{statistics.median(speeds(op, 'objmanifest')):.1f} | "
            f"{statistics.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} | "
            f"{cpu} | {rss} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--part-size-mib", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="each runs the sides A B B A")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before each")
    parser.add_argument("--tmp", default=None, help="where the source and downloads go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("endpoint", "side", "op", "path", "prefix", "file-id"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
