"""An async S3 client against the thread pool ``objmanifest.aio`` uses: the same loop of
small conditional writes by N threads sharing one boto3 client and by N coroutines
sharing one aiobotocore client, bare and behind the 25 ms latency proxy.

One op is what a CAS commit does to a fresh object: ``put_object`` with
``IfNoneMatch='*'`` on a new key, then ``get_object`` and ``put_object`` with ``IfMatch``
its ETag (three requests, 100-byte bodies). Each point runs one uncounted warm-up of each
side, then threads, aiobotocore, aiobotocore, threads (A B B A, so a drift of the machine
falls on both sides); the ratio is aiobotocore / threads, each the mean of its two runs.

Not part of ``python -m bench``: aiobotocore pins botocore narrowly, so it runs in a venv of
its own::

    python3 -m venv /tmp/aiob-venv
    /tmp/aiob-venv/bin/pip install aiobotocore boto3 'moto[server]' -e .
    /tmp/aiob-venv/bin/python -m bench.aio_client            # --ops, --workers, --delays
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

from bench.common import (
    BUCKET,
    Bench,
    bench_context,
    fmt,
    machine,
    new_prefix,
    ratio,
    run_together,
    say,
)
from objmanifest.store import make_client

try:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session
except ImportError as exc:  # pragma: no cover - depends on the venv
    raise SystemExit(
        "bench/aio_client.py needs aiobotocore: pip install aiobotocore in a separate venv: "
        "it pins botocore"
    ) from exc

BODY = b"x" * 100

CONFIG: dict[str, Any] = {
    "s3": {"addressing_style": "path"},
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
    "retries": {"max_attempts": 5, "mode": "standard"},
    "connect_timeout": 10,
    "read_timeout": 60,
}
"""The settings ``objmanifest.store.make_client`` gives boto3, given to aiobotocore too."""


def _shares(ops: int, workers: int) -> list[int]:
    return [ops // workers + (1 if n < ops % workers else 0) for n in range(workers)]


def with_threads(endpoint: str, prefix: str, workers: int, ops: int) -> float:
    """Ops/s of ``workers`` threads sharing one boto3 client."""
    client = make_client(endpoint, max_pool_connections=workers)
    shares = _shares(ops, workers)

    def prepare(n: int) -> Callable[[], None]:
        def work() -> None:
            for i in range(shares[n]):
                key = f"{prefix}/t{n}-{i}"
                client.put_object(Bucket=BUCKET, Key=key, Body=BODY, IfNoneMatch="*")
                got = client.get_object(Bucket=BUCKET, Key=key)
                got["Body"].read()
                client.put_object(Bucket=BUCKET, Key=key, Body=BODY, IfMatch=got["ETag"])

        return work

    seconds = run_together(prepare, workers)
    client.close()
    return ops / seconds


def with_aiobotocore(endpoint: str, prefix: str, workers: int, ops: int) -> float:
    """Ops/s of ``workers`` coroutines sharing one aiobotocore client."""

    async def main() -> float:
        session = get_session()
        config = AioConfig(max_pool_connections=workers, **CONFIG)
        async with session.create_client(
            "s3",
            endpoint_url=endpoint,
            region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            config=config,
        ) as client:

            async def work(n: int, count: int) -> None:
                for i in range(count):
                    key = f"{prefix}/c{n}-{i}"
                    await client.put_object(Bucket=BUCKET, Key=key, Body=BODY, IfNoneMatch="*")
                    got = await client.get_object(Bucket=BUCKET, Key=key)
                    async with got["Body"] as body:
                        await body.read()
                    await client.put_object(Bucket=BUCKET, Key=key, Body=BODY, IfMatch=got["ETag"])

            t0 = time.perf_counter()
            await asyncio.gather(*(work(n, c) for n, c in enumerate(_shares(ops, workers))))
            return ops / (time.perf_counter() - t0)

    return asyncio.run(main())


def point(b: Bench, delay_ms: int, workers: int, ops: int) -> dict[str, Any]:
    """Threads, aiobotocore, aiobotocore, threads on fresh keys each run, after one
    uncounted run of each (the first requests of a point open connections and warm the
    server)."""
    endpoint = b.endpoint(delay_ms)
    with_threads(endpoint, new_prefix("aioc-warm"), workers, workers)
    with_aiobotocore(endpoint, new_prefix("aioc-warm"), workers, workers)
    rates: dict[str, list[float]] = {"threads": [], "aiobotocore": []}
    for way in ("threads", "aiobotocore", "aiobotocore", "threads"):
        run = with_threads if way == "threads" else with_aiobotocore
        rates[way].append(run(endpoint, new_prefix(f"aioc{delay_ms}-{way}"), workers, ops))
    threads = sum(rates["threads"]) / 2
    aio = sum(rates["aiobotocore"]) / 2
    return {
        "delay_ms": delay_ms,
        "workers": workers,
        "ops": ops,
        "threads_ops_per_s": round(threads, 1),
        "aiobotocore_ops_per_s": round(aio, 1),
        "runs": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
        "ratio": ratio(aio, threads),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=480, help="ops per run (3 requests each)")
    parser.add_argument("--workers", default="8,32")
    parser.add_argument("--delays", default="25,0", help="added latency, ms")
    parser.add_argument("--backend", default="seaweedfs", choices=("seaweedfs", "moto"))
    args = parser.parse_args()
    points = []
    with bench_context(args.backend) as b:
        for delay in (int(d) for d in args.delays.split(",")):
            for n in (int(w) for w in args.workers.split(",")):
                p = point(b, delay, n, args.ops)
                points.append(p)
                say(
                    f"{delay:>2} ms workers={n:>2}: threads {p['threads_ops_per_s']:7.1f} "
                    f"ops/s, aiobotocore {p['aiobotocore_ops_per_s']:7.1f} ops/s, "
                    f"ratio {fmt(p['ratio'])}  runs {p['runs']}"
                )
    print(json.dumps({"machine": machine(), "points": points}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
