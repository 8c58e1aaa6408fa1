"""What the store probe costs ``Task.create``: the probe asked every time (as the first
create of a process does) next to a create whose store this process has found safe, and a
plain create-only PUT of the header alone, interleaved, against a local server.

    python bench/probe_cost.py --backend seaweedfs --rounds 25
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from objmanifest.local import servers
from objmanifest.store import CREATE, probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=servers.BACKENDS, default="seaweedfs")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    with servers.start(args.backend) as local:
        local.create_bucket("bench")
        os.environ.update({k: v for k, v in local.env().items() if k != "AWS_ENDPOINT_URL"})
        store = om.connect("s3://bench/probe", endpoint_url=local.endpoint_url)

        def probed() -> None:
            probe._VERIFIED.clear()  # as the first create of a process
            om.Task.create(store, f"t{uuid.uuid4().hex[:12]}", stages=["a"])

        def verified() -> None:
            om.Task.create(store, f"t{uuid.uuid4().hex[:12]}", stages=["a"])

        def header_only() -> None:
            store.put(f"h{uuid.uuid4().hex[:12]}/task.json", b"{}", mode=CREATE)

        runs: dict[str, tuple[Callable[[], None], list[float]]] = {
            "Task.create, probe asked": (probed, []),
            "Task.create, store already found safe": (verified, []),
            "one create-only PUT (the header alone)": (header_only, []),
        }
        for _ in range(args.rounds):
            for run, times in runs.values():
                began = time.perf_counter()
                run()
                times.append(time.perf_counter() - began)
        print(f"{args.backend}, {args.rounds} rounds, racers {probe.RACERS}")
        print("| what | mean ms | median ms | max ms |\n|---|---|---|---|")
        for name, (_, times) in runs.items():
            ms = [t * 1000 for t in times]
            print(
                f"| {name} | {statistics.mean(ms):.1f} | {statistics.median(ms):.1f} "
                f"| {max(ms):.0f} |"
            )


if __name__ == "__main__":
    main()
