"""The cost of one uncontended manifest commit next to one raw conditional PUT.

Both run in the same process against the same server, interleaved, so the ratio is fair:

    python bench/commit_cost.py --backend seaweedfs --rounds 300

A commit here is ``agent.renew(claim)`` on a warm cache: encode the shard, one PUT with
``If-Match`` (and its ``Content-MD5``). The peer is ``put_object(IfMatch=...)`` of a body of
the same size; a second peer adds the ``Content-MD5`` header (computed each time), which
shows what the digest itself costs (the client's MD5 and the store's check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

import objmanifest as om
from objmanifest import checksum, servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--entries", type=int, default=100, help="entries in the shard")
    args = parser.parse_args()

    with servers.start(args.backend) as local:
        local.create_bucket("bench")
        os.environ.update(local.env())
        store = om.connect("s3://bench/commit", endpoint_url=local.endpoint_url)
        task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
        task.declare_many([(f"file/{i:05d}", "s") for i in range(args.entries)])
        agent = task.agent("bench")
        claim = agent.claim(stage="s")
        assert claim is not None
        body = task.codec("s").encode(task.shard("s"))
        client = store.client
        key = store.full_key("raw/object.json")
        etag = client.put_object(Bucket="bench", Key=key, Body=body)["ETag"]

        ops: Counter[str] = Counter()

        def count(model: object, **_: object) -> None:
            ops[getattr(model, "name", "?")] += 1

        def raw_md5(etag: str) -> str:
            md5 = checksum.content_md5(body)
            return client.put_object(
                Bucket="bench", Key=key, Body=body, IfMatch=etag, ContentMD5=md5
            )["ETag"]

        commit_s, raw_s, md5_s = [], [], []
        for _ in range(5):  # warm every path
            agent.renew(claim)
            etag = client.put_object(Bucket="bench", Key=key, Body=body, IfMatch=etag)["ETag"]
            etag = raw_md5(etag)
        client.meta.events.register("before-call.s3", count)
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            agent.renew(claim)
            t1 = time.perf_counter()
            etag = client.put_object(Bucket="bench", Key=key, Body=body, IfMatch=etag)["ETag"]
            t2 = time.perf_counter()
            etag = raw_md5(etag)
            t3 = time.perf_counter()
            commit_s.append(t1 - t0)
            raw_s.append(t2 - t1)
            md5_s.append(t3 - t2)
        client.meta.events.unregister("before-call.s3", count)

    def ms(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if q < 100 else max(xs) * 1000

    commit_med, raw_med = statistics.median(commit_s) * 1000, statistics.median(raw_s) * 1000
    md5_med = statistics.median(md5_s) * 1000
    print(
        f"backend={args.backend} rounds={args.rounds} shard_entries={args.entries} "
        f"shard_bytes={len(body)}"
    )
    print(
        f"requests per round: {dict(ops)} over {args.rounds} rounds "
        f"(commit PUTs + two raw PUTs; no GETs means every commit was one PUT)"
    )
    print("| what | median ms | p90 ms |")
    print("|---|---|---|")
    print(f"| manifest commit (renew, warm) | {commit_med:.2f} | {ms(commit_s, 90):.2f} |")
    print(f"| raw conditional PUT, same size | {raw_med:.2f} | {ms(raw_s, 90):.2f} |")
    print(f"| raw conditional PUT with Content-MD5 | {md5_med:.2f} | {ms(md5_s, 90):.2f} |")
    print(f"| ratio commit / raw (median) | {commit_med / raw_med:.2f} | |")
    print(f"| ratio raw with Content-MD5 / raw (median) | {md5_med / raw_med:.2f} | |")


if __name__ == "__main__":
    main()
