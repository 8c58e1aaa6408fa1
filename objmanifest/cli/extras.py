"""The optional extras a command needs (``objmanifest[web]``, ``objmanifest[mcp]``):
imported only by that command, and named, with how to install it, when missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from objmanifest.errors import ExtraMissing


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
            f"objmanifest {command} needs the optional extra {extra!r} (module {e.name!r} "
            f"is missing): install it with pip install 'objmanifest[{extra}]'"
        ) from None
