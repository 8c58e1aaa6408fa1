"""``file://`` through the faces that ask about the store itself: ``doctor`` finds a
directory safe and says how it answered, and ``iam-policy`` says plainly that a directory
has no cloud policy, and what permissions it needs instead. (Every other command runs on
``file://`` in the CLI, MCP and web suites: ``OBJMANIFEST_TEST_BACKENDS=file``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from objmanifest.cli import main
from objmanifest.store.file import FileStore
from objmanifest.store.probe import CREATE_RACE, ORDER, UPDATE_RACE


def test_doctor_finds_a_directory_safe_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OBJMANIFEST_", "AWS_"))}
    done = subprocess.run(
        [sys.executable, "-m", "objmanifest", "doctor", "--json", "--url", f"file://{root}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert done.returncode == 0 and report["safe"] and report["exit_code"] == 0, report
    assert list(checks) == list(ORDER)
    assert all(c["verdict"] == "ok" for c in checks.values() if c["required"]), report
    for race in (CREATE_RACE, UPDATE_RACE):
        assert checks[race]["answer"].startswith("1 of 8 won"), checks[race]
    assert "exists" in checks["409 vs 412"]["answer"]
    assert "another version" in checks["409 vs 412"]["answer"]
    assert "a directory has no transit to damage" in checks["digest verification"]["answer"]
    assert report["store_time"] and abs(report["skew_seconds"]) < 60
    store = FileStore(str(root))
    assert list(store.list("")) == [] and list(store.list_uploads("")) == []


@pytest.mark.parametrize("role", ["agent", "admin"])
def test_iam_policy_says_a_directory_has_none_and_what_it_needs_instead(
    tmp_path: Path, capsys: Any, role: str
) -> None:
    url = f"file://{tmp_path}"
    assert main(["--json", "iam-policy", "--for", role, "--url", url]) == 2
    said = json.loads(capsys.readouterr().out)["message"]
    assert said.startswith(f"there is no cloud access policy for {url}: a directory is confined")
    assert f"(rwx) {tmp_path}" in said and "chmod -R g+rwXs" in said and "umask 002" in said
    assert "keep them from deleting" in said
    assert os.listdir(tmp_path) == []  # no request, nothing made
