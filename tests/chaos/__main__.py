"""``python -m tests.chaos``: one chaos run (``tests/chaos/harness.py``); exits 1 on any
violation of an invariant."""

from __future__ import annotations

import argparse
import json
import sys

from objmanifest.local import servers
from tests.chaos.agent import BROKEN
from tests.chaos.harness import Harness, Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=" ".join(__doc__.split()) if __doc__ else None
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=servers.BACKENDS, default="seaweedfs")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of chaos")
    parser.add_argument(
        "--entries", type=int, default=0, help="raw records (default: 2.5 per second of duration)"
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--lease", type=float, default=4.0, help="lease seconds")
    parser.add_argument("--skewed", type=int, default=2, help="agents under libfaketime")
    parser.add_argument(
        "--shells", type=int, default=2, help="agents making every call from a new Task"
    )
    parser.add_argument(
        "--intensity", type=float, default=1.0, help="every fault's probability times this"
    )
    parser.add_argument(
        "--broken", choices=sorted(BROKEN), help="agents run a deliberately broken variant"
    )
    parser.add_argument("--work-dir", help="where the agents' logs go (default: a temp dir)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    settings = Settings(
        seed=args.seed,
        backend=args.backend,
        duration=args.duration,
        entries=args.entries,
        agents=args.agents,
        lease_seconds=args.lease,
        skewed=args.skewed,
        shells=args.shells,
        intensity=args.intensity,
        broken=args.broken,
        work_dir=args.work_dir,
    )
    report = Harness(settings).run()
    for line in report.lines():
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
