"""The suite collects on a machine that has none of the emulators: collecting a module
starts no server (a module that made its parameters from a running Azurite once stopped
the README's test command with a collection error wherever Azurite was not installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_whole_suite_collects_without_azurite_installed(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "OBJMANIFEST_AZURITE_DIR": str(tmp_path / "no-azurite-here"),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
    }
    env.pop("STORAGE_EMULATOR_HOST", None)
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert "error" not in collected.stdout.splitlines()[-1], collected.stdout[-3000:]
    assert "test_azure_store.py::test_secrets_are_never_shown[key]" in collected.stdout
