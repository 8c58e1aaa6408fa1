"""The optional extras a command needs (``objmanifest[web]``, ``objmanifest[mcp]``):
imported only by that command, and named, with how to install it, when missing."""

from __future__ import annotations

import importlib
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from ..wire.errors import ExtraMissing


@contextmanager
def extra_needed(command: str, extra: str, modules: tuple[str, ...]) -> Iterator[None]:
    """Around the import of an extra's code: a missing module of ``modules`` (the extra's
    and what it pulls in) becomes ``ExtraMissing`` naming the extra (exit 12); any other
    missing module is a bug of ours and goes on as it is."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in modules:
            raise
        raise ExtraMissing(
            f"objmanifest {command} needs the optional extra objmanifest[{extra}] (module "
            f"{e.name!r} is missing): {install_hint(extra)}"
        ) from None


def load_extra(module: str, extra: str, modules: tuple[str, ...]) -> ModuleType:
    """``module``, imported only when the command named as its extra asks for it: the
    extra is optional, and no other command should pay for importing it (``extra_needed``
    names the extra if ``modules`` are missing)."""
    with extra_needed(extra, extra, modules):
        return importlib.import_module(module)


def checkout() -> Path | None:
    """The source checkout this objmanifest runs from (an editable install), if it is one:
    the directory whose ``pyproject.toml`` names the project and holds the package."""
    root = Path(__file__).resolve().parent.parent.parent
    project = root / "pyproject.toml"
    try:
        text = project.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "objmanifest"' in text else None


def install_hint(extra: str) -> str:
    """How to install ``extra`` into the Python that runs this (nothing is published to a
    package index, so from the checkout it came from)."""
    python = sys.executable
    found = checkout()
    if found is not None:
        return (
            f"install it into this Python from the checkout it runs from: "
            f"{shlex.quote(python)} -m pip install -e {shlex.quote(f'{found}[{extra}]')}"
        )
    return (
        f"install objmanifest[{extra}] into this Python from where objmanifest came from "
        f"(for a checkout: {shlex.quote(python)} -m pip install -e 'CHECKOUT[{extra}]')"
    )
