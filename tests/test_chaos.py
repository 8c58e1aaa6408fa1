"""A bounded chaos run on every S3 server, with fixed seeds: a three-stage pipeline of agent
processes through the seeded fault schedule of the proxy, agents killed, stopped past their
lease and resumed, two on a skewed clock; the checker and the pipeline's own invariants
must find no violation (``tests/chaos/``, where ``python -m tests.chaos`` runs longer ones).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.chaos.harness import Endpoint, Harness, Settings
from tests.support.faults import CHAOS_KINDS, Chaos
from tests.support.stores import Server, backends, running

pytestmark = pytest.mark.chaos

SEEDS = {"moto": 11, "seaweedfs": 12}
"""One fixed seed per server (``python -m tests.chaos --seed N`` replays the schedule)."""


def test_the_schedule_draws_every_fault_from_its_seed() -> None:
    chaos = Chaos(7)
    draws = [chaos.draw(n, "PUT", "/b/k", has_body=True) for n in range(4000)]
    assert draws == [chaos.draw(n, "PUT", "/b/k", has_body=True) for n in range(4000)]
    assert draws != [Chaos(8).draw(n, "PUT", "/b/k", has_body=True) for n in range(4000)]
    kinds = {fault for _, fault in draws} | {"latency" if any(d for d, _ in draws) else ""}
    assert kinds >= set(CHAOS_KINDS)
    assert all(0 <= delay <= chaos.max_latency for delay, _ in draws)
    # Damage only where it may go: bodies, and on the targets named.
    only_data = Chaos(7, damage_paths=("/data/",))
    for n in range(4000):
        assert only_data.draw(n, "GET", "/b/data/x", has_body=False)[1] not in ("truncate", "flip")
        assert only_data.draw(n, "PUT", "/b/shards/x", has_body=True)[1] not in ("truncate", "flip")
    with pytest.raises(ValueError, match="sum to at most 1"):
        Chaos(1, reset=0.6, lost=0.6)


@pytest.mark.one_server  # the faults are the proxy's, not the server's
def test_a_pipeline_under_chaos_breaks_no_invariant(server: Server, tmp_path: object) -> None:
    settings = Settings(
        seed=SEEDS.get(server.name, 13),
        backend=server.name,
        duration=20.0,
        entries=36,
        agents=6,
        skewed=2,
        calm_timeout=240.0,
        work_dir=str(tmp_path),
    )
    out = io.StringIO()
    report = Harness(settings, out=out).run(Endpoint(server.endpoint_url, server.env))
    summary = "\n".join([out.getvalue(), *report.lines()])
    assert report.violations == [], summary
    assert report.finished, summary
    assert report.states == {"consumed": report.entries}, summary
    # The chaos happened: agents killed and stopped past their lease, faults of most kinds.
    assert report.kills >= 1 and report.zombies >= 1, summary
    assert len(report.skewed) == 2, summary
    # Agents making every call from a new Task (as CLI steps do) did their share.
    assert len(report.shells) == 2, summary
    # Each ran and asked the store for work; together they produced entries. (One of them
    # alone may land no put in the run's 20 s: the chaos may stop or kill it, and the
    # agents that keep one Task win the races on a busy machine.)
    done = {
        name: [
            json.loads(line)
            for log in Path(str(tmp_path)).glob(f"{name}.*.jsonl")
            for line in log.read_text().splitlines()
        ]
        for name in report.shells
    }
    for name, records in done.items():
        assert any("intent" in d for d in records), f"{name} never called the store"
    puts = [d for records in done.values() for d in records]
    assert any(d.get("op") == "put" and d.get("outcome") == "ok" for d in puts), summary
    injected = {k for k, n in report.faults.items() if n and k != "requests"}
    assert injected >= {"latency", "reset", "slowdown", "error500", "error500_applied", "lost"}
    assert len(report.invariants) >= 14, summary


@pytest.mark.parametrize("name", backends()[:1])  # one server is enough to be caught on
def test_a_lease_judged_on_the_local_clock_is_caught(name: str, tmp_path: object) -> None:
    """The same run with every agent judging leases on its own clock (a broken variant,
    ``agent.BROKEN``), every agent minutes off: an agent ahead of another takes over leases
    that have not ended, and the checker says so."""
    server: Server = running(name)
    settings = Settings(
        seed=6,
        backend=name,
        duration=15.0,
        entries=24,
        agents=9,
        skewed=9,
        broken="local-clock",
        calm_timeout=240.0,
        work_dir=str(tmp_path),
    )
    out = io.StringIO()
    report = Harness(settings, out=out).run(Endpoint(server.endpoint_url, server.env))
    summary = "\n".join([out.getvalue(), *report.lines()])
    stolen = [v for v in report.violations if v.startswith("checker: lease-stolen")]
    assert stolen, summary
