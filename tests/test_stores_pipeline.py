"""A pipeline of several processes on every store that serves processes (the S3 servers,
``gs://`` on fake-gcs-server, and every other scheme a run names), through the API and
the CLI: claims racing from processes have exactly one winner, a stale epoch is fenced, a
stage is drained exactly once by several processes, a chunked entry put by one process is
verified by another, and ``doctor`` says what the store enforces (a capability its
emulator lacks, ``LACKS``, as a failed check). On the stores of other schemes, every
command of the CLI runs on the store's URL too, ``web`` and ``mcp`` among them (on S3,
``tests/test_cli.py``, ``tests/test_web_cli.py`` and ``tests/test_mcp.py`` run them).

Agents in other processes run ``tests/workers/agent.py --url``; every child is killed when
its test ends, whatever the outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.store import POLICIES
from objmanifest.store.probe import MULTIPART
from tests.support.stores import Server, lacks, other_stores
from tests.test_cli import Cli, E, finish, make_cli
from tests.test_mcp import agent
from tests.test_races import WORKER, Spawn, Worker
from tests.test_web_cli import get, web

pytestmark = [pytest.mark.behaviour, pytest.mark.processes]

TASK = "job"
ROOT = Path(__file__).resolve().parent.parent
"""The checkout: the workers import ``tests.support``."""
MiB = 1024 * 1024

CHECKS = {"conditional_completion": MULTIPART}
"""The ``doctor`` check that asks for each capability an emulator may lack."""

ENDPOINT_VARIABLES = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"),
    "gs": ("STORAGE_EMULATOR_HOST",),
}
"""The variables ``--endpoint-url`` stands in for, per scheme."""


@pytest.fixture
def cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    return make_cli(server, prefix, tmp_path)


@pytest.fixture
def spawn(server: Server, prefix: str) -> Iterator[Spawn]:
    """Start ``tests/workers/agent.py`` processes on the store's URL; all are killed at
    the end."""
    started: list[Worker] = []

    def start(name: str, *args: str, wait_go: bool = False) -> Worker:
        cmd = [sys.executable, str(WORKER), "--url", server.url(prefix), "--task", TASK]
        cmd += ["--name", name, *(["--wait-go"] if wait_go else []), *args]
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **server.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        worker = Worker(cmd, env, name)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def fresh(server: Server, prefix: str) -> om.Task:
    """The task as another machine sees it now: a new store, an empty cache."""
    return om.Task.open(server.connect(prefix), TASK)


def run(cli: Cli, *args: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    """A CLI command whatever its exit code: (code, stdout, stderr)."""
    proc = subprocess.Popen(
        cli.command(*args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli.environ(),
        cwd=cli.cwd,
    )
    out, err = proc.communicate(stdin, timeout=120)
    cli.check(_Result(args, proc.returncode, out, err.decode()))
    return proc.returncode, out, err.decode()


class _Result:
    def __init__(self, args: tuple[str, ...], code: int, stdout: bytes, stderr: str) -> None:
        self.args, self.code, self.stdout, self.stderr = args, code, stdout, stderr

    def __str__(self) -> str:
        return f"objmanifest {' '.join(self.args)} -> {self.code}\n{self.stderr}"


# -- racing claims -------------------------------------------------------------------------


def test_claims_racing_from_processes_have_exactly_one_winner(
    server: Server, store: om.ObjectStore, prefix: str, spawn: Spawn, cli: Cli
) -> None:
    task = om.Task.create(store, TASK, stages=["collect"], lease_seconds=60)
    ids = [f"item-{i}" for i in range(5)]
    task.declare_many([(file_id, "collect") for file_id in ids])
    asks = [arg for file_id in ids for arg in ("--file-id", file_id)]
    racers = [spawn(f"racer-{i}", "claim-once", *asks, wait_go=True) for i in range(4)]
    for racer in racers:
        racer.next("waiting")
    for racer in racers:  # released together: every claim of every id races
        racer.send()
    answers = {racer.name: [racer.next("claim") for _ in ids] for racer in racers}
    for racer in racers:
        racer.finish()
    seen = fresh(server, prefix)
    for n, file_id in enumerate(ids):
        won = [name for name, said in answers.items() if said[n]["claim"] is not None]
        assert len(won) == 1, (file_id, answers)
        lost = [said[n]["error"] for said in answers.values() if said[n]["claim"] is None]
        assert lost == ["NotClaimable"] * 3, lost
        entry = seen.entry(file_id)
        assert (entry.state, entry.owner, entry.epoch) == (om.State.writing, won[0], 1)

    # Through the CLI: four processes claim one entry at once.
    task.declare("shell-item", "collect")
    procs = [cli.popen("--json", "claim", "shell-item", "--agent", f"shell-{i}") for i in range(4)]
    results = [finish(proc, timeout=120) for proc in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [E.OK, E.NOTHING_CLAIMABLE, E.NOTHING_CLAIMABLE, E.NOTHING_CLAIMABLE], results
    [(_, out, _)] = [r for r in results if r[0] == E.OK]
    winner = json.loads(out)
    entry = fresh(server, prefix).entry("shell-item")
    assert (entry.owner, entry.epoch) == (winner["agent"], winner["epoch"]) == (entry.owner, 1)


# -- fencing -------------------------------------------------------------------------------


def test_a_stale_epoch_is_fenced_across_processes(
    server: Server, store: om.ObjectStore, prefix: str, spawn: Spawn, cli: Cli
) -> None:
    """A holder in one process lets its lease expire; another process takes the entry over
    and puts; the first one's put, and a put at its epoch from the CLI, change nothing."""
    task = om.Task.create(store, TASK, stages=["collect"], lease_seconds=1, max_retries=3)
    task.declare("x", "collect")
    zombie = spawn("zombie", "hold", "--file-id", "x", "--payload", "stale bytes")
    assert zombie.next("claimed")["claim"]["epoch"] == 1
    taken = cli.json("claim", "x", "--agent", "rescuer", "--wait", "60")
    assert taken["epoch"] == 2  # once the lease expired, by the store's clock
    cli.run("put", "x", "-", "--agent", "rescuer", "--epoch", "2", stdin=b"fresh bytes")
    zombie.send()
    fenced = zombie.next("put")
    assert fenced["outcome"] == "LeaseLost", fenced
    zombie.finish()
    stale = cli.json(
        "put", "x", "-", "--agent", "zombie", "--epoch", "1", stdin=b"stale", code=E.LEASE_LOST
    )
    assert stale["error"] == "LeaseLost"
    entry = fresh(server, prefix).entry("x")
    assert (entry.state, entry.owner, entry.epoch) == (om.State.ready, "rescuer", 2)
    assert entry.checksum == checksum.of_bytes(b"fresh bytes")
    assert cli.run("consume", "x", "--agent", "reader").stdout == b"fresh bytes"


# -- a stage drained ------------------------------------------------------------------------

SHELL_PRODUCER = r"""
set -uo pipefail
om() { "$PY" -m objmanifest "$@"; }
while line=$(om claim --stage write --agent "$NAME"); do
    IFS=$'\t' read -r fid stage epoch expiry <<< "$line"
    printf '%s|%s|%s' "$fid" "$NAME" "$epoch" |
        om put "$fid" - --agent "$NAME" --epoch "$epoch" >/dev/null || exit 1
    echo "$fid"
done
"""
"""Claim any entry of ``write`` and put ``FILE_ID|NAME|EPOCH`` until nothing is left."""


def test_a_stage_is_drained_exactly_once_by_several_processes(
    server: Server, store: om.ObjectStore, prefix: str, spawn: Spawn, cli: Cli
) -> None:
    task = om.Task.create(store, TASK, stages=["collect", "write"], lease_seconds=60)
    collect = [f"c/{i:02d}" for i in range(12)]
    write = [f"w/{i:02d}" for i in range(6)]
    task.declare_many([(f, "collect") for f in collect] + [(f, "write") for f in write])

    producers = [
        spawn(f"producer-{i}", "produce", "--stage", "collect", wait_go=True) for i in range(3)
    ]
    for producer in producers:
        producer.next("waiting")
    for producer in producers:
        producer.send()
    lines = [line for producer in producers for line in producer.finish(timeout=180)]
    assert [line for line in lines if line["event"] == "error"] == []
    made = {line["file_id"]: line for line in lines if line["event"] == "produced"}
    produced = [line["file_id"] for line in lines if line["event"] == "produced"]
    assert sorted(produced) == collect  # each exactly once

    shells = [
        subprocess.Popen(
            ["bash", "-c", SHELL_PRODUCER],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli.environ(PY=sys.executable, NAME=f"shell-{i}"),
            cwd=cli.cwd,
        )
        for i in range(2)
    ]
    said = [finish(shell, timeout=180) for shell in shells]
    assert all(code == 0 for code, _, _ in said), said  # each loop ends: nothing claimable
    by_shell = [out.decode().split() for _, out, _ in said]
    assert sorted(by_shell[0] + by_shell[1]) == write

    seen = fresh(server, prefix)
    reader = seen.agent("reader")
    for file_id in collect:
        entry = seen.entry(file_id)
        producer = made[file_id]
        assert (entry.state, entry.epoch) == (om.State.ready, producer["claim_epoch"])
        assert reader.consume(file_id).decode().startswith(f"{file_id}|producer-")
    for file_id in write:
        entry = seen.entry(file_id)
        shell = next(i for i, ids in enumerate(by_shell) if file_id in ids)
        assert (entry.state, entry.owner, entry.epoch) == (om.State.ready, f"shell-{shell}", 1)
        assert reader.consume(file_id) == f"{file_id}|shell-{shell}|1".encode()


# -- a chunked entry ------------------------------------------------------------------------


def test_a_chunked_entry_put_by_one_process_is_verified_by_another(
    server: Server, store: om.ObjectStore, prefix: str, cli: Cli, tmp_path: Path
) -> None:
    task = om.Task.create(store, TASK, stages=["make"], lease_seconds=60)
    task.declare("big", "make", consumers=["checker", "auditor"])
    data = os.urandom(MiB) * 11 + b"tail"  # three parts of 5 MiB, the last short
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    epoch = cli.json("claim", "big", "--agent", "maker")["epoch"]
    sizes = ("--part-size", "5MiB", "--threshold", "5MiB", "--concurrency", "3")
    cli.run("put", "big", str(source), "--agent", "maker", "--epoch", str(epoch), *sizes)

    entry = fresh(server, prefix).entry("big")
    assert entry.is_chunked and entry.part_size == 5 * MiB
    assert checksum.is_composite(entry.checksum)
    assert entry.whole_checksum == checksum.of_bytes(data)
    out = tmp_path / "out.bin"
    cli.run("consume", "big", "--agent", "checker", "-o", str(out))  # verified as it streams
    assert out.read_bytes() == data
    assert fresh(server, prefix).agent("auditor").consume("big") == data
    assert fresh(server, prefix).entry("big").consumed_by == ("checker", "auditor")


# -- doctor -----------------------------------------------------------------------------------


def test_doctor_says_what_the_store_enforces(server: Server, cli: Cli) -> None:
    """Safe where the store enforces everything; where its emulator lacks a capability,
    that check failed and the store is unsafe (exit 12), and the others still pass."""
    code, out, err = run(cli, "--json", "doctor")
    report = json.loads(out)
    checks = {check["name"]: check for check in report["checks"]}
    missing = {CHECKS[cap] for cap in lacks(server.name) if cap in CHECKS}
    failed = {
        name for name, check in checks.items() if check["required"] and check["verdict"] != "ok"
    }
    assert failed == missing, report
    assert (code, report["safe"]) == ((E.UNSUPPORTED, False) if missing else (E.OK, True)), err
    human = run(cli, "doctor")[1].decode()
    for name in missing:
        assert name in human
    assert report["store_time"] and abs(report["skew_seconds"]) < 60


# -- every command on the stores of other schemes ---------------------------------------------


def without_endpoint(server: Server, env: dict[str, str]) -> dict[str, str] | None:
    """``env`` without the variables ``--endpoint-url`` stands in for on this scheme; None
    where the scheme has none (a directory, Azure's connection string)."""
    names = ENDPOINT_VARIABLES.get(server.scheme)
    if not names or not server.endpoint_url:
        return None
    return {k: v for k, v in env.items() if k not in names}


@pytest.mark.parametrize("server", other_stores(), indirect=True)
def test_every_command_runs_on_the_stores_url(server: Server, cli: Cli, tmp_path: Path) -> None:
    """What ``tests/test_cli.py`` does on S3, briefly, on a store of another scheme: every
    command by its URL (``OBJMANIFEST_URL``), once by ``--endpoint-url`` alone."""
    cli.json("init", "collect", "write", "--lease", "60", "--retries", "2")
    cli.run("declare", "a", "--stage", "collect")
    cli.run("declare", "b", "--stage", "write", "--depends-on", "a")
    cli.run("declare", "gone", "--stage", "collect")
    cli.run("undeclare", "gone")
    epoch = cli.json("claim", "a", "--agent", "p")["epoch"]
    cli.run("renew", "a", "--agent", "p", "--epoch", str(epoch))
    cli.run("put", "a", "-", "--agent", "p", "--epoch", str(epoch), stdin=b"made by p")
    assert cli.run("consume", "a", "--agent", "c").stdout == b"made by p"
    held = cli.json("claim", "b", "--agent", "q")["epoch"]
    cli.run("release", "b", "--agent", "q", "--epoch", str(held))
    held = cli.json("claim", "b", "--agent", "q")["epoch"]
    cli.run("fail", "b", "bad input", "--agent", "q", "--epoch", str(held))
    for _ in range(2):
        held = cli.json("claim", "b", "--agent", "q")["epoch"]
        cli.run("fail", "b", "again", "--agent", "q", "--epoch", str(held))
    assert cli.json("show", "b")["state"] == "dead"
    cli.run("revive", "b")
    (tmp_path / "many").mkdir()
    (tmp_path / "many" / "b").write_bytes(b"b's bytes")
    claims = cli.run("claim", "--stage", "write", "--agent", "q", "--limit", "5").stdout
    cli.run(
        "put-many", "--agent", "q", "--claims", "-", "--dir", str(tmp_path / "many"), stdin=claims
    )
    assert cli.json("status")["totals"]["ready"] == 1
    assert cli.json("wait", "--stage", "write")["entries"] == 1
    for command in (["log"], ["log", "a"], ["lineage", "b"], ["reap"], ["repair"], ["gc"]):
        cli.run(*command)
    cli.run("trim", "--keep-versions", "100")
    cli.run("archive", "--older-than", "0")
    cli.run("migrate")
    assert "job" in cli.run("tasks").text
    bare = without_endpoint(server, cli.environ())
    if bare is not None:  # the store by --url, its endpoint by --endpoint-url alone
        del bare["OBJMANIFEST_URL"]
        url = cli.environ()["OBJMANIFEST_URL"]
        shown = cli.run("--url", url, "--endpoint-url", server.endpoint_url, "show", "a", env=bare)
        assert "ready" in shown.text or "consumed" in shown.text
    policy = run(cli, "--json", "iam-policy", "--for", "admin")
    assert policy[0] == (E.OK if server.scheme in POLICIES else E.USAGE), policy
    with web(cli) as (url, _):  # the status page on the store's URL
        status, body = get(url + "api/tasks/job")
        assert status == 200 and json.loads(body)["totals"]["ready"] == 1

    async def over_mcp() -> None:
        async with agent(cli, "tool-user") as tools:
            assert (await tools.call("show", file_id="b"))["state"] == "ready"
            assert (await tools.call("consume", file_id="b"))["text"] == "b's bytes"

    anyio.run(over_mcp)
    cli.run("delete", "--yes")
    assert "job" not in cli.run("tasks").text
