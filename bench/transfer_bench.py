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
import contextlib
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
    """Start a SeaweedFS (or use ``--endpoint-url``), run the rounds, print the table."""
    from objmanifest.local import servers

    if args.endpoint_url:
        result = measure(args, args.endpoint_url, dict(os.environ))
    else:
        server = servers.start("seaweedfs")
        try:
            result = measure(args, server.endpoint_url, {**os.environ, **server.env()})
        finally:
            server.stop()
    print(header(args))
    print(table(result))


def run(
    endpoint: str,
    env: dict[str, str],
    size_mib: int,
    rounds: int,
    settle_s: float,
    part_size_mib: int = 16,
    concurrency: int = 8,
    tmp: str | None = None,
) -> dict[str, Any]:
    """The suite's entry: measure against a running server, return the summary."""
    args = argparse.Namespace(
        size_mib=size_mib,
        part_size_mib=part_size_mib,
        concurrency=concurrency,
        rounds=rounds,
        settle=settle_s,
        tmp=tmp,
    )
    result = measure(args, endpoint, env)
    result["header"] = header(args)
    return result


def measure(args: argparse.Namespace, endpoint: str, env: dict[str, str]) -> dict[str, Any]:
    import objmanifest as om
    from objmanifest.store import make_client

    size = args.size_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="objmanifest-bench-", dir=args.tmp))
    saved = dict(os.environ)
    try:
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        client = make_client(endpoint)
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=BUCKET)
        args.endpoint = endpoint
        src = work / "source.bin"
        make_file(src, size)
        expected = digest_of(src)
        prefix = f"run-{uuid.uuid4().hex[:8]}"
        store = om.connect(f"s3://{BUCKET}/{prefix}", client=client)
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
        return summarize(args, rows, size)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)


def summarize(
    args: argparse.Namespace, rows: dict[tuple[str, str], list[dict[str, Any]]], size: int
) -> dict[str, Any]:
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

    out: dict[str, Any] = {
        "size_mib": args.size_mib,
        "part_size_mib": args.part_size_mib,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
    }
    for op in ("upload", "download"):
        ratios = [
            statistics.mean(speeds(op, "objmanifest", n)) / statistics.mean(speeds(op, "boto3", n))
            for n in range(args.rounds)
        ]
        out[op] = {
            "boto3_mib_s": round(statistics.median(speeds(op, "boto3")), 1),
            "objmanifest_mib_s": round(statistics.median(speeds(op, "objmanifest")), 1),
            "ratio": round(statistics.median(ratios), 2),
            "ratios": [round(r, 2) for r in ratios],
            "cpu_s": [round(most(op, "boto3", "cpu"), 1), round(most(op, "objmanifest", "cpu"), 1)],
            "peak_rss_mib": [
                round(most(op, "boto3", "peak_rss_kib") / 1024),
                round(most(op, "objmanifest", "peak_rss_kib") / 1024),
            ],
        }
    return out


def header(args: argparse.Namespace) -> str:
    return (
        f"{args.size_mib} MiB file, part size {args.part_size_mib} MiB, concurrency "
        f"{args.concurrency}, {args.rounds} rounds of A B B A; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )


def table(result: dict[str, Any]) -> str:
    lines = [
        "| transfer | boto3 MiB/s | objmanifest MiB/s | ratio | ratio per round | "
        "client CPU s (boto3 / objmanifest) | peak RSS MiB (boto3 / objmanifest) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for op in ("upload", "download"):
        r = result[op]
        lines.append(
            f"| {op} | {r['boto3_mib_s']:.1f} | {r['objmanifest_mib_s']:.1f} | "
            f"{r['ratio']:.2f} | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
            f"{r['cpu_s'][0]:.1f} / {r['cpu_s'][1]:.1f} | "
            f"{r['peak_rss_mib'][0]} / {r['peak_rss_mib'][1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--part-size-mib", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="each runs the sides A B B A")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before each")
    parser.add_argument("--tmp", default=None, help="where the source and downloads go")
    parser.add_argument("--endpoint-url", default=None, help="any S3 (default: start SeaweedFS)")
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
