"""The cost of one uncontended manifest commit on ``file://`` next to a raw locked replace of
the same bytes in the same directory.

    python bench/file_commit_cost.py --rounds 300 --runs 3 [--dir /mnt/share/bench]

A commit is ``agent.renew(claim)`` on a warm cache (build and encode the shard, one
update-if-match of ``FileStore``: the new version written to a temporary file and
``fsync``-ed, the lock taken, the current version's header read, a rename, the directory
``fsync``-ed). Its peer is what a careful program does to replace a file under a lock with
the same durability: an open file description lock, the very bytes the commit wrote to a
temporary file, ``fsync``, rename, ``fsync`` of the directory, unlock. A second peer skips
both ``fsync`` calls (not durable: shown for what the disk's flushes cost), and a third is
``FileStore.put`` of the same bytes with update-if-match (the store's share of a commit,
without the manifest's). Odd rounds run the peers first. The ratio is the median of the
runs' ratios (median commit over median raw replace), with the paired ratio as in
``commit_cost.py``.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import fmt, ms, pct, say
from objmanifest.store import PutMode
from objmanifest.store.file import FileStore
from objmanifest.store.file_io import FLOCK
from tests.support.internals import engine


class RawReplace:
    """A file replaced whole under an open file description lock, as a program of its own
    would do it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.target = directory / ".raw.json"  # a dot: outside the key space
        self.temp = directory / ".raw.json.tmp"
        self.lock = os.open(directory / ".raw.lock", os.O_RDWR | os.O_CREAT, 0o666)

    def replace(self, body: bytes, durable: bool = True) -> None:
        fcntl.fcntl(self.lock, fcntl.F_OFD_SETLKW, FLOCK.pack(fcntl.F_WRLCK, 0, 0, 1, 0))
        try:
            fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                os.write(fd, body)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(self.temp, self.target)
            if durable:
                directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        finally:
            fcntl.fcntl(self.lock, fcntl.F_OFD_SETLKW, FLOCK.pack(fcntl.F_UNLCK, 0, 0, 1, 0))


def one_run(base: Path, rounds: int, entries: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="commit-", dir=base))
    store = FileStore(str(root))
    task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
    task.declare_many([(f"file/{i:05d}", "s") for i in range(entries)])
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    key, codec = engine(task).layout.shard(claim.shard), engine(task).codec(claim.shard)
    # The raw file lives where the shard does: the same directory, the same filesystem.
    raw = RawReplace(Path(os.fsdecode(os.path.dirname(store.object_path(key)))))

    def written() -> bytes:
        """The body of the version the last commit wrote (encoded again, untimed)."""
        return codec.encode(engine(task).docs.cached(key, codec))

    peer_key = f"{key}.peer"
    etag = store.put(peer_key, written())

    def store_put(body: bytes) -> None:
        nonlocal etag
        etag = store.put(peer_key, body, mode=PutMode.update(etag))

    for _ in range(5):  # warm every path
        agent.renew(claim)
        raw.replace(written())
        raw.replace(written(), durable=False)
        store_put(written())

    commit_s, raw_s, fast_s, put_s, sizes = [], [], [], [], []
    for n in range(rounds):
        body = written()
        steps: list[Callable[[], object]] = [
            partial(agent.renew, claim),
            partial(raw.replace, body),
            partial(raw.replace, body, durable=False),
            partial(store_put, body),
        ]
        times = {}
        for i in [1, 2, 3, 0] if n % 2 else [0, 1, 2, 3]:  # the peers first in odd rounds
            t0 = time.perf_counter()
            steps[i]()
            times[i] = time.perf_counter() - t0
        commit_s.append(times[0])
        raw_s.append(times[1])
        fast_s.append(times[2])
        put_s.append(times[3])
        sizes.append(len(body))
    task.flush_journal()
    commit_med, raw_med, fast_med, put_med = (
        statistics.median(x) for x in (commit_s, raw_s, fast_s, put_s)
    )
    extra = statistics.median(c - r for c, r in zip(commit_s, raw_s, strict=True))
    return {
        "rounds": rounds,
        "shard_entries": entries,
        "shard_bytes": [min(sizes), max(sizes)],
        "commit_median_ms": ms(commit_med),
        "commit_p90_ms": ms(pct(commit_s, 90)),
        "raw_median_ms": ms(raw_med),
        "raw_p90_ms": ms(pct(raw_s, 90)),
        "raw_no_fsync_median_ms": ms(fast_med),
        "store_put_median_ms": ms(put_med),
        "ratio": round(commit_med / raw_med, 3),
        "paired_ratio": round(1 + extra / raw_med, 3),
    }


def run(base: Path, rounds: int = 300, runs: int = 3, entries: int = 100) -> dict[str, Any]:
    results = []
    for i in range(runs):
        r = one_run(base, rounds, entries)
        results.append(r)
        say(
            f"file commit cost run {i + 1}: commit {r['commit_median_ms']:.3f} ms, raw locked "
            f"replace {r['raw_median_ms']:.3f} ms (without fsync "
            f"{r['raw_no_fsync_median_ms']:.3f}), FileStore.put {r['store_put_median_ms']:.3f} "
            f"ms, ratio {r['ratio']:.3f}, paired "
            f"{r['paired_ratio']:.3f}"
        )
    return {
        "runs": results,
        "ratio_median": statistics.median(r["ratio"] for r in results),
        "paired_median": statistics.median(r["paired_ratio"] for r in results),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| run | shard bytes | manifest commit median ms (p90) | raw locked replace median ms "
        "(p90) | raw replace without fsync median ms | FileStore.put median ms | commit / raw | "
        "paired |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(result["runs"], 1):
        low, high = r["shard_bytes"]
        lines.append(
            f"| {i} | {low}-{high} | {fmt(r['commit_median_ms'], 3)} "
            f"({fmt(r['commit_p90_ms'], 3)}) | {fmt(r['raw_median_ms'], 3)} "
            f"({fmt(r['raw_p90_ms'], 3)}) | {fmt(r['raw_no_fsync_median_ms'], 3)} | "
            f"{fmt(r['store_put_median_ms'], 3)} | "
            f"{fmt(r['ratio'])} | {fmt(r['paired_ratio'])} |"
        )
    lines.append(
        f"| **median of runs** | | | | | | **{fmt(result['ratio_median'])}** | "
        f"**{fmt(result['paired_median'])}** |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh store")
    parser.add_argument("--entries", type=int, default=100, help="entries in the shard")
    args = parser.parse_args()
    if args.dir:
        base = Path(args.dir)
        base.mkdir(parents=True, exist_ok=True)
        result = run(base, args.rounds, args.runs, args.entries)
    else:
        with tempfile.TemporaryDirectory(prefix="objmanifest-bench-") as temp:
            result = run(Path(temp), args.rounds, args.runs, args.entries)
    print(f"file:// rounds={args.rounds} runs={args.runs} entries={args.entries}")
    print(table(result))


if __name__ == "__main__":
    main()
