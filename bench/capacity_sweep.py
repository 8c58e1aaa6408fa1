"""The capacity sweep: agents, layouts, batch sizes and profiles on the store model, and
its tables and charts for BENCHMARKS.md.

    python -m bench.capacity --sweep [--only SERIES,...]   # -> bench/results/capacity.json
    python -m bench.capacity --report                       # -> BENCHMARKS.md, docs/*.png

Each point is saved as soon as it is measured (a sweep cut short keeps what it has, and
``--only`` runs some series again into the same file). The report goes between
``<!-- capacity:begin -->`` and ``<!-- capacity:end -->`` in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.capacity_run import Plan, partitions_of, run
from bench.common import ROOT, fmt, say
from tests.support.storemodel import PROFILES

RESULTS = ROOT / "bench" / "results" / "capacity.json"
BEGIN, END = "<!-- capacity:begin -->", "<!-- capacity:end -->"
CHARTS = {
    "agents": "docs/capacity_agents.png",
    "partitions": "docs/capacity_partitions.png",
}

S3 = Plan("s3-standard")
SWEEP: dict[str, list[Plan]] = {
    "partitions-100": [
        replace(S3, agents=100, layout="stage"),
        *(replace(S3, agents=100, partitions=n) for n in (4, 16, 64, 256)),
    ],
    "profiles": [Plan(name, agents=1000) for name in ("s3-standard", "s3-express", "gcs", "azure")],
    "partitions-1000": [
        replace(S3, agents=1000, layout="stage"),
        *(replace(S3, agents=1000, partitions=n) for n in (16, 64, 256)),
        replace(S3, agents=1000, partitions=1024, spread=False),
        replace(S3, agents=1000, partitions=1024),
    ],
    "batches": [replace(S3, agents=100, partitions=64, batch=b) for b in (1, 10, 100)],
    "agents": [
        *(replace(S3, agents=n) for n in (10, 100)),  # 1,000: the profiles' first point
        replace(S3, agents=10_000, seconds=3.0),  # some 50,000 entries a second to simulate
    ],
}
"""Every series of the sweep (``auto`` partitions unless a plan names them)."""


def load(path: Path = RESULTS) -> dict[str, Any]:
    if path.exists():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return {"points": []}


def load_all(root: Path = RESULTS.parent) -> dict[str, Any]:
    """Every sweep file's points (``capacity.json`` and ``capacity-*.json``, sweeps run side
    by side), one per point, the newest measurement of each."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in sorted(root.glob("capacity*.json")):
        for p in load(path)["points"]:
            if _key(p) not in found or p.get("date", "") >= found[_key(p)].get("date", ""):
                found[_key(p)] = p
    order = list(SWEEP)
    points = sorted(
        found.values(), key=lambda p: order.index(p["series"]) if p["series"] in order else 99
    )
    return {"points": points}


def _key(p: dict[str, Any]) -> tuple[Any, ...]:
    spread = p.get("plan", {}).get("spread")
    return (p["series"], p["profile"], p["agents"], str(p["partitions"]), p["batch"], spread)


def sweep(
    only: list[str] | None = None, again: bool = False, path: Path = RESULTS
) -> dict[str, Any]:
    """Run the series named, in that order (default: all), saving each point as it ends; a
    point the file has already is not run again unless ``again``."""
    data = load(path)
    for series in only or list(SWEEP):
        for plan in SWEEP[series]:
            done = {_key(p) for p in data["points"]}
            if not again and _plan_key(series, plan) in done:
                continue
            say(
                f"capacity {series}: {plan.profile}, {plan.agents} agents, {plan.layout} "
                f"{plan.partitions}, batch {plan.batch}"
            )
            result = {"series": series, "plan": _plan(plan), **run(plan)}
            result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            data["points"] = [p for p in data["points"] if _key(p) != _key(result)]
            data["points"].append(result)
            path.write_text(json.dumps(data, indent=1) + "\n")
            say(
                f"  {result['entries_per_s']} entries/s, p99 {result['p99_s']} s, "
                f"{result['requests_per_entry']} requests/entry, {result['violations']} "
                f"violations, {result['limited_by']}; {result['run_s']} s"
            )
    return data


def _plan_key(series: str, plan: Plan) -> tuple[Any, ...]:
    """The key ``_key`` gives the result of ``plan``."""
    partitions = plan.layout if plan.layout != "partitioned" else partitions_of(plan)
    return (series, plan.profile, plan.agents, str(partitions), plan.batch, plan.spread)


def _plan(plan: Plan) -> dict[str, Any]:
    d = asdict(plan)
    d.pop("calibrated", None)
    return d


# -- the report ---------------------------------------------------------------------------------

COLUMNS = (
    "| profile | agents | layout | batch | entries/s | claim+put p50 / p99 s | requests per "
    "entry | conflicts per commit | max CAS/s one object | max requests/s one prefix | $ per "
    "million entries | violations | limited by |",
    "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
)


def _layout(p: dict[str, Any]) -> str:
    if p["layout"] == "stage":
        return "one shard"
    if p["layout"] == "task":
        return "one shard for the task"
    auto = p.get("plan", {}).get("partitions") == "auto"
    how = [*(["auto"] if auto else []), "spread" if p.get("spread") else "flat keys"]
    return f"{p['partitions']} partitions ({', '.join(how)})"


def row(p: dict[str, Any]) -> str:
    return (
        f"| {p['profile']} | {p['agents']:,} | {_layout(p)} | {p['batch']} | "
        f"{fmt(p['entries_per_s'], 1)} | {fmt(p['p50_s'])} / {fmt(p['p99_s'])} | "
        f"{fmt(p['requests_per_entry'])} | {fmt(p['conflicts_per_commit'])} | "
        f"{p['max_object_cas_per_s']} | {p['max_prefix_requests_per_s']:,} | "
        f"{fmt(p['dollars_per_million'])} | {p['violations']} | {p['limited_by']} |"
    )


TITLES = {
    "agents": "S3 Standard, agents from 10 to 10,000 (1,000: above), partitions chosen by `auto`",
    "partitions-100": "S3 Standard, 100 agents, one shard to 256 partitions",
    "partitions-1000": "S3 Standard, 1,000 agents, one shard to 1,024 partitions",
    "batches": "S3 Standard, 100 agents on 64 partitions, `claim_many` + `put_many` of B",
    "profiles": "1,000 agents on each cloud, partitions chosen by `auto`",
}


GOALS = (
    ("s3-standard", 1000, 1000.0, 2.0, 3.5),
    ("s3-standard", 10_000, 3000.0, 5.0, 5.0),
    ("s3-express", 1000, 3000.0, 0.5, 3.5),
    ("gcs", 1000, 200.0, 10.0, 4.0),
)
"""(profile, agents, entries/s at least, p99 claim + put at most, requests per entry at
most): one hot stage, every agent a task of its own, one entry per claim and put."""


def goal_point(points: list[dict[str, Any]], profile: str, agents: int) -> dict[str, Any] | None:
    """The point of ``profile`` and ``agents`` with ``auto`` partitions and batch 1."""
    for p in points:
        plan = p.get("plan", {})
        if (
            p["profile"] == profile
            and p["agents"] == agents
            and p["batch"] == 1
            and plan.get("partitions") == "auto"
        ):
            return p
    return None


def goals_table(points: list[dict[str, Any]]) -> str:
    lines = [
        "| profile | agents | entries/s (goal) | p99 claim+put s (goal) | requests per entry "
        "(goal) | violations | met | partitions |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for profile, agents, rate, p99, requests in GOALS:
        p = goal_point(points, profile, agents)
        if p is None:
            lines.append(
                f"| {profile} | {agents:,} | - (>= {rate:g}) | - (<= {p99:g}) | - (<= "
                f"{requests:g}) | - | not measured | |"
            )
            continue
        met = (
            p["entries_per_s"] >= rate
            and (p["p99_s"] or 0) <= p99
            and (p["requests_per_entry"] or 0) <= requests
            and p["violations"] == 0
        )
        lines.append(
            f"| {profile} | {agents:,} | {fmt(p['entries_per_s'], 1)} (>= {rate:g}) | "
            f"{fmt(p['p99_s'])} (<= {p99:g}) | {fmt(p['requests_per_entry'])} (<= "
            f"{requests:g}) | {p['violations']} | {'yes' if met else '**no**'} | "
            f"{_layout(p)} |"
        )
    return "\n".join(lines)


def render(data: dict[str, Any]) -> str:
    points = data["points"]
    parts = [
        "**Goals on the model** (real code, checker on, faults on)",
        "",
        goals_table(points),
        "",
    ]
    for series, title in TITLES.items():
        mine = [p for p in points if p["series"] == series]
        if not mine:
            continue
        parts += [f"**{title}**", "", *COLUMNS, *(row(p) for p in mine), ""]
        cost = ", ".join(
            f"{p['agents']:,} agents {fmt(p['run_s'], 0)} s" for p in mine if "run_s" in p
        )
        parts += [f"Wall time of the simulation (setup and check apart): {cost}.", ""]
    return "\n".join(parts)


def charts(data: dict[str, Any], root: Path = ROOT) -> list[Path]:
    """Entries/s against agents, and against partitions, as PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("no matplotlib: pip install -e '.[bench]' for the charts")
        return []

    written: list[Path] = []
    points = data["points"]
    auto = [p for p in points if goal_point([p], "s3-standard", p["agents"]) is not None]
    agents = sorted({p["agents"]: p for p in auto}.values(), key=lambda p: p["agents"])
    if agents:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        xs = [p["agents"] for p in agents]
        ax.plot(xs, [p["entries_per_s"] for p in agents], "o-", label="entries/s (model)")
        ax.plot(xs, [5.5 * n for n in xs], ":", color="grey", label="5.5/s per agent")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("agents (each its own Task)")
        ax.set_ylabel("entries/s, one hot stage")
        ax.set_title("S3 Standard model: one stage, partitions auto")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        written.append(_save(fig, root / CHARTS["agents"]))
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drew = False
    for series, label in (("partitions-100", "100 agents"), ("partitions-1000", "1,000 agents")):
        every = [p for p in points if p["series"] == series]
        flat = [p for p in every if p.get("plan", {}).get("spread") is False]
        mine = [p for p in every if p not in flat]
        for p in flat:
            ax.plot(
                [p["partitions"]],
                [p["entries_per_s"]],
                "x",
                ms=9,
                color="black",
                label=f"{label}, {p['partitions']} partitions, flat keys (one prefix)",
            )
        if not mine:
            continue
        mine.sort(key=lambda p: 1 if not isinstance(p["partitions"], int) else p["partitions"])
        xs = [p["partitions"] if isinstance(p["partitions"], int) else 1 for p in mine]
        ax.plot(xs, [p["entries_per_s"] for p in mine], "o-", label=label)
        drew = True
    if drew:
        cas = PROFILES["s3-standard"].cas_per_object or 15.0
        xs = [1, 4, 16, 64, 256, 1024]
        ax.plot(xs, [n * cas / 2 for n in xs], ":", color="grey", label="partitions x 7.5/s")
        ax.axhline(1750, ls="--", color="grey", lw=0.8, label="one prefix: 3,500 PUT/s / 2")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("partitions of the stage (1: one shard)")
        ax.set_ylabel("entries/s")
        ax.set_title("S3 Standard model: entries/s against partitions")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        written.append(_save(fig, root / CHARTS["partitions"]))
    plt.close(fig)
    return written


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def update_markdown(md: Path, block: str) -> None:
    text = md.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        md.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    else:
        md.write_text(f"{text.rstrip()}\n\n{BEGIN}\n{block}\n{END}\n")
