"""Requests per produced (and consumed) entry, with the journal on, counted at an HTTP proxy.

Through the fault proxy of ``tests/support/faults.py`` in front of the server, which logs every
request it forwards, one agent produces ``--entries`` small entries of one stage one by
one (``claim(stage=)`` + ``put``), then (when this objmanifest has ``put_many``) as many
again in batches (``claim_many`` + ``put_many``), and a consumer consumes the first ones
(``consume``). Creating the task and declaring the entries happen before counting and are
excluded; everything an entry costs is included: the claim's conditional GET and PUT of the
shard, the data PUT, the ready PUT, the journal block PUTs (waited for at the end of each
phase), the consume's reads and its PUT. The limit for claim + put is 3 requests: the claim's
PUT, the data PUT, the ready PUT; the table says where every other request goes.

    python bench/request_count.py --backend seaweedfs --entries 200
    python -m bench --only requests
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import Bench, bench_context, fmt, layout_support, new_prefix, say
from objmanifest.cas.blocks import BLOCK
from tests.support.faults import FaultProxy
from tests.support.internals import engine

LIMIT = 3
"""Requests a produced entry cannot do without: the claim's PUT, the data PUT, the ready PUT."""


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
    elif path.endswith("/task.json"):
        what = "header"
    else:
        what = "other"
    return f"{method} {what}"


def _phase(name: str, counted: list[tuple[str, str]], entries: int) -> dict[str, Any]:
    kinds = Counter(kind(method, target) for method, target in counted)
    return {
        "phase": name,
        "entries": entries,
        "requests": len(counted),
        "per_entry": round(len(counted) / entries, 3) if entries else None,
        "kinds": {k: {"count": n, "per_entry": round(n / entries, 3)} for k, n in kinds.items()},
    }


def run(b: Bench, entries: int = 200, batch: int = 100) -> dict[str, Any]:
    """Count the requests of each phase (see the module's docstring)."""
    with FaultProxy(b.endpoint_url, keep_upstream=True) as proxy:
        prefix = new_prefix("requests")
        store = b.store(prefix, endpoint=proxy.endpoint_url)
        task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
        many = layout_support()["put_many"]
        total = entries * (2 if many else 1)
        task.declare_many([(f"file/{i:05d}", "s") for i in range(total)])
        agent = task.agent("producer")
        phases = []

        start = len(proxy.requests)
        produced = []
        for _ in range(entries):
            claim = agent.claim(stage="s")
            assert claim is not None
            agent.put(claim, f"bytes of {claim.file_id}\n".encode())
            produced.append(claim.file_id)
        task.flush_journal()
        phases.append(_phase("claim + put", proxy.requests[start:], entries))

        if many:
            start = len(proxy.requests)
            made = 0
            while made < entries:
                claims = agent.claim_many("s", limit=min(batch, entries - made))
                assert claims
                results = agent.put_many(claims, [b"x" * 100] * len(claims))  # type: ignore[attr-defined]
                made += sum(1 for r in results if not isinstance(r, BaseException))
            task.flush_journal()
            phases.append(_phase(f"claim_many + put_many ({batch})", proxy.requests[start:], made))

        consumer = task.agent("consumer")
        start = len(proxy.requests)
        for file_id in produced:
            consumer.consume(file_id)
        task.flush_journal()
        phases.append(_phase("consume", proxy.requests[start:], len(produced)))

        blocks = len(list(store.list_keys(engine(task).layout.journal_prefix)))

    first = phases[0]
    result = {
        "entries": entries,
        "journal_block_size": BLOCK,
        "journal_blocks": blocks,
        "limit": LIMIT,
        "phases": phases,
        "claim_put_per_entry": first["per_entry"],
        "claim_put_vs_limit": round(first["per_entry"] / LIMIT, 3),
        "claim_put_extras": extras(first),
    }
    for p in phases:
        say(f"requests {p['phase']}: {fmt(p['per_entry'], 3)} per entry ({p['requests']})")
    return result


NEEDED = {"PUT shard": 2.0, "PUT data": 1.0}
"""The limit's three requests of a produced entry, by kind."""


def extras(phase: dict[str, Any]) -> dict[str, float]:
    """Where the requests of a claim + put phase beyond the limit went, per entry."""
    out = {}
    for k, v in phase["kinds"].items():
        extra = v["per_entry"] - NEEDED.get(k, 0.0)
        if extra > 0.0005:
            out[k] = round(extra, 3)
    return out


def table(result: dict[str, Any]) -> str:
    """The Markdown table of a run: one column per phase, one row per kind of request."""
    phases = result["phases"]
    kinds = sorted({k for p in phases for k in p["kinds"]})
    head = "| request | " + " | ".join(f"{p['phase']} (per entry)" for p in phases) + " |"
    lines = [head, "|---|" + "---:|" * len(phases)]
    for k in kinds:
        cells = [fmt(p["kinds"].get(k, {}).get("per_entry", 0.0), 3) for p in phases]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{fmt(p['per_entry'], 3)}**" for p in phases))
    lines[-1] += " |"
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--endpoint-url", default=None, help="any S3 (default: start one)")
    parser.add_argument("--entries", type=int, default=200)
    args = parser.parse_args()
    with bench_context(args.backend, args.endpoint_url) as b:
        result = run(b, args.entries)
    print(f"backend={b.backend} entries={args.entries} journal block size={BLOCK}")
    print("excluded: task creation, declaring the entries; included: everything after")
    print(table(result))


if __name__ == "__main__":
    main()
