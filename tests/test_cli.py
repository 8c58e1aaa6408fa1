"""The command line end to end: real processes against real servers.

Every command runs as ``python -m objmanifest`` in its own process, the way a shell step or
an agent's tool call runs it: a claim made by one process is finished by another, every
documented exit code is reached by a real scenario, ``--json`` output is parsed, and
``serve`` is started, used with boto3 and stopped with a signal.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cli import app, main, parser, progress
from objmanifest.cli.commands import read_declarations
from objmanifest.data import transfer
from objmanifest.local import servers
from objmanifest.wire import exits
from objmanifest.wire.polling import poll
from tests.support.breaking import BreakingFile
from tests.support.cli_forks import FORKS
from tests.support.faults import FaultProxy
from tests.support.internals import engine
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put
from tests.support.stores import LAYOUT, Server, layout_options

pytestmark = pytest.mark.one_server  # the CLI, not the backend, is under test

ENTRY_KEYS = set(om.Entry.model_fields)
CLAIM_KEYS = {"task_id", "file_id", "stage", "agent", "epoch", "lease_expires_at"}
ERROR_KEYS = {"error", "message", "exit_code"}
STATUS_KEYS = {
    "task_id",
    "store_time",
    "stages",
    "totals",
    "finished",
    "blocked",
    "overdue",
    "dead",
    "late",
    "backing_off",
    "unfinished",
    "unindexed",
}
SENTINEL_SECRET = "sentinel-SECRET-9f3a7c"
SENTINEL_KEY_ID = "sentinel-KEYID-41b2"
E = exits.ExitCode


# -- running the CLI -------------------------------------------------------------------


@dataclass
class Result:
    args: tuple[str, ...]
    code: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return f"objmanifest {' '.join(self.args)} -> {self.code}\n{self.text}\n{self.stderr}"


@dataclass
class Cli:
    """Runs ``python -m objmanifest`` with the environment of one server and prefix (each
    command a process of its own, forked: ``tests.support.cli_forks``)."""

    env: dict[str, str]
    cwd: Path
    forbidden: tuple[str, ...] = ()
    """Strings no output may contain: the credentials in the environment."""

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "objmanifest", *in_layout(args)]

    def environ(self, **extra: str) -> dict[str, str]:
        return {**self.env, **extra}

    def check(self, result: Result) -> Result:
        for secret in self.forbidden:
            assert secret.encode() not in result.stdout, str(result)
            assert secret not in result.stderr, str(result)
        return result

    def run(
        self,
        *args: str,
        code: int = 0,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Result:
        proc = FORKS.run(
            in_layout(args),
            stdin=stdin if stdin is not None else b"",
            env=env or self.environ(),
            cwd=self.cwd,
            timeout=timeout,
        )
        result = self.check(Result(args, proc.returncode, proc.stdout, proc.stderr.decode()))
        assert result.code == code, str(result)
        return result

    def json(self, *args: str, code: int = 0, **kw: Any) -> Any:
        """Run with ``--json`` and return the one object it printed on stdout."""
        result = self.run("--json", *args, code=code, **kw)
        lines = result.text.splitlines()
        assert len(lines) == 1, str(result)
        obj = json.loads(lines[0])
        if code:
            assert set(obj) >= ERROR_KEYS and obj["exit_code"] == code, str(result)
        return obj

    def popen(self, *args: str, **extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.environ(**extra),
            cwd=self.cwd,
            bufsize=0,
        )


def in_layout(args: tuple[str, ...]) -> tuple[str, ...]:
    """An ``init`` that chooses no layout, given the session's (``OBJMANIFEST_TEST_LAYOUT``),
    as tasks created in-process get it: the CLI suite runs under every shard layout."""
    if LAYOUT == "stage" or "init" not in args:
        return args
    if any(a.startswith(("--partitions", "--layout")) for a in args):
        return args
    at = args.index("init")
    stages = []
    for arg in args[at + 1 :]:
        if arg.startswith("-"):
            break
        stages.append(arg)
    options = layout_options(stages)
    extra: list[str] = []
    if "layout" in options:
        extra = ["--layout", options["layout"]]
    for stage, count in options.get("partitions", {}).items():
        extra += ["--partitions", f"{stage}={count}"]
    return (*args, *extra)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJMANIFEST_")}
    env.update(COLUMNS="200", PYTHONUNBUFFERED="1")
    return env


def make_cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    """The CLI for one test's prefix and task ``job``. No output of any command may contain
    the secret key in its environment; moto accepts any credentials, so there it gets
    sentinel ones, and so does a store that takes none (``file://``: a user's AWS
    credentials in the environment must not leak through it either)."""
    env = {
        **base_env(),
        **server.env,
        "OBJMANIFEST_URL": server.url(prefix),
        "OBJMANIFEST_TASK": "job",
    }
    if server.name == "moto" or server.scheme == "file":
        env.update(AWS_SECRET_ACCESS_KEY=SENTINEL_SECRET, AWS_ACCESS_KEY_ID=SENTINEL_KEY_ID)
    # None for a store of another scheme; LocalStack's "test" stands in any path of pytest's.
    secret = env.get("AWS_SECRET_ACCESS_KEY")
    return Cli(env, tmp_path, (secret,) if secret and secret != "test" else ())


@pytest.fixture
def cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    return make_cli(server, prefix, tmp_path)


MOTO_ONLY = pytest.mark.parametrize("server", ["moto"], indirect=True)
"""For what the CLI does the same on every store: run once, against the fastest one."""


def read_line(stream: Any, timeout: float = 30) -> bytes:
    """One line from a child's pipe, or fail after ``timeout`` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no output within {timeout}s"
    line: bytes = stream.readline()
    return line


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, bytes, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err.decode()


def produce(task: om.Task, file_id: str, data: bytes, agent: str = "maker") -> om.Entry:
    claim = task.agent(agent).claim(file_id)
    assert claim is not None
    return task.agent(agent).put(claim, data)


# -- a produce/consume hand-off between shell agents -------------------------------------


HANDOFF_SCRIPT = r"""
set -euo pipefail
om() { "$PY" -m objmanifest "$@"; }
# one process claims, the next one in the pipeline finishes the claim as its holder
IFS=$'\t' read -r fid stage epoch expiry < <(om claim --stage collect --agent collector)
printf 'hello from %s at epoch %s' "$fid" "$epoch" |
    om put "$fid" - --agent collector --epoch "$epoch"
"""


def test_a_file_is_handed_from_shell_agent_to_shell_agent(cli: Cli, tmp_path: Path) -> None:
    init = cli.json("init", "collect", "write", "--lease", "60", "--retries", "2")
    assert init["created"] is True
    assert init["stages"] == ["collect", "write"] and init["lease_seconds"] == 60
    batch = (
        b'raw/a.txt\n{"file_id": "out/b.txt", "stage": "write", '
        b'"depends_on": ["raw/a.txt"], "consumers": ["checker", "archive"]}\n'
    )
    declared = cli.json("declare", "--from", "-", "--stage", "collect", stdin=batch)
    assert [(e["file_id"], e["stage"], e["state"]) for e in declared["entries"]] == [
        ("raw/a.txt", "collect", "pending"),
        ("out/b.txt", "write", "pending"),
    ]
    assert declared["entries"][1]["depends_on"] == ["raw/a.txt"]

    shell = subprocess.run(
        ["bash", "-c", HANDOFF_SCRIPT],
        env=cli.environ(PY=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.startswith("raw/a.txt is ready: ")
    assert shell.stderr == ""  # no progress bars, no noise when stderr is not a terminal

    got = tmp_path / "got" / "a.txt"
    consumed = cli.json("consume", "raw/a.txt", "--agent", "writer", "-o", str(got), "--parents")
    assert consumed["state"] == "consumed" and consumed["consumed_by"] == ["writer"]
    assert got.read_bytes() == b"hello from raw/a.txt at epoch 1"

    claimed = cli.run("claim", "out/b.txt", "--agent", "writer").text
    file_id, stage, epoch, expiry = claimed.rstrip("\n").split("\t")
    assert (file_id, stage, epoch) == ("out/b.txt", "write", "1") and "T" in expiry
    report = tmp_path / "report.bin"
    report.write_bytes(bytes(range(256)) * 1000)
    put = cli.json("put", "out/b.txt", str(report), "--agent", "writer", "--epoch", epoch)
    assert set(put) == ENTRY_KEYS
    assert (put["state"], put["size"], put["epoch"]) == ("ready", 256_000, 1)
    assert put["checksum"].startswith("xxh3-128:")

    checker = cli.run("consume", "out/b.txt", "--agent", "c1", "--role", "checker", "-o", "-")
    assert checker.stdout == report.read_bytes() and checker.stderr == ""
    # Without -o the data goes to stdout too; with --json the object moves to stderr.
    archive = cli.run("--json", "consume", "out/b.txt", "--agent", "a1", "--role", "archive")
    assert archive.stdout == report.read_bytes()
    final = json.loads(archive.stderr)
    assert final["state"] == "consumed" and final["consumed_by"] == ["checker", "archive"]

    status = cli.json("status")
    assert set(status) == STATUS_KEYS
    assert status["totals"]["consumed"] == 2 and status["finished"] is True
    assert status["stages"]["write"]["consumed"] == 1


# -- JSON output of every command ---------------------------------------------------------


@MOTO_ONLY
def test_every_command_prints_one_json_object(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    # A lease far longer than the test: a dozen commands, each a process of its own, can
    # take a minute on a loaded machine, and the claim must outlive them (reap, put).
    task = om.Task.create(
        store, "job", stages=["collect", "write", "check"], lease_seconds=600, max_retries=2
    )
    again = cli.json(
        "init", "collect", "write", "check", "--lease", "600", "--retries", "2", "--exist-ok"
    )
    assert again["created"] is False and again["creation_id"] == task.header.creation_id
    one = cli.json("declare", "in/x", "--stage", "collect", "--consumer", "checker")
    assert len(one["entries"]) == 1 and set(one["entries"][0]) == ENTRY_KEYS
    assert one["entries"][0]["consumers"] == ["checker"]
    batch = json.dumps(
        [{"file_id": "in/y"}, {"file_id": "in/z", "stage": "write", "depends_on": ["in/x"]}]
    ).encode()
    many = cli.json("declare", "--from", "-", "--stage", "collect", stdin=batch)
    assert [e["stage"] for e in many["entries"]] == ["collect", "write"]

    claims = cli.json("claim", "--stage", "collect", "--agent", "a", "--limit", "5")
    # Claims from a split stage come in the order of the partitions the agent looked in.
    assert sorted(c["file_id"] for c in claims["claims"]) == ["in/x", "in/y"]
    assert all(set(c) == CLAIM_KEYS and c["epoch"] == 1 for c in claims["claims"])
    first = next(c for c in claims["claims"] if c["file_id"] == "in/x")
    renewed = cli.json("renew", "in/x", "--agent", "a", "--epoch", "1")
    assert set(renewed) == CLAIM_KEYS and renewed["lease_expires_at"] >= first["lease_expires_at"]
    failed = cli.json("fail", "in/y", "it broke", "--agent", "a", "--epoch", "1")
    assert (failed["state"], failed["retry_count"], failed["error"]) == ("failed", 1, "it broke")
    shown = cli.json("show", "in/x")
    assert set(shown) == ENTRY_KEYS and (shown["state"], shown["owner"]) == ("writing", "a")
    assert shown["declared_at"].endswith("+00:00")
    assert cli.json("reap") == {"released": []}
    status = cli.json("status")
    assert status["stages"]["collect"] == {
        "pending": 0,
        "writing": 1,
        "ready": 0,
        "consumed": 0,
        "failed": 1,
        "dead": 0,
    }
    assert [(b["file_id"], b["state"]) for b in status["blocked"]] == [("in/z", "pending")]
    assert status["finished"] is False

    # A chunked entry: the chunking options reach the API.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(6 * 1024 * 1024))
    chunked = (
        "put",
        "in/x",
        str(big),
        "--agent",
        "a",
        "--epoch",
        "1",
        "--threshold",
        "5MiB",
        "--part-size",
        "5MiB",
        "--concurrency",
        "2",
    )
    put = cli.json(*chunked)
    assert (put["state"], put["size"], put["part_size"]) == ("ready", 6 << 20, 5 << 20)
    got = tmp_path / "got.bin"
    consumed = cli.json("consume", "in/x", "--agent", "c", "--role", "checker", "-o", str(got))
    assert consumed["state"] == "consumed" and got.read_bytes() == big.read_bytes()


INIT = (
    *("init", "collect", "write", "--lease", "60", "--retries", "2"),
    *("--retry-backoff", "5", "--retry-backoff-max", "40", "--deadline", "collect=900"),
    *("--partitions", "collect=4"),
)


@MOTO_ONLY
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"write": "write2"}, "stages is ['collect', 'write'] there, ['collect', 'write2'] given"),
        ({"60": "61"}, "--lease is 60s there, 61s given"),
        ({"2": "3"}, "--retries is 2 there, 3 given"),
        ({"5": "6"}, "--retry-backoff is 5s there, 6s given"),
        ({"40": "50"}, "--retry-backoff-max is 40s there, 50s given"),
        ({"40": None}, "--retry-backoff-max is 40s there, 320s given"),  # 64 x 5 s
        ({"collect=900": "collect=901"}, "--deadline collect is 900s there, 901s given"),
        ({"collect=900": "write=900"}, "--deadline collect is 900s there, not set given"),
        ({"collect=4": "collect=2"}, "another shard layout: one shard per stage (collect in 4"),
    ],
)
def test_init_exist_ok_refuses_each_other_setting_by_name(
    cli: Cli, store: om.ObjectStore, change: dict[str, str | None], named: str
) -> None:
    made = cli.json(*INIT)
    again = cli.json(*INIT, "--exist-ok")
    assert again["created"] is False and again["creation_id"] == made["creation_id"]
    args: list[str] = []
    for arg in INIT:
        if arg in change:
            replaced = change[arg]
            if replaced is None:
                args.pop()  # the option too
                continue
            arg = replaced
        args.append(arg)
    refused = cli.json(*args, "--exist-ok", code=E.ALREADY_EXISTS)
    assert refused["error"] == "AlreadyExists" and named in refused["message"], refused
    header = om.Task.open(store, "job").header
    assert header.creation_id == made["creation_id"]  # the task as it was, nothing written


@MOTO_ONLY
def test_overdue_and_dead_entries_stand_out_and_reap_releases_them(
    cli: Cli, store: om.ObjectStore
) -> None:
    task = om.Task.create(store, "short", stages=["collect"], lease_seconds=1, max_retries=0)
    task.declare("slow", "collect")
    cli.env["OBJMANIFEST_TASK"] = "short"
    claim = cli.json("claim", "slow", "--agent", "sleepy")
    expiry = task.entry("slow").lease_expires_at
    assert expiry is not None and expiry.isoformat() == claim["lease_expires_at"]
    while store.now() <= expiry + timedelta(seconds=3.2):  # 2 s margin, 1 s Date rounding
        time.sleep(0.25)
    overdue = cli.json("status")["overdue"]
    assert [(n["file_id"], n["state"]) for n in overdue] == [("slow", "writing")]
    assert "lease of sleepy expired" in overdue[0]["reason"]

    released = cli.json("reap")["released"]
    assert [(e["file_id"], e["state"], e["retry_count"]) for e in released] == [("slow", "dead", 1)]
    human = cli.run("status").text
    assert "needs attention" in human and "dead" in human and "slow" in human
    stale = cli.json(
        "put",
        "slow",
        "-",
        "--agent",
        "sleepy",
        "--epoch",
        "1",
        code=E.LEASE_LOST,
        stdin=b"too late",
    )
    assert stale["error"] == "LeaseLost"


def test_a_rerun_step_with_a_stale_epoch_is_fenced(cli: Cli, store: om.ObjectStore) -> None:
    """Every step of a pipeline uses ``--agent fetcher``: the first claim's lease expires and
    a rerun claims the entry again (epoch 2). A late step still holding epoch 1 is refused
    (exit 5) and changes nothing, although its agent name is the holder's; the step with
    epoch 2 finishes the entry."""
    task = om.Task.create(store, "rerun", stages=["collect"], lease_seconds=1, max_retries=3)
    task.declare("raw/a.json", "collect")
    cli.env["OBJMANIFEST_TASK"] = "rerun"
    first = cli.json("claim", "raw/a.json", "--agent", "fetcher")
    assert first["epoch"] == 1
    expiry = task.entry("raw/a.json").lease_expires_at
    assert expiry is not None
    deadline = time.monotonic() + 30
    while store.now() <= expiry + timedelta(seconds=3.2):  # 2 s margin, 1 s Date rounding
        assert time.monotonic() < deadline, "the store's clock did not pass the lease"
        time.sleep(0.25)
    second = cli.json("claim", "raw/a.json", "--agent", "fetcher")
    assert second["epoch"] == 2
    held = task.entry("raw/a.json")

    stale = ("--agent", "fetcher", "--epoch", "1")
    for args, stdin in [
        (("put", "raw/a.json", "-", *stale), b"the late step's bytes"),
        (("renew", "raw/a.json", *stale), b""),
        (("fail", "raw/a.json", "late step gave up", *stale), b""),
    ]:
        refused = cli.json(*args, code=E.LEASE_LOST, stdin=stdin)
        assert refused["error"] == "LeaseLost" and "epoch 1" in refused["message"], args[0]
        assert task.entry("raw/a.json") == held, args[0]

    put = cli.json(
        "put", "raw/a.json", "-", "--agent", "fetcher", "--epoch", "2", stdin=b"the rerun's bytes"
    )
    assert (put["state"], put["epoch"]) == ("ready", 2)
    assert task.agent("reader").consume("raw/a.json") == b"the rerun's bytes"
    assert list(store.list_keys("rerun/data/")) == ["rerun/data/collect/raw/a.json@2"]


@MOTO_ONLY
@pytest.mark.parametrize(
    "layout",
    [(), ("--partitions", "collect=4"), ("--layout", "task")],
    ids=["stage", "partitioned", "task"],
)
def test_a_claim_is_held_across_processes_on_every_shard_layout(
    cli: Cli, store: om.ObjectStore, layout: tuple[str, ...]
) -> None:
    """Each command a process of its own, as a shell runs them: the claim printed by one
    is renewed, put, failed and released by the next ones, however the stage is sharded;
    the entry never stays writing behind a refused step."""
    cli.run("init", "collect", "write", "--lease", "600", *layout)
    task = om.Task.open(store, "job")
    ids = [f"f{i}" for i in range(6)]
    for file_id in ids:
        cli.run("declare", file_id, "--stage", "collect")
    holder = ("--agent", "p")
    for file_id in ids:
        claimed = cli.json("claim", file_id, *holder)
        assert claimed["epoch"] == 1
        epoch = ("--epoch", "1")
        renewed = cli.json("renew", file_id, *holder, *epoch)
        assert renewed["epoch"] == 1 and renewed["file_id"] == file_id
        if file_id == "f0":
            failed = cli.json("fail", file_id, "gave up", *holder, *epoch)
            assert failed["state"] == "failed"
            continue
        if file_id == "f1":
            released = cli.json("release", file_id, *holder, *epoch)
            assert released["state"] == "pending"
            continue
        made = cli.json("put", file_id, "-", *holder, *epoch, stdin=file_id.encode())
        assert (made["state"], made["epoch"]) == ("ready", 1)
    states = {e.file_id: e.state for e in task.entries("collect")}
    assert states == {"f0": om.State.failed, "f1": om.State.pending} | {
        f: om.State.ready for f in ids[2:]
    }
    # A stale epoch is still refused, whatever shard the entry lives in.
    again = cli.json("claim", "f0", *holder)
    refused = cli.json("put", "f0", "-", *holder, "--epoch", "1", code=E.LEASE_LOST, stdin=b"x")
    assert refused["error"] == "LeaseLost"
    done = cli.json("put", "f0", "-", *holder, "--epoch", str(again["epoch"]), stdin=b"f0")
    assert done["state"] == "ready"
    # put-many over claims `claim --limit` printed, across the shards.
    claimed = cli.run("claim", "--stage", "collect", *holder, "--limit", "5").text
    assert [line.split("\t")[0] for line in claimed.splitlines()] == ["f1"]
    (cli.cwd / "f1").write_bytes(b"f1")
    report = cli.json("put-many", *holder, "--claims", "-", "--dir", ".", stdin=claimed.encode())
    assert (report["ready"], report["failed"]) == (1, 0)
    assert {e.state for e in task.entries("collect")} == {om.State.ready}


MiB = 1024 * 1024


@pytest.mark.s3_only  # the parts sent are counted at a proxy in front of the server
@pytest.mark.parametrize(
    ("stdin", "parts_sent", "key"),
    [
        ("redirected-file", [3, 4, 5], "job/data/collect/big@1"),  # adopted: the rest sent
        ("pipe", [1, 2, 3, 4, 5], "job/data/collect/big@2"),  # a new upload: all sent
    ],
    ids=["put-from-file", "put-from-pipe"],
)
def test_put_from_stdin_adopts_only_when_stdin_is_a_file(
    cli: Cli, task: om.Task, tmp_path: Path, stdin: str, parts_sent: list[int], key: str
) -> None:
    """docs/cli.md: after a crash the next holder given the same file adopts the upload and
    sends only the missing parts; a pipe on stdin cannot be re-read, a file redirected to
    stdin (`< file`) can."""
    data = os.urandom(4 * 5 * MiB + 99)  # five 5 MiB parts
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    task.declare("big", "collect")
    first = task.agent("first")
    claim = first.claim("big")
    assert claim is not None
    with pytest.raises(OSError, match="the producer died"):
        first.put(
            claim,
            BreakingFile(data, 2 * 5 * MiB, "the producer died"),  # type: ignore[arg-type]
            part_size=5 * MiB,
            threshold=MiB,
            concurrency=1,
        )
    assert first.fail(claim, "crashed").state is om.State.failed  # parts 1-2 are kept
    epoch = cli.run("claim", "big", "--agent", "second").text.split("\t")[2]
    assert epoch == "2"

    put = ("put", "big", "-", "--agent", "second", "--epoch", epoch)
    put += ("--threshold", "1MiB", "--part-size", "5MiB")
    with FaultProxy(cli.env["AWS_ENDPOINT_URL"]) as proxy:
        command = cli.command("--json", "--endpoint-url", proxy.endpoint_url, *put)
        with contextlib.ExitStack() as opened:
            if stdin == "pipe":
                cat = opened.enter_context(
                    subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE)
                )
                source: Any = cat.stdout
            else:
                source = opened.enter_context(src.open("rb"))
            proc = subprocess.run(
                command,
                stdin=source,
                capture_output=True,
                env=cli.environ(),
                cwd=cli.cwd,
                timeout=120,
            )
        requests = list(proxy.requests)
    result = cli.check(Result(put, proc.returncode, proc.stdout, proc.stderr.decode()))
    assert result.code == 0, str(result)
    sent = sorted(
        int(re.search(r"partNumber=(\d+)", path).group(1))  # type: ignore[union-attr]
        for method, path in requests
        if method == "PUT" and "partNumber=" in path
    )
    assert sent == parts_sent
    entry = result.json()
    assert (entry["state"], entry["epoch"], entry["size"]) == ("ready", 2, len(data))
    assert entry["key"] == key
    got = tmp_path / "got.bin"
    cli.run("consume", "big", "--agent", "reader", "-o", str(got))
    assert got.read_bytes() == data


# -- exit codes ---------------------------------------------------------------------------


class LosingProxy(FaultProxy):
    """A store where somebody else always wins: every conditional update answers 412."""

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if method == "PUT" and any(name.lower() == "if-match" for name, _ in headers):
            xml = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed'
                b"</Code><Message>At least one of the pre-conditions you specified did "
                b"not hold</Message></Error>"
            )
            headers_out = [("Content-Type", "application/xml"), ("Date", formatdate(usegmt=True))]
            return 412, "Precondition Failed", headers_out, xml
        return super()._forward(method, target, headers, body)


def _stale_holder(task: om.Task) -> None:
    """'old' claimed 'stale' at epoch 1, gave it up, and 'new' holds it at epoch 2."""
    old = task.agent("old")
    claim = old.claim("stale")
    assert claim is not None and claim.epoch == 1
    old.fail(claim, "gave up")
    again = task.agent("new").claim("stale")
    assert again is not None and again.epoch == 2


def _scenarios(
    cli: Cli, task: om.Task, tmp_path: Path
) -> list[tuple[int, tuple[str, ...], dict[str, str]]]:
    """Set up each failure through the API; returns (expected code, args, extra env)."""
    store = task.store
    task.declare_many(
        [
            ("a", "collect"),
            ("b", "write", ["a"]),
            ("stale", "collect"),
            ("bad", "collect"),
            ("q", "collect"),
            ("r", "collect", [], ["checker"]),
        ]
    )
    _stale_holder(task)
    bad = produce(task, "bad", b"the real bytes")
    assert bad.key is not None
    raw_put(store, bad.key, b"other bytes!!!")
    produce(task, "q", b"queued")
    task.agent("first").consume("q")
    produce(task, "r", b"for checkers")
    broken = om.Task.create(store, "broken", stages=["collect"])
    broken.declare("x", "collect")
    raw_put(store, engine(broken).shard_key("collect", "x"), b"{ this is not json")
    data = tmp_path / "data.bin"
    data.write_bytes(b"data")
    out = str(tmp_path / "out")
    return [
        (E.USAGE, ("claim", "--agent", "x"), {}),
        (E.USAGE, ("declare", "../escape", "--stage", "collect"), {}),
        (
            E.ERROR,
            ("put", "stale", str(tmp_path / "missing"), "--agent", "new", "--epoch", "2"),
            {},
        ),
        (E.NOTHING_CLAIMABLE, ("claim", "--stage", "check", "--agent", "x"), {}),
        (E.NOTHING_CLAIMABLE, ("claim", "b", "--agent", "x"), {}),
        (E.LEASE_LOST, ("put", "stale", str(data), "--agent", "old", "--epoch", "1"), {}),
        (E.CHECKSUM_MISMATCH, ("consume", "bad", "--agent", "x", "-o", str(tmp_path / "bad")), {}),
        (E.NOT_FOUND, ("--task", "nope", "status"), {}),
        (E.ALREADY_EXISTS, ("init", "collect", "--exist-ok"), {}),
        (E.ALREADY_EXISTS, ("declare", "a", "--stage", "write"), {}),
        (E.ALREADY_CONSUMED, ("consume", "q", "--agent", "second", "-o", out), {}),
        (E.NOT_A_CONSUMER, ("consume", "r", "--agent", "x", "--role", "auditor", "-o", out), {}),
        (E.UNSUPPORTED, ("--task", "broken", "status"), {}),
    ]


@MOTO_ONLY
def test_every_exit_code_is_reached(cli: Cli, task: om.Task, tmp_path: Path) -> None:
    scenarios = _scenarios(cli, task, tmp_path)

    def run(scenario: tuple[int, tuple[str, ...], dict[str, str]]) -> Any:
        code, args, extra = scenario
        return cli.json(*args, code=code, env=cli.environ(**extra))

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        errors = list(pool.map(run, scenarios))
    by_args = {args: err for (_, args, _), err in zip(scenarios, errors, strict=True)}
    waiting = by_args[("claim", "b", "--agent", "x")]
    assert waiting["file_id"] == "b" and "waiting for dependencies" in waiting["reason"]
    exists = by_args[("init", "collect", "--exist-ok")]
    assert exists["error"] == "AlreadyExists" and "with other settings" in exists["message"]
    assert by_args[("declare", "a", "--stage", "write")]["error"] == "DeclarationConflict"
    broken_key = engine(om.Task.open(task.store, "broken")).shard_key("collect", "x")
    assert by_args[("--task", "broken", "status")]["key"] == broken_key
    assert task.entry("bad").state is om.State.failed  # a mismatch sends it back
    assert not (tmp_path / "bad").exists()  # nothing unverified is left behind
    assert task.entry("stale").owner == "new"  # the fenced holder changed nothing

    # Consuming to stdout: stdout is for data only, so even the JSON error goes to stderr.
    to_stdout = cli.run("--json", "consume", "a", "--agent", "x", code=E.NOT_READY)
    assert to_stdout.stdout == b"" and json.loads(to_stdout.stderr)["error"] == "NotReady"
    human = cli.run("consume", "a", "--agent", "x", code=E.NOT_READY)
    assert human.stdout == b""
    assert human.stderr == "objmanifest: not ready: 'a' is pending, not ready\n"


@MOTO_ONLY
def test_exit_codes_of_stores_that_cannot_be_trusted(cli: Cli, task: om.Task) -> None:
    task.declare("a", "collect")
    with LosingProxy(cli.env["AWS_ENDPOINT_URL"]) as proxy:
        lost = cli.json(
            "--endpoint-url",
            proxy.endpoint_url,
            "--cas-attempts",
            "3",
            "claim",
            "a",
            "--agent",
            "x",
            code=E.CONFLICT_RETRIES_EXHAUSTED,
        )
    assert "3 lost races" in lost["message"]
    assert task.entry("a").state is om.State.pending
    with FaultProxy(cli.env["AWS_ENDPOINT_URL"]) as proxy:
        proxy.strip_conditional_headers = True  # moto checks no signatures, so this passes
        refused = cli.json(
            "--endpoint-url",
            proxy.endpoint_url,
            "--task",
            "other",
            "init",
            "collect",
            code=E.UNSUPPORTED,
        )
    assert refused["error"] == "UnsupportedStore"


@MOTO_ONLY
def test_a_manifest_from_a_newer_objmanifest_exits_12_and_is_left_alone(
    cli: Cli, task: om.Task
) -> None:
    task.declare("a", "collect")
    shard_key = engine(task).shard_key("collect", "a")
    shard = json.loads(raw_get(task.store, shard_key))
    shard["schema_version"] = 99
    newer_shard = json.dumps(shard).encode()
    raw_put(task.store, shard_key, newer_shard)
    for args in (("show", "a"), ("status",), ("claim", "a", "--agent", "x")):
        refused = cli.json(*args, code=E.UNSUPPORTED)
        assert refused["error"] == "UnsupportedSchema", refused
        assert refused["key"] == shard_key
        assert "schema_version 99" in refused["message"]
    assert raw_get(task.store, shard_key) == newer_shard

    header = json.loads(raw_get(task.store, "job/task.json"))
    header["schema_version"] = 7
    newer_header = json.dumps(header).encode()
    raw_put(task.store, "job/task.json", newer_header)
    refused = cli.json("status", code=E.UNSUPPORTED)
    assert (refused["error"], refused["key"]) == ("UnsupportedSchema", "job/task.json")
    human = cli.run("init", "collect", "write", "check", "--exist-ok", code=E.UNSUPPORTED)
    where = task.store.describe("job/task.json")  # the full address of the object
    assert human.stderr.startswith(f"objmanifest: unsupported schema: {where} has ")
    assert raw_get(task.store, "job/task.json") == newer_header


@MOTO_ONLY
@pytest.mark.parametrize(
    ("source", "text", "error", "message"),
    [
        (
            "file",
            b'raw/a\n{"file_id": "raw/b", "stage"\n',
            "InvalidInput",
            "line 2 is not valid JSON",
        ),
        (
            "stdin",
            b'[{"file_id": "raw/a"}, ["raw/b"]]',
            "InvalidInput",
            "item 2 of the --from input is not a JSON object: ['raw/b']",
        ),
        ("stdin", b'raw/a\n{"file_id": 5}\n', "InvalidInput", "invalid declaration {"),
        ("file", b"raw/a\nraw/../escape\n", "InvalidFileId", "'raw/../escape'"),
    ],
    ids=["malformed-json-line", "not-an-object", "file-id-not-a-string", "bad-file-id"],
)
def test_bad_declare_from_input_exits_2_and_declares_nothing(
    cli: Cli, task: om.Task, tmp_path: Path, source: str, text: bytes, error: str, message: str
) -> None:
    if source == "file":
        plan = tmp_path / "plan.jsonl"
        plan.write_bytes(text)
        args: tuple[str, ...] = ("declare", "--from", str(plan), "--stage", "collect")
        stdin = b""
    else:
        args, stdin = ("declare", "--from", "-", "--stage", "collect"), text
    refused = cli.json(*args, code=E.USAGE, stdin=stdin)
    assert refused["error"] == error, refused
    assert message in refused["message"], refused
    human = cli.run(*args, code=E.USAGE, stdin=stdin)
    assert human.stderr.startswith("objmanifest: invalid input: "), human.stderr
    assert task.entries() == [] and len(task.index()) == 0  # nothing of the batch declared


@MOTO_ONLY
def test_interrupting_a_wait_exits_130(cli: Cli, task: om.Task) -> None:
    # A child inherits an ignored SIGINT (a suite run under nohup or as a background job
    # of a shell without job control): catch it here while the child starts, so the child
    # starts with SIGINT at its default (exec resets a caught signal, not an ignored one).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = cli.popen("claim", "--stage", "check", "--agent", "x", "--wait", "60")
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert b"waiting up to 60s" in read_line(proc.stderr)
        proc.send_signal(signal.SIGINT)
    finally:
        code, out, err = finish(proc)
    cli.check(Result(("claim",), code, out, err))
    assert (code, out) == (E.INTERRUPTED, b"")
    assert err.endswith("objmanifest: interrupted\n")


# -- waiting --------------------------------------------------------------------------------


def test_consume_waits_for_the_file_and_claim_gives_up_after_its_wait(
    cli: Cli, task: om.Task, tmp_path: Path
) -> None:
    task.declare("late", "collect")
    out = tmp_path / "late.txt"
    proc = cli.popen("consume", "late", "--agent", "reader", "-o", str(out), "--wait", "60")
    try:
        assert b"late is not ready yet; waiting up to 60s" in read_line(proc.stderr)
        produce(task, "late", b"worth the wait")
    finally:
        code, stdout, err = finish(proc)
    cli.check(Result(("consume",), code, stdout, err))
    assert code == 0, err
    assert out.read_bytes() == b"worth the wait"
    assert stdout.decode().startswith("consumed late -> ")

    started = time.monotonic()
    gave_up = cli.json(
        "claim", "--stage", "write", "--agent", "x", "--wait", "1", code=E.NOTHING_CLAIMABLE
    )
    assert time.monotonic() - started >= 1
    assert "after waiting 1s" in gave_up["message"]


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = run()
    return result, time.monotonic() - started


@MOTO_ONLY
def test_consume_wait_gives_up_not_ready_after_its_wait(
    cli: Cli, task: om.Task, tmp_path: Path
) -> None:
    task.declare("never", "collect")
    out = tmp_path / "never.bin"
    args = ("consume", "never", "--agent", "reader", "-o", str(out))
    at_once, baseline = timed(lambda: cli.json(*args, code=E.NOT_READY))
    waited, took = timed(lambda: cli.json(*args, "--wait", "4", code=E.NOT_READY))
    for refused in (at_once, waited):
        assert refused["error"] == "NotReady"
        assert refused["message"] == "'never' is pending, not ready"
    # The wait itself (beyond what a command costs anyway) is about the 4 s asked for.
    assert took >= 4 and took - baseline < 4 + 2, (baseline, took)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert task.entry("never").state is om.State.pending


@MOTO_ONLY
def test_an_undeclared_id_is_not_waited_for(cli: Cli, task: om.Task, tmp_path: Path) -> None:
    task.declare("known", "collect")
    _, baseline = timed(lambda: cli.json("show", "known"))
    for args in (
        ("consume", "unknown", "--agent", "r", "-o", str(tmp_path / "u"), "--wait", "60"),
        ("claim", "unknown", "--agent", "p", "--wait", "60"),
    ):
        refused, took = timed(lambda a=args: cli.json(*a, code=E.NOT_FOUND))  # type: ignore[misc]
        assert refused["error"] == "NotFound"
        assert "'unknown' is not declared in task 'job'" in refused["message"]
        assert took < baseline + 5, (args, baseline, took)  # not the 60 s it may wait
    human = cli.run("consume", "unknown", "--agent", "r", "--wait", "60", code=E.NOT_FOUND)
    assert "waiting up to" not in human.stderr
    assert human.stderr == "objmanifest: not found: 'unknown' is not declared in task 'job'\n"


GONE_READER = r"objmanifest: stdout was closed before all output was written\n\Z"


@MOTO_ONLY
@pytest.mark.parametrize(
    ("stdout", "consumers", "another_agent", "stderr"),
    [
        ("reader-gone", [], E.ALREADY_CONSUMED, GONE_READER),
        ("reader-gone", ["checker"], E.OK, GONE_READER),
    ],
    ids=["queue", "broadcast"],
)
def test_consume_to_a_stdout_that_went_away_can_be_consumed_again(
    cli: Cli,
    task: om.Task,
    tmp_path: Path,
    stdout: str,
    consumers: list[str],
    another_agent: int,
    stderr: str,
) -> None:
    """The entry is marked before the bytes are copied to stdout; when the copy fails (the
    reader went away), the same consumer consuming again gets the same data. (A stdout
    closed outright is refused before anything is done:
    tests/test_hostile_input_cli.py::test_consume_with_stdout_closed_marks_nothing.)"""
    task.declare("q", "collect", consumers=consumers)
    data = os.urandom(300_000)
    produce(task, "q", data)
    role = ("--role", "checker") if consumers else ()
    command = cli.command("consume", "q", "--agent", "reader", *role, "-o", "-")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a byte is written
    try:
        proc = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=cli.environ(),
            cwd=cli.cwd,
            timeout=60,
        )
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    cli.check(Result(("consume",), proc.returncode, b"", err))
    assert proc.returncode == E.ERROR, err
    assert re.match(stderr, err), err
    marked = task.entry("q")
    assert marked.consumed_by == (("checker",) if consumers else ("reader",))
    assert marked.state is om.State.consumed

    again = cli.run("consume", "q", "--agent", "reader", *role, "-o", "-")
    assert again.stdout == data and again.stderr == ""
    assert cli.json("show", "q")["consumed_by"] == list(marked.consumed_by)  # marked once
    # A queue entry stays taken by the agent that marked it; a role's mark serves any
    # agent of that role.
    out = tmp_path / "other.bin"
    cli.run("consume", "q", "--agent", "other", *role, "-o", str(out), code=another_agent)
    assert out.exists() is (another_agent == E.OK)


# -- credentials and unexpected errors ------------------------------------------------------


@MOTO_ONLY
def test_credentials_are_not_printed_even_in_tracebacks(cli: Cli) -> None:
    # Every run through `cli` checks its output for the sentinel credentials; --debug adds
    # the tracebacks of an expected error and of a store error to what is checked.
    assert cli.forbidden == (SENTINEL_SECRET,)
    missing = cli.run("--debug", "show", "nope", code=E.NOT_FOUND)
    assert "Traceback" in missing.stderr
    cli.run(
        "--debug",
        "--url",
        f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p",
        "status",
        code=E.STORE_ERROR,
    )


def test_usage_errors_that_need_no_store(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OBJMANIFEST_URL", raising=False)
    assert main(["--task", "t", "status"]) == E.USAGE
    assert capsys.readouterr().err == (
        "objmanifest: error: no store given: pass --url s3://BUCKET/PREFIX or set OBJMANIFEST_URL\n"
    )
    assert main(["serve", "--backend", "moto", "--data", "d", "--json"]) == E.USAGE
    assert json.loads(capsys.readouterr().out)["message"].startswith("--data needs")


def test_an_unexpected_error_is_one_line_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(ctx: Any) -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.setitem(app.HANDLERS, "status", boom)
    assert main(["--url", "s3://b/p", "--task", "t", "status"]) == E.ERROR
    err = capsys.readouterr().err
    assert err == (
        "objmanifest: unexpected error: RuntimeError: something nobody expected "
        "(run with --debug for the traceback)\n"
    )
    assert main(["--json", "--task", "t", "status", "--debug", "--url", "s3://b/p"]) == E.ERROR
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "error": "RuntimeError",
        "message": "RuntimeError: something nobody expected",
        "exit_code": 1,
    }
    assert "Traceback" in captured.err and "boom" in captured.err


def test_version_prints_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "objmanifest", "--version"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"objmanifest {importlib.metadata.version('objmanifest')}\n"
    assert om.__version__ == importlib.metadata.version("objmanifest")


# -- serve ------------------------------------------------------------------------------------


def weed_pids(data_dir: Path) -> list[int]:
    """``weed`` processes serving ``data_dir`` (Linux), to be sure none outlives a test."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if f"-dir={data_dir}".encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
    return pids


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``objmanifest serve`` in a child; yields it and its first line of stdout. Whatever
    happens, nothing it started is left running: it is asked to stop (so it stops its
    server), then killed, and so is any SeaweedFS it started."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "objmanifest", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        bufsize=0,
    )
    try:
        yield proc, read_line(proc.stdout, timeout=90).decode()
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if "--data" in args:
            for pid in weed_pids(Path(args[args.index("--data") + 1])):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGINT) -> tuple[int, str]:
    proc.send_signal(sig)
    code, _, err = finish(proc, timeout=30)
    return code, err


def test_serve_moto_answers_s3_and_stops_on_ctrl_c() -> None:
    port = servers.free_port()
    env = {
        **base_env(),
        "AWS_SECRET_ACCESS_KEY": SENTINEL_SECRET,
        "AWS_ACCESS_KEY_ID": SENTINEL_KEY_ID,
    }
    with serving("--port", str(port), "--bucket", "served", "--json", env=env) as (proc, line):
        info = json.loads(line)
        assert info["endpoint_url"] == f"http://127.0.0.1:{port}"
        assert info["env"] == {
            "AWS_ENDPOINT_URL": info["endpoint_url"],
            "AWS_ACCESS_KEY_ID": servers.LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": servers.LOCAL_SECRET_KEY,
            "AWS_DEFAULT_REGION": servers.LOCAL_REGION,
            "OBJMANIFEST_URL": "s3://served",
        }
        client = servers.LocalS3("moto", info["endpoint_url"], None).client()
        client.put_object(Bucket="served", Key="k", Body=b"v")
        assert client.get_object(Bucket="served", Key="k")["Body"].read() == b"v"
        code, err = stop(proc)
    assert code == 0, err
    assert SENTINEL_SECRET not in line + err and SENTINEL_KEY_ID not in line + err
    assert "server stopped" not in err  # --json: nothing but the one object


def test_serve_seaweedfs_keeps_its_data_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "weed"
    env = base_env()
    with serving(
        "--backend", "seaweedfs", "--data", str(data), "--bucket", "kept", "--json", env=env
    ) as (proc, line):
        info = json.loads(line)
        assert info["data_dir"] == str(data) and info["backend"] == "seaweedfs"
        client = servers.LocalS3("seaweedfs", info["endpoint_url"], None).client()
        client.put_object(Bucket="kept", Key="k", Body=b"still here")
        code, err = stop(proc, signal.SIGTERM)
        assert code == 0, err
    with serving("--backend", "seaweedfs", "--data", str(data), env=env) as (proc, line):
        exports = [line, *(read_line(proc.stdout).decode() for _ in range(3))]
        assert exports[0].startswith("export AWS_ENDPOINT_URL=http://127.0.0.1:")
        endpoint = exports[0].strip().split("=", 1)[1]
        assert f"export AWS_SECRET_ACCESS_KEY={servers.LOCAL_SECRET_KEY}\n" in exports
        client = servers.LocalS3("seaweedfs", endpoint, None).client()
        assert client.get_object(Bucket="kept", Key="k")["Body"].read() == b"still here"
        code, err = stop(proc)
    assert code == 0, err
    assert "kept across restarts" in err and "server stopped" in err
    assert weed_pids(data) == []


# -- pieces, in process -------------------------------------------------------------------------


def test_batch_declarations_accept_arrays_objects_and_bare_ids() -> None:
    lines = 'a\n\n{"file_id": "b", "stage": "write", "consumers": ["c"]}\n'
    assert read_declarations(lines, "collect", ["dep"], []) == [
        {"depends_on": ["dep"], "consumers": [], "stage": "collect", "file_id": "a"},
        {"depends_on": ["dep"], "consumers": ["c"], "stage": "write", "file_id": "b"},
    ]
    assert read_declarations('[{"file_id": "x", "stage": "s"}]', None, [], [])[0]["stage"] == "s"
    with pytest.raises(ValueError, match="has no stage"):
        read_declarations("a\n", None, [], [])
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        read_declarations("{nope\n", "s", [], [])


def test_parser_details() -> None:
    assert parser.size("8MiB") == parser.size("8m") == 8 * 1024 * 1024
    assert parser.size("512") == 512
    assert parser.command_of(["--url", "s3://b", "--json", "demo", "--agents", "3"]) == "demo"
    assert parser.command_of(["--task", "status", "show", "x"]) == "show"
    args = parser.parse(["--json", "--task", "t1", "status", "--task", "t2"])
    assert (args.json, args.task, args.command) == (True, "t2", "status")
    args = parser.parse(["--task", "t1", "claim", "x", "--agent", "a"])
    assert (args.task, args.json, args.wait) == ("t1", False, 0.0)
    # The demo brings its own --endpoint-url and --json; given before `demo` they still count.
    args = parser.parse(["--endpoint-url", "http://s3.test", "--json", "demo", "--files", "4"])
    assert (args.command, args.endpoint_url, args.json, args.files) == (
        "demo",
        "http://s3.test",
        True,
        4,
    )


def test_waiting_backs_off_and_gives_up() -> None:
    sleeps: list[float] = []
    attempts = iter([None, None, "got it"])
    assert poll(lambda: next(attempts), 60, sleep=sleeps.append) == "got it"
    assert sleeps == [0.25, pytest.approx(0.375)]  # a Pace: quick, growing while nothing moves
    with pytest.raises(om.NotReady, match=r"^not yet$"):
        poll(lambda: (_ for _ in ()).throw(om.NotReady("not yet")), 0, (om.NotReady,))


def test_progress_bar_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not progress.wanted(io.StringIO(), disabled=False)
    assert not progress.wanted(Terminal(), disabled=True)
    screen = Terminal()
    assert progress.wanted(screen, disabled=False)
    with progress.bar(True, "put x", screen) as update:
        assert update is not None
        update(512, 1024)
        update(1024, 1024)
    with progress.bar(False, "put x", screen) as nothing:
        assert nothing is None


def test_log_lineage_and_follow_show_the_journal(cli: Cli, task: om.Task, tmp_path: Path) -> None:
    cli.run("declare", "raw", "--stage", "collect")
    cli.run("declare", "out", "--stage", "write", "--depends-on", "raw")
    cli.run("claim", "raw", "--agent", "a")
    (tmp_path / "f").write_bytes(b"bytes")
    cli.run("put", "raw", str(tmp_path / "f"), "--agent", "a", "--epoch", "1")
    history = cli.json("log", "raw")["history"]
    assert [(h["command"], h["actor"], h["from_state"], h["to_state"]) for h in history] == [
        ("declare", "", None, "pending"),
        ("claim", "a", "pending", "writing"),
        ("finish", "a", "writing", "ready"),
    ]
    assert history[-1]["checksum"] == task.entry("raw").checksum
    records = cli.json("log", "--by", "a")["records"]
    assert [r["command"] for r in records] == ["claim", "finish"]
    assert all(r["object_key"] == engine(task).shard_key("collect", "raw") for r in records)
    text = cli.run("log", "--stage", "write").text
    write_shard = engine(task).shard_key("write", "out").removeprefix("job/")
    assert re.search(rf"{re.escape(write_shard)} v\d+  declare  -  out: pending", text), text
    assert "raw" not in text  # the one shard of a task holds every stage: only write's
    piped = {k: v for k, v in cli.environ().items() if k != "COLUMNS"}
    tree = cli.run("lineage", "out", env=piped).text  # into a pipe: no line wrapped at 80
    checksum = task.entry("raw").checksum
    assert checksum is not None and len(checksum) > 40
    [raw_line] = [line for line in tree.splitlines() if "raw" in line]
    assert checksum in raw_line and "5 bytes" in raw_line and len(raw_line) > 80, tree
    graph = cli.json("lineage", "out")
    assert graph["edges"] == [["out", "raw"]]
    assert (graph["nodes"]["raw"]["producer"], graph["nodes"]["raw"]["size"]) == ("a", 5)
    assert cli.json("migrate") == {"schema_version": 2, "moved": []}
    cli.run("log", "--since", "yesterday", code=2)
    cli.run("log", "--stage", "nosuch", code=8)

    follower = cli.popen("--json", "log", "--follow", "--interval", "0.1", "--since", "1s")
    try:
        time.sleep(1.5)
        cli.run("declare", "late", "--stage", "collect")
        deadline = time.monotonic() + 30
        late: list[str] = []
        assert follower.stdout is not None
        while time.monotonic() < deadline and len(late) < 2:
            line = follower.stdout.readline()
            record = json.loads(line) if line else {}
            if any(t["item"] == "late" for t in record.get("transitions", [])):
                late.append(record["object_key"].rsplit("/", 1)[-1])
        late_shard = engine(task).shard_key("collect", "late").rsplit("/", 1)[-1]
        assert sorted(late) == sorted([late_shard, "index.json"])
    finally:
        follower.kill()
        follower.wait()


@MOTO_ONLY
def test_repair_rebuilds_a_corrupt_shard_and_says_what_it_restored(
    cli: Cli, store: om.ObjectStore
) -> None:
    """A shard garbled before any journal block was written: `repair --dry-run` says what
    it would do and writes nothing; `repair` copies the bytes aside, rebuilds the entries
    from the index, fenced, so the step that still holds epoch 1 is refused (exit 5) and a
    new claim finishes the entry."""
    task = om.Task.create(store, "job", stages=["collect"], lease_seconds=30)
    task.declare("a", "collect")
    task.declare("b", "collect", depends_on=["a"])
    producer = task.agent("p")
    first = producer.claim("a")
    assert first is not None
    producer.put(first, b"bytes of a")
    held = cli.json("claim", "b", "--agent", "fetcher")
    # Every shard a or b lives in (one, or two on a split stage), garbled.
    keys = sorted({engine(task).shard_key("collect", "a"), engine(task).shard_key("collect", "b")})
    garbled = b'{"schema_version": 2, "task_id": "job", "stage": "collect", "entr'
    for key in keys:
        raw_put(store, key, garbled)

    dry = cli.json("repair", "--dry-run")
    assert dry["dry_run"] is True
    assert [(o["key"], o["action"]) for o in dry["objects"]] == [(k, "would rebuild") for k in keys]
    assert all(raw_get(store, key) == garbled for key in keys)
    assert "dry run: nothing was written" in cli.run("repair", "--dry-run").text

    report = cli.json("repair")
    assert set(report) == {"task_id", "dry_run", "objects", "added"}
    assert (report["task_id"], report["dry_run"], report["added"]) == ("job", False, [])
    assert [o["key"] for o in report["objects"]] == keys
    entries = {}
    for obj, key in zip(report["objects"], keys, strict=True):
        assert (obj["kind"], obj["damage"], obj["action"]) == ("shard", "corrupt", "rebuilt")
        assert obj["problem"].startswith("not JSON")
        assert obj["records"] == 0 and obj["journal_complete"] is False
        assert obj["moved_to"].startswith(key.replace("job/", "job/damaged/", 1) + "@")
        assert raw_get(store, obj["moved_to"]) == garbled
        entries.update({e["file_id"]: e for e in obj["entries"]})
    assert set(entries) == {"a", "b"}
    for e in entries.values():  # only the index knew them: pending, fenced, history lost
        assert (e["state"], e["seen_state"], e["seen_epoch"]) == ("pending", None, None)
        assert e["epoch"] > 1 and "consumers" in e["lost"] and "depends_on" not in e["lost"]
    assert task.entry("b").depends_on == ("a",)

    refused = cli.json(
        "put",
        "b",
        "-",
        "--agent",
        "fetcher",
        "--epoch",
        str(held["epoch"]),
        code=E.LEASE_LOST,
        stdin=b"late",
    )
    assert refused["error"] == "LeaseLost"
    for file_id in ("a", "b"):
        claim = cli.json("claim", file_id, "--agent", "fetcher")
        assert claim["epoch"] == entries[file_id]["epoch"] + 1
        cli.run(
            "put",
            file_id,
            "-",
            "--agent",
            "fetcher",
            "--epoch",
            str(claim["epoch"]),
            stdin=f"bytes of {file_id}".encode(),
        )
        assert task.agent("reader").consume(file_id) == f"bytes of {file_id}".encode()
    assert cli.json("repair") == {"task_id": "job", "dry_run": False, "objects": [], "added": []}
    assert "nothing is damaged" in cli.run("repair").text


# -- gc (cleanup) ----------------------------------------------------------------------


def test_gc_dry_run_then_gc_report_and_json(cli: Cli, task: om.Task, tmp_path: Path) -> None:
    cli.run("declare", "raw", "--stage", "collect")
    cli.run("claim", "raw", "--agent", "a")
    stale = engine(task).layout.data("collect", "raw", 1)
    transfer.upload(task.store, stale, b"abandoned")
    cli.run("fail", "raw", "gave up", "--agent", "a", "--epoch", "1")
    cli.run("claim", "raw", "--agent", "a")
    (tmp_path / "f").write_bytes(b"bytes")
    cli.run("put", "raw", str(tmp_path / "f"), "--agent", "a", "--epoch", "2")
    dry = cli.json("gc", "--dry-run")
    assert dry["dry_run"] is True and dry["bytes_freed"] == len(b"abandoned")
    assert dry["removed"]["fenced_data"] == {"count": 1, "bytes": 9, "keys": [stale]}
    assert set(dry["removed"]) == {
        "fenced_data",
        "fenced_upload_object",
        "upload",
        "probe",
        "consumed_data",
    }
    assert "would remove 1 object(s)/upload(s), 9 bytes" in cli.run("gc", "--dry-run").text
    text = cli.run("gc").text
    assert "removed 1 object(s)/upload(s), 9 bytes" in text and stale in text
    assert cli.json("gc")["bytes_freed"] == 0
    cli.run("consume", "raw", "--agent", "b", "-o", str(tmp_path / "out"))
    gone = cli.json("gc", "--consumed-older-than", "0")["removed"]["consumed_data"]
    assert gone["count"] == 1 and gone["bytes"] == 5
    cli.run("gc", "--consumed-older-than", "-1", code=2)


def test_archive_moves_old_terminal_entries(cli: Cli, task: om.Task, tmp_path: Path) -> None:
    cli.run("declare", "raw", "--stage", "collect")
    cli.run("declare", "out", "--stage", "write", "--depends-on", "raw")
    cli.run("claim", "raw", "--agent", "a")
    (tmp_path / "f").write_bytes(b"bytes")
    cli.run("put", "raw", str(tmp_path / "f"), "--agent", "a", "--epoch", "1")
    cli.run("consume", "raw", "--agent", "c", "-o", str(tmp_path / "got"))
    assert "archived" not in cli.json("status")
    young = cli.json("archive")
    assert young == {
        "archived": {"collect": [], "write": [], "check": []},
        "objects": [],
        "adopted": [],
    }
    consumed_at = task.entry("raw").updated_at
    assert consumed_at is not None
    while task.store.now() <= consumed_at:  # a new process reads the store's clock in seconds
        time.sleep(0.1)
    report = cli.json("archive", "--older-than", "0")
    assert report["archived"]["collect"] == ["raw"]
    [key] = report["objects"]
    shard = engine(task).shard_key("collect", "raw").rsplit("/", 1)[-1].removesuffix(".json")
    assert key.startswith(f"job/archive/{shard}/") and key.endswith(".json")
    assert cli.run("archive", "--older-than", "0").text.strip() == "archived 0 entries"
    assert task.entry("raw").state is om.State.consumed
    assert [h["command"] for h in cli.json("log", "raw")["history"]][-1] == "archive"
    assert cli.json("lineage", "out")["edges"] == [["out", "raw"]]
    status = cli.json("status")
    assert status["archived"] == {"collect": 1, "write": 0, "check": 0}
    assert status["stages"]["collect"]["consumed"] == 1
    cli.run("archive", "--older-than", "-1", code=2)


def test_the_sdks_warnings_are_kept_back_while_commands_run_and_put_back_after() -> None:
    """Commands of one process running at once (``main`` in threads) share the kept-back
    levels: the first sets them, the last puts them back, whatever order they end in."""
    loggers = [logging.getLogger(name) for name in app.SDK_LOGGERS]
    before = [logger.level for logger in loggers]
    loggers[0].setLevel(logging.DEBUG)  # set by the caller: left as it is
    kept = [logging.ERROR if level == logging.NOTSET else level for level in before[1:]]
    try:
        first, second = app.sdk_warnings_kept_back(False), app.sdk_warnings_kept_back(False)
        first.__enter__()
        assert [logger.level for logger in loggers] == [logging.DEBUG, *kept]
        second.__enter__()
        first.__exit__(None, None, None)  # the first ends while the second runs
        assert [logger.level for logger in loggers] == [logging.DEBUG, *kept]
        second.__exit__(None, None, None)
        assert [logger.level for logger in loggers] == [logging.DEBUG, *before[1:]]
        with app.sdk_warnings_kept_back(True):  # --debug: everything shows
            assert [logger.level for logger in loggers] == [logging.DEBUG, *before[1:]]
    finally:
        loggers[0].setLevel(before[0])
