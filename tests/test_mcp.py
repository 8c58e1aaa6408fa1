"""``objmanifest mcp`` driven by the MCP SDK's own client over stdio (``stdio_client`` and
``ClientSession``), as an LLM agent's host would drive it, against a real task: the tools
it lists, a file produced and consumed, a stalled holder fenced, bad input answered as a
tool error, two servers as two agents handing a file over, the hold bound, and the
streamable HTTP transport on loopback. ``confine`` (the root's bound) is tested on its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession
from mcp import types as mcp_types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

import objmanifest as om
from objmanifest.mcp import server as mcp_server
from objmanifest.mcp import stdio as mcp_stdio
from objmanifest.mcp.tools import MAX_INLINE, Session, confine
from objmanifest.wire import exits
from objmanifest.wire.inputs import MAX_INPUT_BYTES
from tests.support.internals import engine
from tests.support.stores import Server, memory_store
from tests.test_cli import (
    MOTO_ONLY,
    Cli,
    base_env,
    finish,
    make_cli,
    produce,
    read_line,
)
from tests.test_hostile_input_cli import install_hint

pytestmark = pytest.mark.one_server  # the MCP server, not the backend, is under test

E = exits.ExitCode
MiB = 1024 * 1024
TOOLS = {
    "status",
    "show",
    "declare",
    "claim",
    "put",
    "renew",
    "fail",
    "release",
    "consume",
    "log",
    "lineage",
}


@pytest.fixture
def cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    return make_cli(server, prefix, tmp_path)


class Agent:
    """One MCP client session on one ``objmanifest mcp`` process."""

    def __init__(self, session: ClientSession | Client, errlog: Path) -> None:
        self.session = session
        self.errlog = errlog

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """The tool's result; fails the test if it is an error."""
        failed, data = await self.answer(tool, **arguments)
        assert not failed, data
        return data

    async def error(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """The tool's error; fails the test if the call succeeded."""
        failed, data = await self.answer(tool, **arguments)
        assert failed, data
        assert {"error", "message", "exit_code", "next_step"} <= set(data), data
        return data

    async def answer(self, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
        result = await self.session.call_tool(tool, arguments)
        assert isinstance(result, mcp_types.CallToolResult)
        assert len(result.content) == 1 and isinstance(result.content[0], mcp_types.TextContent)
        data: dict[str, Any] = json.loads(result.content[0].text)
        assert result.structured_content == data
        return bool(result.is_error), data


@asynccontextmanager
async def agent(
    cli: Cli, name: str, *args: str, root: Path | None = None, pidfile: Path | None = None
) -> AsyncIterator[Agent]:
    """``python -m objmanifest mcp --agent NAME ARGS`` with a client session on it; its
    stderr in a file, which must not carry a credential. With ``pidfile`` the server writes
    its process id there first (to stop and continue it)."""
    root = root or cli.cwd
    errlog = cli.cwd / f"mcp-{name}.err"
    command = ["-m", "objmanifest"]
    if pidfile is not None:
        command = [
            "-c",
            f"import os, sys; open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
            "from objmanifest.cli import main\nsys.exit(main(sys.argv[1:]))",
        ]
    params = StdioServerParameters(
        command=sys.executable,
        args=[*command, "mcp", "--agent", name, "--root", str(root), *args],
        env=cli.env,
        cwd=cli.cwd,
    )
    with errlog.open("w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield Agent(session, errlog)
    text = errlog.read_text()
    for secret in cli.forbidden:
        assert secret not in text


def run(main: Any) -> None:
    anyio.run(main)


# -- one agent ---------------------------------------------------------------------------


@pytest.mark.layouts
def test_an_agent_declares_claims_puts_and_consumes_through_the_tools(
    cli: Cli, store: om.ObjectStore
) -> None:
    task = om.Task.create(store, "job", ["draft", "review"])
    (cli.cwd / "notes").mkdir()
    (cli.cwd / "notes" / "b.md").write_bytes(b"# b\n" * 1000)

    async def main() -> None:
        async with agent(cli, "writer") as a:
            listed = await a.session.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            for tool in listed.tools:
                assert tool.description and len(tool.description) > 80, tool.name
                assert tool.input_schema["type"] == "object"
            put = next(t for t in listed.tools if t.name == "put")
            assert set(put.input_schema["properties"]) == {"file_id", "path", "text"}

            entry = await a.call("declare", file_id="a.txt", stage="draft")
            assert entry["state"] == "pending"
            await a.call("declare", file_id="b.md", stage="draft")
            await a.call("declare", file_id="c.txt", stage="review", depends_on=["a.txt"])

            claimed = await a.call("claim", file_id="a.txt")
            assert claimed["epoch"] == 1 and claimed["agent"] == "writer"
            assert "epoch" not in put.input_schema["properties"]  # the server keeps it
            status = await a.call("status")
            assert [h["file_id"] for h in status["held"]] == ["a.txt"]
            renewed = await a.call("renew", file_id="a.txt")
            assert (
                renewed["epoch"] == 1 and renewed["lease_expires_at"] >= claimed["lease_expires_at"]
            )
            made = await a.call("put", file_id="a.txt", text="héllo, wörld\n")
            assert made["state"] == "ready" and made["size"] == len("héllo, wörld\n".encode())

            claimed = await a.call("claim", stage="draft")
            assert claimed["file_id"] == "b.md"
            made = await a.call("put", file_id="b.md", path="notes/b.md")
            assert made["state"] == "ready" and made["size"] == 4000

            got = await a.call("consume", file_id="a.txt")
            assert got["text"] == "héllo, wörld\n" and got["state"] == "consumed"
            got = await a.call("consume", file_id="b.md", path="copy.md")
            assert Path(got["path"]) == (cli.cwd / "copy.md").resolve()
            assert (cli.cwd / "copy.md").read_bytes() == b"# b\n" * 1000
            shown = await a.call("show", file_id="b.md")
            assert shown["state"] == "consumed"

            await a.call("declare", file_id="d.txt", stage="draft")
            await a.call("claim", file_id="d.txt")
            back = await a.call("release", file_id="d.txt")
            assert back["state"] == "pending" and back["retry_count"] == 0
            await a.call("claim", file_id="d.txt")
            failed = await a.call("fail", file_id="d.txt", reason="the source was empty")
            assert failed["state"] == "failed" and failed["retry_count"] == 1
            assert failed["error"] == "the source was empty"
            gone = await a.error("release", file_id="d.txt")
            assert gone["error"] == "LeaseLost" and "fail" in gone["message"]

            history = await a.call("log", file_id="a.txt")
            states = [h["to_state"] for h in history["history"]]
            assert states == ["pending", "writing", "writing", "ready", "consumed"]  # a renewal
            assert (await a.call("log", limit=2))["total"] > 2
            lineage = await a.call("lineage", file_id="c.txt")
            assert set(lineage["nodes"]) == {"a.txt", "c.txt"}
            assert lineage["edges"] == [["c.txt", "a.txt"]]
            status = await a.call("status")
            assert status["held"] == [] and status["totals"]["consumed"] == 2

    run(main)
    assert task.entry("a.txt").consumed_by == ("writer",)


# -- fencing -----------------------------------------------------------------------------


def test_a_stalled_holder_is_fenced_and_its_put_returns_the_lease_error(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    task = om.Task.create(store, "job", ["draft"], lease_seconds=1)
    task.declare("f.txt", "draft")
    quick = task.agent("quick")
    pidfile = tmp_path / "server.pid"

    async def main() -> None:
        async with agent(cli, "slow", pidfile=pidfile) as a:
            assert (await a.call("claim", file_id="f.txt"))["epoch"] == 1
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGSTOP)  # the holder stalls: nothing renews its lease
            try:
                taken = None
                deadline = time.monotonic() + 30
                while taken is None and time.monotonic() < deadline:
                    with contextlib.suppress(om.NotClaimable):
                        taken = quick.claim("f.txt")
                    if taken is None:
                        await anyio.sleep(0.3)
                assert taken is not None and taken.epoch == 2
            finally:
                os.kill(pid, signal.SIGCONT)
            quick.put(taken, b"quick\n")
            lost = await a.error("put", file_id="f.txt", text="slow\n")
            assert lost["error"] == "LeaseLost" and lost["exit_code"] == E.LEASE_LOST
            assert "f.txt" in lost["message"]
            again = await a.error("put", file_id="f.txt", text="slow\n")
            assert again["error"] == "LeaseLost"

    run(main)
    assert task.agent("check").consume("f.txt") == b"quick\n"


# -- bad input ---------------------------------------------------------------------------


@MOTO_ONLY
def test_bad_input_is_a_tool_error_naming_it_and_the_server_goes_on(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    om.Task.create(store, "job", ["draft"]).declare("f.txt", "draft")
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("outside\n")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    (root / "ok.txt").write_text("inside\n")

    async def main() -> None:
        async with agent(cli, "careless", root=root) as a:
            missing = await a.error("claim", file_id="no/such.txt")
            assert missing["error"] == "NotFound" and missing["exit_code"] == E.NOT_FOUND
            assert "no/such.txt" in missing["message"]
            bad = await a.error("show", file_id="../up")
            assert bad["exit_code"] == E.USAGE and "../up" in bad["message"]
            unheld = await a.error("put", file_id="f.txt", text="x")
            assert unheld["error"] == "InvalidInput" and "claim" in unheld["message"]
            neither = await a.error("claim")
            assert "file_id" in neither["message"]

            await a.call("claim", file_id="f.txt")
            for path, says in [
                ("../secret.txt", "'..'"),
                (str(tmp_path / "secret.txt"), "outside the root"),
                ("link.txt", "symlink"),
                ("nothing.txt", "not a file"),
            ]:
                refused = await a.error("put", file_id="f.txt", path=path)
                assert refused["error"] == "InvalidInput", refused
                assert says in refused["message"], refused
            both = await a.error("put", file_id="f.txt", path="ok.txt", text="x")
            assert "exactly one" in both["message"]
            large = await a.error("put", file_id="f.txt", text="x" * (MAX_INLINE + 1))
            assert str(MAX_INLINE) in large["message"] and "path=" in large["message"]

            made = await a.call("put", file_id="f.txt", path="ok.txt")  # still held
            assert made["state"] == "ready"
            out = await a.error("consume", file_id="f.txt", path=str(tmp_path / "x"))
            assert "outside the root" in out["message"]
            assert not (tmp_path / "x").exists()
            assert (await a.call("consume", file_id="f.txt"))["text"] == "inside\n"
            assert (await a.call("status"))["totals"]["consumed"] == 1

    run(main)


def rpc(proc: subprocess.Popen[bytes], message: dict[str, Any] | bytes) -> None:
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    assert proc.stdin is not None
    proc.stdin.write(data + b"\n")
    proc.stdin.flush()


def answer(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    found: dict[str, Any] = json.loads(read_line(proc.stdout, timeout=120))
    return found


@MOTO_ONLY
def test_an_oversized_or_over_deep_request_gets_a_json_rpc_error_and_the_server_goes_on(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    """A line of stdin nested 100,000 deep, or of 200 MiB, is answered with an error under
    its own id (the client would otherwise wait for ever), what was read of it is bounded
    (``wire.inputs``: 64 MiB a line, 100 deep), and the next request is served."""
    om.Task.create(store, "job", ["draft"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "objmanifest", "mcp", "--agent", "a", "--root", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli.env,
        cwd=tmp_path,
    )
    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
        hello["clientInfo"] = {"name": "test", "version": "1"}
        rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        assert answer(proc)["id"] == 1
        rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "show", '
        rpc(proc, call + b'"arguments": {"file_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}}")
        deep = answer(proc)
        assert deep["id"] == 2 and deep["error"]["code"] == -32600
        assert "nested too deeply to read" in deep["error"]["message"]
        assert "more than 100 deep" in deep["error"]["message"]
        big = b'{"jsonrpc": "2.0", "id": "big", "method": "tools/call", "params": {"name": '
        rpc(proc, big + b'"show", "arguments": {"file_id": "' + b"x" * (200 * MiB) + b'"}}}')
        huge = answer(proc)
        assert huge["id"] == "big" and huge["error"]["code"] == -32600
        assert "longer than 64 MiB, the most read at once" in huge["error"]["message"]
        peak = Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]
        assert int(peak) * 1024 < 150 * MiB + 64 * MiB, f"{peak} kB at its peak"
        rpc(
            proc,
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "status", "arguments": {}},
            },
        )
        served = answer(proc)
        assert served["id"] == 3 and not served["result"].get("isError"), served
    finally:
        code, _, _ = finish(proc)
    assert code == 0


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (b'{"jsonrpc": "2.0", "id": 7, "method": "x"}', 7),
        (b'{"params": {"id": 1, "a": ["{\\"id\\": 2"]}, "id": "s"}', "s"),
        (b'{"method": "x", "params": [[[[', None),
        (b'{"method": "x", "id": -3, "params": "' + b"y" * 1000, -3),
        (b"[1, 2]", None),
    ],
)
def test_a_refused_request_is_answered_under_its_top_level_id(line: bytes, found: Any) -> None:
    assert mcp_stdio.request_id(line) == found


def test_stdin_is_read_a_line_at_a_time_within_the_bound() -> None:
    data = io.BytesIO(b"a\n" + b"x" * (MAX_INPUT_BYTES + 10) + b"\nb\n\nlast")
    got = [(line[:3], len(line), over) for line, over in mcp_stdio.lines_of(data.read)]
    assert got == [
        (b"a", 1, False),
        (b"xxx", mcp_stdio.HEAD, True),
        (b"b", 1, False),
        (b"", 0, False),
        (b"las", 4, False),
    ]


@MOTO_ONLY
def test_binary_data_is_not_returned_inline_and_a_path_gets_it(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    task = om.Task.create(store, "job", ["draft"])
    task.declare("blob.bin", "draft")
    data = bytes(range(256)) * 64
    produce(task, "blob.bin", data)

    async def main() -> None:
        async with agent(cli, "reader") as a:
            refused = await a.error("consume", file_id="blob.bin")
            assert refused["error"] == "InvalidInput" and refused["exit_code"] == E.USAGE
            assert "not UTF-8" in refused["message"] and "path=" in refused["message"]
            got = await a.call("consume", file_id="blob.bin", path="got.bin")
            assert got["state"] == "consumed"

    run(main)
    assert (tmp_path / "got.bin").read_bytes() == data


# -- two agents --------------------------------------------------------------------------


@pytest.mark.layouts
def test_two_servers_as_two_agents_hand_a_file_over(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    om.Task.create(store, "job", ["write", "read"])
    maker_root, user_root = tmp_path / "maker", tmp_path / "user"
    maker_root.mkdir()
    user_root.mkdir()
    data = "".join(f"line {i}: ünïcode\n" for i in range(2000))
    (maker_root / "report.txt").write_text(data, encoding="utf-8")

    async def main() -> None:
        async with (
            agent(cli, "maker", root=maker_root) as maker,
            agent(cli, "user", "--role", "reviewer", root=user_root) as user,
        ):
            await maker.call("declare", file_id="report.txt", stage="write", consumers=["reviewer"])
            early = await user.error("consume", file_id="report.txt")
            assert early["error"] == "NotReady" and early["exit_code"] == E.NOT_READY

            async def consume() -> dict[str, Any]:
                return await user.call("consume", file_id="report.txt", path="in.txt", wait=30)

            async with anyio.create_task_group() as tg:
                got: dict[str, Any] = {}

                async def wait_for_it() -> None:
                    got.update(await consume())

                tg.start_soon(wait_for_it)
                await maker.call("claim", stage="write")
                await maker.call("put", file_id="report.txt", path="report.txt")
            assert got["state"] == "consumed" and got["consumed_by"] == ["reviewer"]

    run(main)
    assert (user_root / "in.txt").read_text(encoding="utf-8") == data


# -- bounds ------------------------------------------------------------------------------


@MOTO_ONLY
def test_a_claim_held_past_max_hold_is_released_without_a_retry_and_the_model_told(
    cli: Cli, store: om.ObjectStore
) -> None:
    task = om.Task.create(store, "job", ["draft"])
    task.declare_many([{"file_id": f, "stage": "draft"} for f in ("f.txt", "g.txt")])

    async def main() -> None:
        async with agent(cli, "dawdler", "--max-hold", "1") as a:
            await a.call("claim", file_id="f.txt")
            await anyio.sleep(1.5)
            status = await a.call("status")
            assert status["held"] == []
            assert any("f.txt" in n and "max-hold" in n for n in status["notices"]), status
            entry = await a.call("show", file_id="f.txt")
            assert entry["state"] == "pending" and entry["retry_count"] == 0
            late = await a.error("put", file_id="f.txt", text="late")
            assert late["error"] == "LeaseLost" and "released" in late["message"]
            await a.call("claim", file_id="g.txt")  # held when the client goes away

    run(main)
    assert task.entry("g.txt").state is om.State.pending  # released on the way out


# -- the process -------------------------------------------------------------------------


@MOTO_ONLY
def test_it_serves_streamable_http_on_loopback(cli: Cli, store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", ["draft"])
    proc = cli.popen("--json", "mcp", "--agent", "web-agent", "--http", "0")
    try:
        line = read_line(proc.stdout)
        assert line, proc.stderr.read().decode() if proc.stderr else ""
        url = json.loads(line)["url"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def main() -> None:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                tools = await session.list_tools()
                assert {t.name for t in tools.tools} == TOOLS
                a = Agent(session, Path(os.devnull))
                await a.call("declare", file_id="h.txt", stage="draft")
                await a.call("claim", file_id="h.txt")

        run(main)
        # A web page elsewhere pointing a name of its own at 127.0.0.1 is refused (DNS
        # rebinding): the SDK checks the Host header against loopback names.
        rebound = urllib.request.Request(
            url,
            data=b"{}",
            headers={"Host": "attacker.example", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=30)
        assert refused.value.code == 421
    finally:
        proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "released 1 claim" in err
    assert task.entry("h.txt").state is om.State.pending


@MOTO_ONLY
def test_a_task_that_does_not_exist_is_refused_at_start(cli: Cli) -> None:
    result = cli.run("--json", "mcp", "--agent", "a", "--task", "nothing", code=E.NOT_FOUND)
    assert result.stdout == b""  # stdout belongs to the protocol
    assert "nothing" in json.loads(result.stderr)["message"]


def test_without_the_mcp_extra_it_says_which_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['mcp'] = None\n"
        "from objmanifest.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    env = {**base_env(), "OBJMANIFEST_URL": "s3://nowhere/at-all", "OBJMANIFEST_TASK": "t"}
    proc = subprocess.run(
        [sys.executable, "-c", code, "--json", "mcp", "--agent", "a", "--root", str(tmp_path)],
        capture_output=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == E.UNSUPPORTED
    refused = json.loads(proc.stderr)
    assert refused["error"] == "ExtraMissing" and "objmanifest[mcp]" in refused["message"]
    assert refused["message"].endswith(install_hint("mcp")), refused["message"]


def test_the_server_module_imports_first_of_all() -> None:
    """``objmanifest.mcp.server`` imported before the CLI (no cycle between them)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import objmanifest.mcp.server"], capture_output=True, env=base_env()
    )
    assert proc.returncode == 0, proc.stderr.decode()


def test_other_commands_do_not_import_the_sdk() -> None:
    code = (
        "import sys\nfrom objmanifest.cli import main\nmain(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=base_env())
    assert proc.stdout.decode().strip().splitlines()[-1] == "[]"


# -- the root's bound, on its own ----------------------------------------------------------


def test_confine_keeps_every_path_inside_the_root(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    (root / "sub").mkdir(parents=True)
    (root / "inner").symlink_to(root / "sub")
    (root / "outer").symlink_to(tmp_path)
    (root / "loop").symlink_to(root / "loop")
    assert confine(root, "a.txt", "path") == root / "a.txt"
    assert confine(root, str(root / "sub" / "b"), "path") == root / "sub" / "b"
    assert confine(root, "inner/c", "path") == root / "sub" / "c"
    for given, says in [
        ("../a", "'..'"),
        ("sub/../../a", "'..'"),
        ("/etc/passwd", "outside the root"),
        ("outer/x", "symlink"),
        ("", "empty"),
        ("a\x00b", "NUL"),
        ("loop/x", "cannot be resolved"),
    ]:
        with pytest.raises(om.InvalidInput, match=says):
            confine(root, given, "path")


# -- in process, on MemoryStore (its clock runs ten times faster) ---------------------------


@asynccontextmanager
async def in_process(task: om.Task, name: str, root: Path, **kw: Any) -> AsyncIterator[Agent]:
    """The server of a ``Session`` on ``task``, with the SDK's in-process client on it."""
    session = Session(task, task.agent(name), root, **kw)
    try:
        async with Client(mcp_server.build(session)) as client:
            yield Agent(client, Path(os.devnull))
    finally:
        session.close()


def test_held_claims_outlive_their_lease_while_the_model_thinks(
    prefix: str, tmp_path: Path
) -> None:
    task = om.Task.create(memory_store(prefix), "job", ["draft"], lease_seconds=6)
    task.declare("f.txt", "draft")
    other = task.agent("other")

    async def main() -> None:
        async with in_process(task, "thinker", tmp_path) as a:
            assert (await a.call("claim", file_id="f.txt"))["epoch"] == 1
            await anyio.sleep(1.5)  # 15 s of the store's clock: the lease is 6 s (+2 s margin)
            with pytest.raises(om.NotClaimable, match="held by thinker"):
                other.claim("f.txt")
            made = await a.call("put", file_id="f.txt", text="thought through")
            assert made["state"] == "ready" and made["epoch"] == 1

    run(main)


def test_a_lease_lost_in_the_background_is_told_on_the_next_call(
    prefix: str, tmp_path: Path
) -> None:
    task = om.Task.create(memory_store(prefix), "job", ["draft"], lease_seconds=3)
    task.declare("f.txt", "draft")

    async def main() -> None:
        async with in_process(task, "holder", tmp_path) as a:
            claimed = await a.call("claim", file_id="f.txt")
            # An operator gives the claim back (``objmanifest release``) and another agent
            # takes the file: the server finds out when it next renews the lease.
            stale = om.Claim(
                task.task_id,
                "f.txt",
                "draft",
                "holder",
                claimed["epoch"],
                task.store.now(),
                shard=engine(task).layout.shard_of("draft", "f.txt"),
            )
            task.agent("holder").release(stale)
            assert task.agent("rival").claim("f.txt") is not None
            notices: list[str] = []
            for _ in range(100):
                status = await a.call("status")
                notices += status.get("notices", [])
                if notices:
                    break
                await anyio.sleep(0.05)
            assert len(notices) == 1 and "lost the lease on 'f.txt'" in notices[0], notices
            assert status["held"] == []
            lost = await a.error("put", file_id="f.txt", text="too late")
            assert lost["error"] == "LeaseLost" and lost["exit_code"] == E.LEASE_LOST
            assert "notices" not in lost  # told once

    run(main)
    assert task.entry("f.txt").owner == "rival"


def test_tool_calls_at_once_each_get_their_own_claim(prefix: str, tmp_path: Path) -> None:
    task = om.Task.create(memory_store(prefix), "job", ["draft"])
    ids = [f"f{i}.txt" for i in range(8)]
    task.declare_many([{"file_id": f, "stage": "draft"} for f in ids])

    async def main() -> None:
        async with in_process(task, "busy", tmp_path) as a:
            claimed: list[str] = []

            async def claim_and_put() -> None:
                got = await a.call("claim", stage="draft")
                claimed.append(got["file_id"])
                await a.call("put", file_id=got["file_id"], text=got["file_id"])

            async with anyio.create_task_group() as tg:
                for _ in ids:
                    tg.start_soon(claim_and_put)
            assert sorted(claimed) == ids
            assert (await a.call("status"))["held"] == []
            nothing = await a.error("claim", stage="draft")
            assert nothing["error"] == "NothingClaimable"

    run(main)
    assert {e.file_id: e.state for e in task.entries()} == dict.fromkeys(ids, om.State.ready)


def test_a_claim_past_its_hold_is_released_while_the_model_is_silent(
    prefix: str, tmp_path: Path
) -> None:
    task = om.Task.create(memory_store(prefix), "job", ["draft"], lease_seconds=30)
    task.declare("f.txt", "draft")

    async def main() -> None:
        async with in_process(task, "silent", tmp_path, max_hold=2.0) as a:
            await a.call("claim", file_id="f.txt")
            for _ in range(100):  # no tool call meanwhile: the background job releases it
                if task.entry("f.txt").state is om.State.pending:
                    break
                await anyio.sleep(0.05)
            entry = task.entry("f.txt")
            assert entry.state is om.State.pending and entry.retry_count == 0
            status = await a.call("status")
            assert status["held"] == [] and len(status["notices"]) == 1
            assert "released 'f.txt' after holding it 2s" in status["notices"][0]

    run(main)


def test_consume_into_a_fifo_or_device_under_the_root_is_refused_at_once(
    prefix: str, tmp_path: Path
) -> None:
    task = om.Task.create(memory_store(prefix), "job", ["draft"])
    task.declare("f.txt", "draft")
    maker = task.agent("maker")
    claim = maker.claim("f.txt")
    assert claim is not None
    maker.put(claim, b"made")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()

    async def main() -> None:
        async with in_process(task, "reader", tmp_path) as a:
            with anyio.fail_after(20):  # a FIFO nobody reads would block the call for ever
                refused = await a.error("consume", file_id="f.txt", path="pipe")
            assert refused["error"] == "InvalidInput"
            assert "not a regular file (a FIFO or a device)" in refused["message"]
            assert "nothing was consumed" in refused["message"]
            folder = await a.error("consume", file_id="f.txt", path="dir")
            assert "is a directory" in folder["message"]
            got = await a.call("consume", file_id="f.txt", path="got.txt")
            assert (tmp_path / "got.txt").read_bytes() == b"made" and got["state"]

    run(main)
    assert task.entry("f.txt").consumed_by == ("reader",)
