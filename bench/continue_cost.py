"""What botocore's ``Expect: 100-continue`` costs a PUT, side by side in one run.

botocore turns the bytes body of every ``PutObject`` and ``UploadPart`` into a file and asks
``Expect: 100-continue``: the client sends the headers, waits for the store's ``100
Continue``, then sends the body. The store's client (``om.store.make_client``) sends a body
below ``CONTINUE_THRESHOLD`` (2 MiB) at once. Measured here, interleaved, at each delay
(the suite's latency proxy adds the delay to every request and to every ``100 Continue``,
as a store that far away would):

- a raw conditional PUT of a shard-sized body (30 KB), botocore's way and the store's way;
- a manifest commit (``renew`` on a warm cache), through a client that keeps the header and
  through the store's own.

    python bench/continue_cost.py --delays 0,25 --rounds 60
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import Bench, bench_context, new_prefix, say
from objmanifest.store import make_client
from objmanifest.store.s3_client import CONTINUE_HANDLERS

BODY = b"x" * 30_000


def botocore_default(endpoint: str) -> Any:
    """The store's client with botocore's own ``Expect`` on every PUT, as before."""
    client = make_client(endpoint)
    for operation, unique_id in CONTINUE_HANDLERS.items():
        client.meta.events.unregister(f"before-sign.s3.{operation}", unique_id=unique_id)
    return client


def measure(b: Bench, delay_ms: int, rounds: int) -> dict[str, Any]:
    endpoint = b.endpoint(delay_ms)
    clients = {
        "botocore's Expect": botocore_default(endpoint),
        "sent at once": make_client(endpoint),
    }
    steps: dict[str, Callable[[], None]] = {}
    for way, client in clients.items():
        key = f"{new_prefix('continue')}/raw"
        etag = [client.put_object(Bucket=b.bucket, Key=key, Body=BODY)["ETag"]]

        def raw(client: Any = client, key: str = key, etag: list[str] = etag) -> None:
            etag[0] = client.put_object(Bucket=b.bucket, Key=key, Body=BODY, IfMatch=etag[0])[
                "ETag"
            ]

        store = om.connect(f"s3://{b.bucket}/{new_prefix('continue')}", client=client)
        task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
        task.declare_many([(f"file/{i:05d}", "s") for i in range(100)])
        agent = task.agent("bench")
        claim = agent.claim(stage="s")
        assert claim is not None

        def commit(agent: om.Agent = agent, claim: om.Claim = claim) -> None:
            agent.renew(claim)

        steps[f"raw conditional PUT, {way}"] = raw
        steps[f"manifest commit, {way}"] = commit
    for step in steps.values():  # warm every path
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for n in range(rounds):
        for name in names if n % 2 else reversed(names):
            began = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - began)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    return {"delay_ms": delay_ms, "rounds": rounds, "median_ms": medians}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--delays", default="0,25", help="added ms, e.g. 0,25,60")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    args = parser.parse_args(argv)
    delays = [int(x) for x in args.delays.split(",") if x.strip()]
    with bench_context(args.backend) as b:
        results = [measure(b, d, args.rounds) for d in delays]
    say(f"{args.backend}, {args.rounds} rounds each, interleaved")
    print("| delay | what | botocore's Expect, median ms | sent at once, median ms | ratio |")
    print("|---:|---|---:|---:|---:|")
    for r in results:
        m = r["median_ms"]
        for what in ("raw conditional PUT", "manifest commit"):
            before, after = m[f"{what}, botocore's Expect"], m[f"{what}, sent at once"]
            print(
                f"| {r['delay_ms']} ms | {what} | {before:.2f} | {after:.2f} "
                f"| {after / before:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
