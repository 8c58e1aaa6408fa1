"""Requests per produced entry, with the journal on, counted at an HTTP proxy.

One agent produces ``--entries`` small entries of one stage (claim, put) through the fault
proxy of ``tests/faults.py`` in front of a local server, which logs every request it
forwards. Declaring the entries and creating the task happen before counting starts and
are excluded; everything a produced entry costs is included: the claim's conditional GET
and PUT of the shard, the data PUT, the ready PUT, and the journal block PUTs (amortised:
one per ``cas.BLOCK`` versions of the shard), waited for at the end.

    python bench/request_count.py --backend seaweedfs --entries 200
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from objmanifest import cas, servers
from tests.faults import FaultProxy


def kind(method: str, target: str) -> str:
    """What one logged request was, by its method and the key it names."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
    if "/journal/" in path:
        what = "journal block"
    elif "/shards/" in path:
        what = "shard"
    elif "/data/" in path:
        what = "data"
    elif path.endswith("/index.json"):
        what = "index"
    else:
        what = "other"
    return f"{method} {what}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--entries", type=int, default=200)
    args = parser.parse_args()

    with servers.start(args.backend) as local, FaultProxy(local.endpoint_url) as proxy:
        local.create_bucket("bench")
        os.environ.update(local.env())
        store = om.connect("s3://bench/requests", endpoint_url=proxy.endpoint_url)
        task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
        task.declare_many([(f"file/{i:05d}", "s") for i in range(args.entries)])
        agent = task.agent("producer")
        before = len(proxy.requests)
        produced = 0
        while (claim := agent.claim(stage="s")) is not None:
            agent.put(claim, f"bytes of {claim.file_id}\n".encode())
            produced += 1
        task.flush_journal()
        counted = proxy.requests[before:]
        # The last claim found nothing to claim: its GET (and nothing else) is not an entry's.
        blocks = len(list(store.list(task.layout.journal_prefix)))

    kinds = Counter(kind(method, target) for method, target in counted)
    total = len(counted)
    print(
        f"backend={args.backend} entries={produced} journal block size={cas.BLOCK} "
        f"blocks stored={blocks}"
    )
    print("excluded: task creation, declaring the entries; included: everything after")
    print("| request | count | per entry |")
    print("|---|---|---|")
    for name, n in sorted(kinds.items()):
        print(f"| {name} | {n} | {n / produced:.3f} |")
    print(f"| all | {total} | {total / produced:.3f} |")


if __name__ == "__main__":
    main()
