"""Render a suite run (``bench/results/latest.json``) into BENCHMARKS.md and its charts.

    python -m bench.report                      # latest.json -> BENCHMARKS.md + PNG charts
    python -m bench.report bench/results/X.json --md /tmp/B.md --charts /tmp

The tables go between ``<!-- suite:begin -->`` and ``<!-- suite:end -->`` in BENCHMARKS.md;
everything outside those lines is written by hand and kept. Charts need matplotlib (the
``bench`` extra: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import aio_bench, checksums, commit_cost, request_count, transfer_bench
from bench.common import ROOT, fmt

BEGIN = "<!-- suite:begin -->"
END = "<!-- suite:end -->"
CHARTS = {
    "speedup": "docs/bench_speedup_25ms.png",
    "size": "docs/bench_commit_vs_size.png",
    "rates": "docs/bench_contention_rates.png",
}
SERIES_NAMES = {
    ("hot", "stage"): "one hot stage, one shard (the ceiling)",
    ("hot", "partitioned"): "one hot stage, 16 partitions",
    ("busy", "task"): "four stages, one shard for the task",
    ("busy", "stage"): "four stages, a shard per stage",
    ("busy", "partitioned"): "four stages, 4 partitions each",
}


# -- lookups -----------------------------------------------------------------------------------


def _points(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    section = results.get(name)
    return list(section.get("points", [])) if isinstance(section, dict) else []


def contention_point(
    results: dict[str, Any], delay: int, scenario: str, layout: str, agents: int
) -> dict[str, Any] | None:
    for p in _points(results, "contention"):
        if (p["delay_ms"], p["scenario"], p["layout"], p["agents"]) == (
            delay,
            scenario,
            layout,
            agents,
        ):
            return p
    return None


def batching_point(results: dict[str, Any], delay: int, batch: int, many: bool) -> Any:
    for p in _points(results, "batching"):
        if (
            p["delay_ms"] == delay
            and p["batch"] == batch
            and p["verbs"].startswith("claim_many" if many else "claim +")
        ):
            return p
    return None


def size_point(results: dict[str, Any], layout: str, entries: int) -> dict[str, Any] | None:
    for p in _points(results, "size"):
        if p["layout"] == layout and p["entries"] == entries:
            return p
    return None


# -- goals -------------------------------------------------------------------------------------


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's goals, each with what this run measured (None: not measured)."""
    out: list[dict[str, Any]] = []

    def add(goal: str, value: float | None, target: float, above: bool, detail: str) -> None:
        met = None if value is None else (value >= target if above else value <= target)
        out.append(
            {
                "goal": goal,
                "measured": value,
                "target": f"{'>=' if above else '<='} {target:g}",
                "met": met,
                "detail": detail,
            }
        )

    value, detail = speedup_goal(results, "hot", "partitioned", 16)
    ceiling = contention_point(results, 25, "hot", "stage", 16)
    if ceiling:
        detail += f"; one unpartitioned shard, 16 agents at 25 ms: x{fmt(ceiling['speedup'])}"
    add("one hot stage: 16 agents on 16 partitions vs one agent", value, 8, True, detail)
    value, detail = speedup_goal(results, "busy", "partitioned", 8)
    per_stage, per_stage_note = speedup_goal(results, "busy", "stage", 8)
    shown = f"x{fmt(per_stage)} ({per_stage_note})" if per_stage else per_stage_note
    add(
        "8 agents over four stages (4 partitions each) vs one agent",
        value,
        4,
        True,
        detail + f"; a shard per stage (two agents per object): {shown}",
    )
    b100 = batching_point(results, 25, 100, True)
    add(
        "25 ms, batches of 100 vs the per-entry rate (claim + put)",
        b100 and b100["vs_per_entry"],
        20,
        True,
        "",
    )
    big = size_point(results, "partitioned", 100_000)
    small = size_point(results, "stage", 1_000)
    add(
        "warm commit, 100k entries in 100 partitions vs 1k entries in one shard",
        None
        if not (big and small)
        else round(big["commit_median_ms"] / small["commit_median_ms"], 2),
        2,
        False,
        f"{fmt(big['commit_median_ms'])} ms vs {fmt(small['commit_median_ms'])} ms"
        if big and small
        else "",
    )
    req = results.get("requests")
    add(
        "requests per produced entry (claim + put), warm, journal on",
        req and req["claim_put_per_entry"],
        3.5,
        False,
        f"limit {req['limit']}" if req else "",
    )
    cc = results.get("commit_cost")
    add(
        "commit vs a raw conditional PUT (median of three runs)",
        cc and cc["ratio_median"],
        1.1,
        False,
        (
            f"runs {', '.join(fmt(r['ratio']) for r in cc['runs'])}; paired "
            f"{fmt(cc.get('paired_median'))}; vs a raw PUT with Content-MD5 "
            f"{fmt(cc.get('vs_md5_median'))}"
        )
        if cc
        else "",
    )
    return out


CPU_BOUND = 1.6
"""Busy cores of the whole machine (2 cores) from which a point counts as CPU-bound: its
agents waited for a core, so its speed-up says what the machine allowed, not the protocol."""


def cpu_bound(p: dict[str, Any] | None) -> bool:
    return p is not None and (p.get("machine_busy_cores") or 0) >= CPU_BOUND


def speedup_goal(
    results: dict[str, Any], scenario: str, layout: str, agents: int
) -> tuple[float | None, str]:
    """The speed-up of ``agents`` over one agent at 25 ms, or at 60 ms where 25 ms was
    CPU-bound (either point); a CPU-bound point is named, never counted."""
    notes = []
    for delay in (25, 60):
        p = contention_point(results, delay, scenario, layout, agents)
        one = contention_point(results, delay, scenario, layout, 1)
        if p is None:
            continue
        busy = fmt(p.get("machine_busy_cores"))
        if cpu_bound(p) or cpu_bound(one):
            notes.append(f"{delay} ms: x{fmt(p['speedup'])}, CPU-bound ({busy} cores), not counted")
            continue
        notes.append(f"{delay} ms, {busy} cores busy")
        return p["speedup"], "; ".join(notes)
    return None, "; ".join(notes)


def goals_table(results: dict[str, Any]) -> str:
    lines = ["| goal | target | measured | met | |", "|---|---|---:|---|---|"]
    for g in goals(results):
        met = {True: "yes", False: "**no**", None: "not measured"}[g["met"]]
        lines.append(
            f"| {g['goal']} | {g['target']} | {fmt(g['measured'])} | {met} | {g['detail']} |"
        )
    return "\n".join(lines)


# -- tables ------------------------------------------------------------------------------------


def contention_tables(results: dict[str, Any]) -> str:
    """Per added latency: a compact table (entries/s, speed-up and conflicts per commit by
    agents), then every figure of every point in a folded table."""
    section = results.get("contention")
    if not section:
        return "_not run_"
    points = section["points"]
    delays = sorted({p["delay_ms"] for p in points})
    agents = sorted({p["agents"] for p in points})
    parts = [
        f"{section['duration_s']:g} s per point. Each cell: entries/s, its speed-up over one "
        "agent of the same row, and lost races per commit.",
        "",
    ]
    for delay in delays:
        where = "bare loopback" if delay == 0 else f"{delay} ms added to every request"
        parts.append(f"**{where}**\n")
        parts.append(
            "| layout | shards | "
            + " | ".join(f"{n} agent{'s' if n > 1 else ''}" for n in agents)
            + " |"
        )
        parts.append("|---|---:|" + "---:|" * len(agents))
        for key, name in SERIES_NAMES.items():
            row = {
                p["agents"]: p
                for p in points
                if p["delay_ms"] == delay and (p["scenario"], p["layout"]) == key
            }
            if not row:
                continue
            cells = []
            for n in agents:
                p = row.get(n)
                if p is None:
                    cells.append("-")
                    continue
                mark = "*" if p["ran_out"] or p["errors"] else ""
                mark += " CPU-bound" if cpu_bound(p) else ""
                cells.append(
                    f"{fmt(p['entries_per_s'], 1)}{mark} (x{fmt(p['speedup'])}, "
                    f"{fmt(p['conflicts_per_commit'])})"
                )
            shards = next(iter(row.values()))["shards"]
            parts.append(f"| {name} | {shards} | " + " | ".join(cells) + " |")
        parts.append("")
    parts += [
        "<details><summary>Every contention point: latency, CPU</summary>",
        "",
        "| added ms | layout | shards | agents | entries | entries/s | speed-up | "
        "conflicts per commit | requests per entry (shard GETs, PUTs) | p50 ms | p99 ms | "
        "agents' CPU ms per entry | server CPU s | proxy CPU s | machine busy (cores) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        name = SERIES_NAMES.get((p["scenario"], p["layout"]), p["layout"])
        note = " (ran out)" if p["ran_out"] else ""
        note += f" errors {p['errors']}" if p["errors"] else ""
        requests = "-"
        if p.get("requests_per_entry") is not None:
            requests = (
                f"{fmt(p['requests_per_entry'])} ({fmt(p['shard_gets_per_entry'])}, "
                f"{fmt(p['shard_puts_per_entry'])})"
            )
        parts.append(
            f"| {p['delay_ms']} | {name} | {p['shards']} | {p['agents']} | {p['entries']}{note} "
            f"| {fmt(p['entries_per_s'], 1)} | {fmt(p['speedup'])} | "
            f"{fmt(p['conflicts_per_commit'])} | {requests} | "
            f"{fmt(p['p50_ms'], 1)} | {fmt(p['p99_ms'], 1)} | "
            f"{fmt(p.get('agents_cpu_ms_per_entry'), 1)} | {fmt(p.get('server_cpu_s'))} | "
            f"{fmt(p.get('harness_cpu_s'))} | {fmt(p.get('machine_busy_cores'))} |"
        )
    parts += ["", "</details>", ""]
    if any(p["ran_out"] or p["errors"] for p in points):
        parts.append("\\* the stage ran out of entries, or some operations failed (see below).")
    for skipped in dict.fromkeys(section.get("skipped", [])):
        parts.append(f"- not measured: {skipped}")
    return "\n".join(parts)


def threads_table(results: dict[str, Any]) -> str:
    section = results.get("threads")
    if not section:
        return "_not run_"
    lines = [
        f"One process, one shard, {section['delay_ms']} ms added to every request, "
        f"{section['duration_s']:g} s per point.\n",
        "| threads | entries/s | vs one thread | shard PUTs per entry | requests per entry | "
        "conflicts per commit | p50 ms | p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in section["points"]:
        lines.append(
            f"| {p['threads']} | {fmt(p['entries_per_s'], 1)} | {fmt(p['speedup'])} | "
            f"{fmt(p.get('shard_puts_per_entry'))} | {fmt(p.get('requests_per_entry'))} "
            f"| {fmt(p['conflicts_per_commit'])} | {fmt(p['p50_ms'], 1)} | {fmt(p['p99_ms'], 1)} |"
        )
    return "\n".join(lines)


def batching_table(results: dict[str, Any]) -> str:
    section = results.get("batching")
    if not section:
        return "_not run_"
    lines = [
        f"One agent process, {section['duration_s']:g} s per point (or until the stage ran "
        "out), the same number of entries declared for every point.\n",
        "| added latency | verbs | batch | entries/s | vs per-entry | p50 ms per call | "
        "p99 ms per call |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in section["points"]:
        lines.append(
            f"| {p['delay_ms']} ms | {p['verbs']} | {p['batch']} | {fmt(p['entries_per_s'], 1)} | "
            f"{fmt(p['vs_per_entry'])} | {fmt(p['p50_ms'], 1)} | {fmt(p['p99_ms'], 1)} |"
        )
    return "\n".join(lines)


def size_table(results: dict[str, Any]) -> str:
    section = results.get("size")
    if not section:
        return "_not run_"
    lines = [
        "| layout | entries in the stage | shards | the committed shard: live entries, archived "
        "| shard KB | warm commit median ms | p90 ms | vs 1k in one shard | declare_many s "
        "| first commit after it, ms | encode after one change, ms | whole shard by pydantic, "
        "ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = size_point(results, "stage", 1_000)
    for p in section["points"]:
        vs = p["commit_median_ms"] / base["commit_median_ms"] if base else None
        lines.append(
            f"| {p['layout']} | {p['entries']} | {p['shards']} | {p['live']}, "
            f"{p.get('archived', 0)} | {fmt(p['shard_bytes'] / 1024, 0)} | "
            f"{fmt(p['commit_median_ms'])} | {fmt(p['commit_p90_ms'])} | {fmt(vs)} | "
            f"{fmt(p.get('declare_s'))} | {fmt(p.get('first_commit_ms'), 1)} | "
            f"{fmt(p.get('encode_ms'))} | {fmt(p.get('encode_whole_ms'))} |"
        )
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    sec = results.get("seconds", {})
    before = ", ".join(f"{x:.1f}" for x in m["load_average"])
    after = ", ".join(f"{x:.1f}" for x in m.get("load_average_after", []))
    out = [
        f"Suite run: `{results['suite']}` on {results.get('endpoint', '')}, {m['date']}, "
        f"commit `{m['git_commit']}`, {sec.get('total', 0):.0f} s in all.",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_mib']} MiB, Python {m['python']}, "
        f"{m.get('seaweedfs') or ''}; load average {before} before, {after} after.",
        "",
        "### Goals",
        "",
        goals_table(results),
        "",
    ]
    if results.get("requests"):
        r = results["requests"]
        out += [
            "### 1. Requests per entry",
            "",
            f"{r['entries']} entries per phase; journal blocks of {r['journal_block_size']} "
            f"records ({r['journal_blocks']} written). Limit for claim + put: {r['limit']}.",
            "",
            request_count.table(r),
            "",
            f"Claim + put: {fmt(r['claim_put_per_entry'], 3)} requests per entry, "
            f"{fmt(r['claim_put_vs_limit'])}x the limit; beyond it: "
            + (
                ", ".join(f"{k} {fmt(v, 3)}" for k, v in r.get("claim_put_extras", {}).items())
                or "nothing"
            )
            + ".",
            "",
        ]
    if results.get("commit_cost"):
        out += ["### 2. Commit cost", "", commit_cost.table(results["commit_cost"]), ""]
    if results.get("contention"):
        out += [
            "### 3. Contention",
            "",
            f"![speed-up per layout, 25 ms]({CHARTS['speedup']})",
            "",
            contention_tables(results),
            "",
        ]
    if results.get("threads"):
        out += ["### 3b. Threads of one process on one shard", "", threads_table(results), ""]
    if results.get("batching"):
        out += ["### 4. Batching", "", batching_table(results), ""]
    if results.get("size"):
        out += [
            "### 5. Size",
            "",
            f"![commit latency vs task size]({CHARTS['size']})",
            "",
            size_table(results),
            "",
        ]
    if results.get("checksums"):
        c = results["checksums"]
        out += [
            "### 6a. Checksums",
            "",
            f"{c['mib']} MiB, 1 MiB blocks, best of 3 passes; xxh3 is "
            f"{fmt(c['xxh3_vs_sha256'])}x SHA-256.",
            "",
            checksums.table(c),
            "",
        ]
    if results.get("transfer"):
        t = results["transfer"]
        out += [
            "### 6b. Transfer",
            "",
            t.get("header", ""),
            "",
            transfer_bench.table(t),
            "",
        ]
    if results.get("aio"):
        out += ["### 7. asyncio: coroutines vs threads", "", aio_bench.table(results["aio"]), ""]
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in sec.items() if k != "total")
    out.append(f"Time per benchmark: {timing}.")
    return "\n".join(out)


# -- charts ------------------------------------------------------------------------------------


def machine_note(results: dict[str, Any]) -> str:
    """What a chart was measured on, printed under it: the machine is shared."""
    m = results.get("machine", {})
    load = ", ".join(f"{x:.1f}" for x in m.get("load_average", []))
    return (
        f"{m.get('cpus', '?')} CPUs shared by the server, the proxy, the agents and other "
        f"sessions' tests (load average {load} at the start); {m.get('date', '')}"
    )


def charts(results: dict[str, Any], root: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: pip install -e '.[bench]' for the charts", file=sys.stderr)
        return []
    written = []
    points = _points(results, "contention")
    at25 = [p for p in points if p["delay_ms"] == 25]
    if at25:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        xs = sorted({p["agents"] for p in at25})
        ax.plot(xs, xs, ls=":", color="grey", label="linear")
        for (scenario, layout), name in SERIES_NAMES.items():
            series = [p for p in at25 if (p["scenario"], p["layout"]) == (scenario, layout)]
            if series:
                ax.plot(
                    [p["agents"] for p in series],
                    [p["speedup"] for p in series],
                    marker="o",
                    ls="-" if scenario == "hot" else "--",
                    label=name,
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("agent processes")
        ax.set_ylabel("entries/s, relative to one agent")
        ax.set_title("Speed-up per layout, 25 ms added to every request")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.text(0.01, 0.01, machine_note(results), fontsize=6.5, color="grey")
        path = root / CHARTS["speedup"]
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    sizes = _points(results, "size")
    if sizes:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for layout in dict.fromkeys(p["layout"] for p in sizes):
            series = sorted((p for p in sizes if p["layout"] == layout), key=lambda p: p["entries"])
            ax.plot(
                [p["entries"] for p in series],
                [p["commit_median_ms"] for p in series],
                marker="o",
                label=layout,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries in the stage")
        ax.set_ylabel("warm commit, median ms")
        ax.set_title("Commit latency vs task size")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.text(0.01, 0.01, machine_note(results), fontsize=6.5, color="grey")
        path = root / CHARTS["size"]
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def update_markdown(md: Path, body: str) -> None:
    text = md.read_text() if md.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    md.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("results", nargs="?", type=Path, default=ROOT / "bench/results/latest.json")
    parser.add_argument("--md", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--charts", type=Path, default=ROOT, help="root the chart paths are under")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    for path in charts(results, args.charts):
        print(f"wrote {path}", file=sys.stderr)
    update_markdown(args.md, render(results))
    print(f"updated {args.md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
