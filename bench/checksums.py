"""Checksums: xxh3-128 (what objmanifest verifies every read with) next to SHA-256 and to a
plain read of the same memory (``bytes.find`` of a byte that is not there: one pass at
memory speed), over one buffer, in 1 MiB blocks as a transfer feeds them, best of a few
passes each.

    python bench/checksums.py --mib 256
    python -m bench --only checksums
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import xxhash

from bench.common import fmt, say

MiB = 1024 * 1024
BLOCK = MiB


def _xxh3(view: memoryview) -> None:
    h = xxhash.xxh3_128()
    for i in range(0, len(view), BLOCK):
        h.update(view[i : i + BLOCK])
    h.digest()


def _sha256(view: memoryview) -> None:
    h = hashlib.sha256()
    for i in range(0, len(view), BLOCK):
        h.update(view[i : i + BLOCK])
    h.digest()


def _read(view: memoryview) -> None:
    data = view.obj
    assert isinstance(data, bytes)
    for i in range(0, len(data), BLOCK):
        data.find(b"\xff", i, i + BLOCK)


def run(mib: int = 256, passes: int = 3) -> dict[str, Any]:
    data = os.urandom(MiB) * mib  # random bytes, so nothing is cheaper for being regular
    data = data.replace(b"\xff", b"\xfe")  # the plain read must not find its byte
    view = memoryview(data)
    ways: dict[str, Callable[[memoryview], None]] = {
        "memory read": _read,
        "xxh3-128": _xxh3,
        "SHA-256": _sha256,
    }
    rows = {}
    for name, fn in ways.items():
        best = float("inf")
        for _ in range(passes):
            t0 = time.perf_counter()
            fn(view)
            best = min(best, time.perf_counter() - t0)
        rows[name] = round(mib / 1024 / best, 3)  # GiB/s
    result = {
        "mib": mib,
        "gib_per_s": rows,
        "xxh3_vs_sha256": round(rows["xxh3-128"] / rows["SHA-256"], 2),
        "xxh3_vs_memory_read": round(rows["xxh3-128"] / rows["memory read"], 2),
    }
    say(
        "checksums GiB/s: "
        + ", ".join(f"{k} {fmt(v)}" for k, v in rows.items())
        + f"; xxh3 / SHA-256 = {result['xxh3_vs_sha256']}"
    )
    return result


def table(result: dict[str, Any]) -> str:
    read = result["gib_per_s"]["memory read"]
    lines = ["| pass over the buffer | GiB/s | vs memory read |", "|---|---:|---:|"]
    for name, speed in result["gib_per_s"].items():
        lines.append(f"| {name} | {fmt(speed)} | {fmt(speed / read)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    result = run(args.mib)
    print(f"{args.mib} MiB in {BLOCK // MiB} MiB blocks, best of 3 passes")
    print(table(result))


if __name__ == "__main__":
    main()
