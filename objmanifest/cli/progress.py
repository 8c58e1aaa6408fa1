"""Progress bars for transfers, and passing transfer options only to an API that has them.

Bars go to stderr and only when it is a terminal: a pipeline, a CI log or an agent reading
the output sees nothing extra. ``put`` and ``consume`` take ``progress=`` (and chunking
options) only in versions with chunked transfers, so the signature is checked, not assumed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .exits import UsageError

ProgressFn = Callable[[int, "int | None"], None]


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    param = params.get(name)
    if param is not None:
        return param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    return any(p.kind is p.VAR_KEYWORD for p in params.values())


def transfer_options(
    fn: Callable[..., Any], progress: ProgressFn | None, **chunking: int | None
) -> dict[str, Any]:
    """Keyword arguments for ``fn``: progress when it can report it; chunking options
    (``part_size=``, ``concurrency=``, ``threshold=``) when given, or a clear usage error if
    this version cannot honour them."""
    options: dict[str, Any] = {}
    for name, value in chunking.items():
        if value is None:
            continue
        if not accepts(fn, name):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} needs chunked transfers, which this objmanifest lacks")
        options[name] = value
    if progress is not None and accepts(fn, "progress"):
        options["progress"] = progress
    return options


def wanted(stream: TextIO, disabled: bool) -> bool:
    """Bars only for a human watching a terminal."""
    if disabled:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def bar(enabled: bool, description: str, stream: TextIO) -> Iterator[ProgressFn | None]:
    """A transient rich bar on ``stream``; yields the callback, or None when disabled.

    The bar appears with the first progress report, so a command that waits first (``--wait``)
    can print its note without a live bar in the way.
    """
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    progress = Progress(*columns, console=Console(file=stream), transient=True)
    task = progress.add_task(description, total=None)
    started = False

    def update(done: int, total: int | None) -> None:
        nonlocal started
        if not started:
            started = True
            progress.start()
        progress.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if started:
            progress.stop()
