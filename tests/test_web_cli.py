"""``objmanifest web`` as a process: it serves a task's board (or the tasks under the URL)
on loopback until SIGTERM, refuses a non-loopback host without a token, checks the token
on every request, and says which extra to install when its framework is missing."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from objmanifest.wire import exits
from tests.support.stores import Server
from tests.test_cli import Cli, base_env, finish, make_cli, read_line
from tests.test_hostile_input_cli import install_hint

pytestmark = pytest.mark.one_server  # the web page's CLI, not the backend, is under test

E = exits.ExitCode
TOKEN = "cli-web-token-0123456789abcdef"


@pytest.fixture
def cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    return make_cli(server, prefix, tmp_path)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@contextmanager
def web(cli: Cli, *args: str, **env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``objmanifest --json web --port 0 ARGS``: its URL once it listens; stopped with
    SIGTERM at the end, which must end it with exit code 0."""
    proc = cli.popen("--json", "web", "--port", "0", *args, **env)
    try:
        line = read_line(proc.stdout)
        assert line, proc.stderr.read().decode() if proc.stderr else ""
        started = json.loads(line)
        assert started["url"].startswith("http://127.0.0.1:")
        yield started["url"], proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err
    for secret in (*cli.forbidden, TOKEN):
        assert secret.encode() not in out and secret not in err


@pytest.mark.layouts
def test_it_serves_a_tasks_board_and_the_tasks_under_the_url(cli: Cli) -> None:
    cli.run("init", "collect", "write")
    cli.run("declare", "raw/a.json", "--stage", "collect")
    with web(cli) as (url, _):
        status, body = get(url + "api/tasks/job")
        assert status == 200
        board = json.loads(body)
        assert board["task_id"] == "job" and board["totals"]["pending"] == 1
        status, page = get(url)
        assert status == 200 and b'data-view="board"' in page
        status, _ = get(url + "api/tasks/job/stages/collect")
        assert status == 200
        status, body = get(url + "metrics")
        assert status == 200
        assert b'objmanifest_entries{stage="collect",state="pending",task="job"} 1.0' in body
    with web(cli, OBJMANIFEST_TASK="") as (url, _):
        status, body = get(url + "api/tasks")
        assert [t["task_id"] for t in json.loads(body)["tasks"]] == ["job"]
        status, page = get(url)
        assert b'data-view="tasks"' in page


def test_a_token_is_checked_on_every_request_and_never_printed(cli: Cli) -> None:
    cli.run("init", "collect")
    with web(cli, OBJMANIFEST_WEB_TOKEN=TOKEN) as (url, _):
        assert get(url + "api/tasks/job")[0] == 401
        assert get(url)[0] == 401
        assert get(url + "metrics")[0] == 401
        ok, body = get(url + "api/tasks/job", {"Authorization": f"Bearer {TOKEN}"})
        assert ok == 200 and TOKEN.encode() not in body
        ok, body = get(url + "metrics", {"Authorization": f"Bearer {TOKEN}"})
        assert ok == 200 and b"objmanifest_entries{" in body


def test_a_task_that_does_not_exist_is_refused_at_start(cli: Cli) -> None:
    refused = cli.json("web", "--port", "0", "--task", "nothing", code=E.NOT_FOUND)
    assert "nothing" in refused["message"]


def test_a_port_in_use_is_an_error_that_names_it(cli: Cli) -> None:
    cli.run("init", "collect")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = cli.json("web", "--port", str(port), code=E.ERROR)
    assert f"127.0.0.1:{port}" in failed["message"]


def run_web(*args: str, prelude: str = "") -> tuple[int, dict[str, Any]]:
    """``objmanifest --json web ARGS`` in a process that never reaches a store."""
    code = (
        f"import sys\n{prelude}\nfrom objmanifest.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    env = {**base_env(), "OBJMANIFEST_URL": "s3://nowhere/at-all"}
    env.pop(TOKEN_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", code, "--json", "web", *args],
        capture_output=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, json.loads(proc.stdout)


TOKEN_ENV = "OBJMANIFEST_WEB_TOKEN"


def test_a_non_loopback_host_needs_a_token() -> None:
    code, refused = run_web("--host", "0.0.0.0")
    assert code == E.USAGE
    assert "OBJMANIFEST_WEB_TOKEN" in refused["message"] and "0.0.0.0" in refused["message"]
    code, refused = run_web("--host", "0.0.0.0", "--token", "short")
    assert code == E.USAGE and "at least 16" in refused["message"]


def test_without_the_web_extra_it_says_which_extra_to_install() -> None:
    code, refused = run_web(prelude="sys.modules['starlette'] = None")
    assert code == E.UNSUPPORTED
    assert refused["error"] == "ExtraMissing"
    assert "objmanifest[web]" in refused["message"] and "starlette" in refused["message"]
    assert refused["message"].endswith(install_hint("web")), refused["message"]
    code, refused = run_web(prelude="sys.modules['uvicorn'] = None")
    assert code == E.UNSUPPORTED and "uvicorn" in refused["message"]


def test_other_commands_do_not_import_the_web_framework() -> None:
    code = (
        "import sys\n"
        "from objmanifest.cli import main\n"
        "main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=base_env(), timeout=60
    )
    assert proc.stdout.decode().strip().splitlines()[-1] == "[]"
