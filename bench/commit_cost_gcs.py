"""The cost of one uncontended manifest commit on GCS next to one raw conditional write of the
same backend, on fake-gcs-server (started here) or any GCS JSON API endpoint:

    python bench/commit_cost_gcs.py --rounds 300 --runs 3

As ``bench/commit_cost.py`` does for S3: a commit is ``agent.renew(claim)`` on a warm cache
(build and encode the shard, one multipart upload with ``ifGenerationMatch`` and its MD5 and
CRC32C); the peer is the SDK's own ``upload_from_string(..., if_generation_match=G)`` of the
very bytes that commit wrote, through the same client (a multipart upload with the CRC32C the
SDK adds). Odd rounds put the raw write first. The ratio is the median of the runs' ratios
(median commit over median raw write), with a paired ratio beside it (1 + the median of each
round's difference, over the median raw write). Where the difference goes is split in two:
the store's write inside the commit (``GCSStore.put``, timed on the committing thread) next
to the raw write, and the library's work around it (the commit's time outside that write:
the change, the encoding, the journal record).

``--without-journal`` is an experiment, not an option of the product: the shards' codec then
keeps no journal (no record per commit, none carried in the shard), which shows what the
journal costs a commit, and what is left of the library's work without it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import fmt, ms, new_prefix, pct, say
from objmanifest.cas.codecs import VersionedCodec
from objmanifest.local.fakegcs import start_fakegcs
from objmanifest.store.gcs import GCSStore
from objmanifest.store.gcs_client import make_gcs_client
from tests.support.internals import engine

BUCKET = "objmanifest-bench"


def without_journal() -> None:
    """The experiment of ``--without-journal``: every shard's codec says it has no journal."""
    VersionedCodec.journal = lambda self, doc: None  # type: ignore[method-assign]


def one_run(endpoint: str, rounds: int, entries: int) -> dict[str, Any]:
    store = GCSStore(make_gcs_client(endpoint), BUCKET, new_prefix("commit"))
    task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
    task.declare_many([(f"file/{i:05d}", "s") for i in range(entries)])
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    key, codec = engine(task).layout.shard(claim.shard), engine(task).codec(claim.shard)

    def written() -> bytes:
        return codec.encode(engine(task).docs.cached(key, codec))

    raw = store.blob("raw/object.json")
    raw.upload_from_string(written(), content_type="application/json", if_generation_match=0)
    generation = int(raw.generation)

    committer = threading.get_ident()
    writes: list[float] = []
    put = store.put

    def timed_put(*args: Any, **kwargs: Any) -> str:
        """The store's write, timed on the committing thread (not the journal's writer)."""
        t0 = time.perf_counter()
        etag = put(*args, **kwargs)
        if threading.get_ident() == committer:
            writes.append(time.perf_counter() - t0)
        return etag

    store.put = timed_put  # type: ignore[method-assign]

    def raw_put(body: bytes, generation: int) -> int:
        raw.upload_from_string(
            body, content_type="application/json", if_generation_match=generation
        )
        return int(raw.generation)

    for _ in range(5):  # warm every path
        agent.renew(claim)
        generation = raw_put(written(), generation)

    commit_s, raw_s, sizes = [], [], []
    writes.clear()
    for n in range(rounds):
        if n % 2:
            body = written()
            t0 = time.perf_counter()
            generation = raw_put(body, generation)
            t1 = time.perf_counter()
            agent.renew(claim)
            t2 = time.perf_counter()
            raw_t, commit_t = t1 - t0, t2 - t1
        else:
            t0 = time.perf_counter()
            agent.renew(claim)
            t1 = time.perf_counter()
            body = written()
            t2 = time.perf_counter()
            generation = raw_put(body, generation)
            t3 = time.perf_counter()
            commit_t, raw_t = t1 - t0, t3 - t2
        commit_s.append(commit_t)
        raw_s.append(raw_t)
        sizes.append(len(body))
    task.flush_journal()
    commit_med, raw_med = statistics.median(commit_s), statistics.median(raw_s)
    extra = statistics.median(c - r for c, r in zip(commit_s, raw_s, strict=True))
    assert len(writes) == rounds, "one store write per commit"
    around = statistics.median(c - w for c, w in zip(commit_s, writes, strict=True))
    return {
        "shard_bytes": [min(sizes), max(sizes)],
        "commit_median_ms": ms(commit_med),
        "commit_p90_ms": ms(pct(commit_s, 90)),
        "raw_median_ms": ms(raw_med),
        "raw_p90_ms": ms(pct(raw_s, 90)),
        "store_write_ms": ms(statistics.median(writes)),
        "library_ms": ms(around),
        "ratio": round(commit_med / raw_med, 3),
        "paired_ratio": round(1 + extra / raw_med, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--endpoint-url", default=None, help="a GCS endpoint (default: start one)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument(
        "--without-journal",
        action="store_true",
        help="an experiment: commits keep no journal (what the journal costs a commit)",
    )
    args = parser.parse_args()
    if args.without_journal:
        without_journal()
    local = None if args.endpoint_url else start_fakegcs()
    endpoint = args.endpoint_url or local.endpoint_url  # type: ignore[union-attr]
    try:
        if local is not None:
            local.create_bucket(BUCKET)
        runs = []
        for i in range(args.runs):
            r = one_run(endpoint, args.rounds, args.entries)
            runs.append(r)
            say(f"run {i + 1}: {r}")
    finally:
        if local is not None:
            local.stop()
    print(
        f"backend={'fakegcs' if local else endpoint} rounds={args.rounds} runs={args.runs}"
        + (" without the journal (an experiment)" if args.without_journal else "")
    )
    print(
        "| run | shard bytes | commit median ms (p90) | raw write median ms (p90) | "
        "the commit's store write, median ms | library work around it, median ms | ratio | "
        "paired |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(runs, 1):
        low, high = r["shard_bytes"]
        print(
            f"| {i} | {low}-{high} | {fmt(r['commit_median_ms'])} ({fmt(r['commit_p90_ms'])}) | "
            f"{fmt(r['raw_median_ms'])} ({fmt(r['raw_p90_ms'])}) | {fmt(r['store_write_ms'])} | "
            f"{fmt(r['library_ms'])} | {fmt(r['ratio'])} | {fmt(r['paired_ratio'])} |"
        )
    ratio = statistics.median(r["ratio"] for r in runs)
    paired = statistics.median(r["paired_ratio"] for r in runs)
    print(f"| **median of runs** | | | | | | **{fmt(ratio)}** | **{fmt(paired)}** |")


if __name__ == "__main__":
    main()
