"""The cost of one uncontended manifest commit next to one raw conditional PUT.

All run in the same process against the same server, interleaved, so the ratio is fair:

    python bench/commit_cost.py --backend seaweedfs --rounds 300 --runs 3
    python bench/commit_cost.py --backend azurite --rounds 300 --runs 3
    python bench/commit_cost.py --backend fakegcs --rounds 300 --runs 3
    python -m bench --only commit_cost

A commit here is ``agent.renew(claim)`` on a warm cache: build and encode the shard, one PUT
with ``If-Match`` (and its ``Content-MD5``). The peer is ``put_object(IfMatch=...)`` of the
very bytes that commit wrote (same size, same content type, the journal records the shard
carries counted on both sides); a second peer adds the ``Content-MD5`` header (computed each
time), which shows what the digest itself costs. On Azurite the peer is the SDK's own
``upload_blob`` with ``If-Match`` (the commit sends ``Content-MD5`` there too); on
fake-gcs-server the SDK's own ``upload_from_string`` with ``ifGenerationMatch`` and the
CRC32C the SDK adds (what the commit sends; the second peer adds the MD5). Odd rounds
put the raw PUTs first, so neither side always follows the other. Each run is on a fresh
task; the ratio reported is
the median of the runs' ratios (median commit over median raw PUT), and a paired ratio too
(1 + the median of each round's commit minus its raw PUT, over the median raw PUT: the two
of one round ran back to back under the same load, so it shakes less on a busy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import requests
from azure.core import MatchConditions
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContentSettings

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import Bench, bench_context, fmt, ms, new_prefix, pct, say
from objmanifest.core import checksum
from objmanifest.local.azurite import LocalAzurite, start_azurite
from objmanifest.local.fakegcs import LocalGCS, start_fakegcs
from objmanifest.store.azure import AzureStore, connect_azure
from objmanifest.store.gcs import GCSStore
from objmanifest.store.gcs_client import make_gcs_client
from tests.support.internals import engine


@dataclass
class Peer:
    """The raw conditional write a commit is measured against (``put(body, etag, md5)``:
    ``If-Match`` on ``etag``, none for the first; with its ``Content-MD5`` when ``md5``), and
    the requests counted while ``counting(True)``."""

    put: Callable[[bytes, str | None, bool], str]
    ops: Counter[str]
    counting: Callable[[bool], None]


def s3_peer(store: Any) -> Peer:
    client, bucket = store.client, store.bucket
    raw_key = store.full_key("raw/object.json")
    ops: Counter[str] = Counter()

    def put(body: bytes, etag: str | None, md5: bool) -> str:
        extra: dict[str, str] = {"ContentMD5": checksum.content_md5(body)} if md5 else {}
        if etag is not None:
            extra["IfMatch"] = etag
        response = client.put_object(
            Bucket=bucket, Key=raw_key, Body=body, ContentType="application/json", **extra
        )
        return str(response["ETag"])

    def count(model: object, **_: object) -> None:
        ops[getattr(model, "name", "?")] += 1

    def counting(on: bool) -> None:
        if on:
            client.meta.events.register("before-call.s3", count)
        else:
            client.meta.events.unregister("before-call.s3", count)

    return Peer(put, ops, counting)


class CountingTransport(RequestsTransport):
    """requests, counting each request (method and ``comp=``) while ``on``. Like the
    transport ``connect_azure`` gives a store, its session does not look the environment's
    proxy up again on every request (requests' default scans the environment and looks for
    ``.netrc`` each time, a fixed cost that would sit on both sides and flatter the ratio)."""

    def __init__(self) -> None:
        session = requests.Session()
        session.trust_env = False
        super().__init__(session=session, session_owner=True)
        self.ops: Counter[str] = Counter()
        self.on = False

    def send(self, request: Any, **kwargs: Any) -> Any:
        if self.on:
            comp = re.search(r"[?&]comp=(\w+)", request.url)
            self.ops[f"{request.method}{' ' + comp.group(1) if comp else ''}"] += 1
        return super().send(request, **kwargs)


@dataclass
class AzuriteBench:
    """Azurite on loopback, the store a run writes to, and its raw peer: the SDK's own
    ``upload_blob`` of the same bytes with ``If-Match`` (what ``AzureStore.put`` sends)."""

    local: LocalAzurite
    transport: CountingTransport
    backend: str = "azurite"

    def store(self, prefix: str) -> AzureStore:
        return connect_azure(
            "bench",
            prefix,
            connection_string=self.local.connection_string,
            transport=self.transport,
        )

    def peer(self, store: AzureStore) -> Peer:
        blob = store.service.get_blob_client(store.container, store.full_key("raw/object.json"))
        settings = ContentSettings(content_type="application/json")

        def put(body: bytes, etag: str | None, md5: bool) -> str:
            extra: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
            if md5:
                extra["transactional_content_md5"] = hashlib.md5(
                    body, usedforsecurity=False
                ).digest()
            answer = blob.upload_blob(
                body, overwrite=True, content_settings=settings, **(extra if etag else {})
            )
            return str(answer["etag"])

        def counting(on: bool) -> None:
            self.transport.on = on

        self.transport.ops.clear()
        return Peer(put, self.transport.ops, counting)


@contextlib.contextmanager
def azurite_bench() -> Iterator[AzuriteBench]:
    with start_azurite() as local:
        BlobServiceClient.from_connection_string(local.connection_string).create_container("bench")
        yield AzuriteBench(local, CountingTransport())


@dataclass
class FakeGCSBench:
    """fake-gcs-server on loopback, the store a run writes to, and its raw peer: the SDK's
    own ``upload_from_string`` of the same bytes with ``ifGenerationMatch`` through the
    store's client (its session, its pool)."""

    local: LocalGCS
    backend: str = "fakegcs"

    def store(self, prefix: str) -> GCSStore:
        return GCSStore(make_gcs_client(self.local.endpoint_url), "bench", prefix)

    def peer(self, store: GCSStore) -> Peer:
        ops: Counter[str] = Counter()
        on = [False]

        def put(body: bytes, etag: str | None, md5: bool) -> str:
            blob = store.blob("raw/object.json")
            if md5:
                blob.md5_hash = checksum.content_md5(body)
            blob.upload_from_string(
                body,
                content_type="application/json",
                if_generation_match=int(etag) if etag else None,
            )
            return str(blob.generation)

        def count(response: Any, *_: Any, **__: Any) -> None:
            if on[0]:
                ops[response.request.method] += 1

        store.gcs.session.hooks["response"].append(count)

        def counting(state: bool) -> None:
            on[0] = state

        return Peer(put, ops, counting)


@contextlib.contextmanager
def fakegcs_bench() -> Iterator[FakeGCSBench]:
    with start_fakegcs() as local:
        local.create_bucket("bench")
        yield FakeGCSBench(local)


def one_run(b: Bench | AzuriteBench | FakeGCSBench, rounds: int, entries: int) -> dict[str, Any]:
    store = b.store(new_prefix("commit"))
    task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
    task.declare_many([(f"file/{i:05d}", "s") for i in range(entries)])
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    key, codec = engine(task).layout.shard(claim.shard), engine(task).codec(claim.shard)

    def written() -> bytes:
        """The body of the version the last commit wrote (encoded again, untimed)."""
        return codec.encode(engine(task).docs.cached(key, codec))

    if isinstance(b, AzuriteBench):
        peer = b.peer(cast(AzureStore, store))
    elif isinstance(b, FakeGCSBench):
        peer = b.peer(cast(GCSStore, store))
    else:
        peer = s3_peer(store)
    raw_put = peer.put
    etag = raw_put(written(), None, False)

    for _ in range(5):  # warm every path
        agent.renew(claim)
        etag = raw_put(written(), etag, False)
        etag = raw_put(written(), etag, True)

    ops = peer.ops
    commit_s, raw_s, md5_s, sizes = [], [], [], []
    peer.counting(True)
    try:
        for n in range(rounds):
            if n % 2:  # the raw PUTs first, of the last commit's bytes
                body = written()
                t0 = time.perf_counter()
                etag = raw_put(body, etag, False)
                t1 = time.perf_counter()
                etag = raw_put(body, etag, True)
                t2 = time.perf_counter()
                agent.renew(claim)
                t3 = time.perf_counter()
                raw, md5, commit = t1 - t0, t2 - t1, t3 - t2
            else:
                t0 = time.perf_counter()
                agent.renew(claim)
                t1 = time.perf_counter()
                body = written()
                t2 = time.perf_counter()
                etag = raw_put(body, etag, False)
                t3 = time.perf_counter()
                etag = raw_put(body, etag, True)
                t4 = time.perf_counter()
                commit, raw, md5 = t1 - t0, t3 - t2, t4 - t3
            commit_s.append(commit)
            raw_s.append(raw)
            md5_s.append(md5)
            sizes.append(len(body))
    finally:
        peer.counting(False)
    task.flush_journal()
    commit_med, raw_med, md5_med = (statistics.median(x) for x in (commit_s, raw_s, md5_s))
    extra = statistics.median(c - r for c, r in zip(commit_s, raw_s, strict=True))
    return {
        "rounds": rounds,
        "shard_entries": entries,
        "shard_bytes": [min(sizes), max(sizes)],
        "commit_median_ms": ms(commit_med),
        "commit_p90_ms": ms(pct(commit_s, 90)),
        "raw_median_ms": ms(raw_med),
        "raw_p90_ms": ms(pct(raw_s, 90)),
        "raw_md5_median_ms": ms(md5_med),
        "ratio": round(commit_med / raw_med, 3),
        "paired_ratio": round(1 + extra / raw_med, 3),
        "ratio_vs_md5": round(commit_med / md5_med, 3),
        "requests": dict(ops),
    }


def run(
    b: Bench | AzuriteBench | FakeGCSBench, rounds: int = 300, runs: int = 3, entries: int = 100
) -> dict[str, Any]:
    results = []
    for i in range(runs):
        r = one_run(b, rounds, entries)
        results.append(r)
        say(
            f"commit cost run {i + 1}: commit {r['commit_median_ms']:.2f} ms, raw "
            f"{r['raw_median_ms']:.2f} ms (with Content-MD5 {r['raw_md5_median_ms']:.2f}), "
            f"ratio {r['ratio']:.3f}, paired {r['paired_ratio']:.3f}, requests {r['requests']}"
        )
    return {
        "runs": results,
        "ratio_median": statistics.median(r["ratio"] for r in results),
        "paired_median": statistics.median(r["paired_ratio"] for r in results),
        "vs_md5_median": statistics.median(r["ratio_vs_md5"] for r in results),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| run | shard bytes | manifest commit median ms (p90) | raw conditional PUT median ms "
        "(p90) | raw PUT with Content-MD5 median ms | commit / raw | paired | "
        "commit / raw with MD5 | requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(result["runs"], 1):
        reqs = ", ".join(f"{n} {k}" for k, n in sorted(r["requests"].items()))
        low, high = r["shard_bytes"]
        lines.append(
            f"| {i} | {low}-{high} | {fmt(r['commit_median_ms'])} ({fmt(r['commit_p90_ms'])}) "
            f"| {fmt(r['raw_median_ms'])} ({fmt(r['raw_p90_ms'])}) | "
            f"{fmt(r['raw_md5_median_ms'])} | {fmt(r['ratio'])} | {fmt(r['paired_ratio'])} | "
            f"{fmt(r['ratio_vs_md5'])} | {reqs} |"
        )
    lines.append(
        f"| **median of runs** | | | | | **{fmt(result['ratio_median'])}** | "
        f"**{fmt(result['paired_median'])}** | **{fmt(result['vs_md5_median'])}** | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--backend", default="seaweedfs", choices=["seaweedfs", "moto", "azurite", "fakegcs"]
    )
    parser.add_argument("--endpoint-url", default=None, help="any S3 (default: start one)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh task")
    parser.add_argument("--entries", type=int, default=100, help="entries in the shard")
    args = parser.parse_args()
    context: contextlib.AbstractContextManager[Bench | AzuriteBench | FakeGCSBench] = (
        azurite_bench()
        if args.backend == "azurite"
        else fakegcs_bench()
        if args.backend == "fakegcs"
        else bench_context(args.backend, args.endpoint_url)
    )
    with context as b:
        result = run(b, args.rounds, args.runs, args.entries)
    print(f"backend={b.backend} rounds={args.rounds} runs={args.runs} entries={args.entries}")
    print(table(result))


if __name__ == "__main__":
    main()
