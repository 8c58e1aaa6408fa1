"""Progress bars for transfers.

Bars go to stderr and only when it is a terminal: a pipeline, a CI log or an agent reading
the output sees nothing extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

ProgressFn = Callable[[int, "int | None"], None]


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
