"""The MCP server's stdin, read within the bounds every face reads input under
(``wire.inputs``: ``MAX_INPUT_BYTES`` a line, ``MAX_NESTING`` deep).

The SDK's stdio transport reads a line whole, however long, and drops one it cannot parse
without a word, so its client waits for ever. Here a thread reads the real stdin line by
line, keeping at most ``MAX_INPUT_BYTES`` of a line (the rest is read and dropped), and
hands the SDK a pipe in its place: a line within the bounds goes through as it came; one
past them is replaced by a request of ``REFUSED`` with the same id (found by a scan of its
top level, which never recurses), which ``Refuse``, a middleware of the server, answers
with a JSON-RPC error saying what was wrong. A line whose id cannot be found is only said
on stderr: without an id there is nothing to answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST

from ..wire.inputs import MAX_INPUT_BYTES, MAX_NESTING, TOKENS, nesting, too_deep

REFUSED = "objmanifest/refused"
"""The method a refused line is replaced by (no client sends it)."""

HEAD = 64 * 1024
"""How much of an oversized line is kept to find its id in."""

CHUNK = 64 * 1024

_ID_VALUE = re.compile(rb'\s*:\s*(-?\d{1,30}|"[^"\\]{0,256}")')
"""A JSON-RPC id after its key: a whole number or a plain string."""


def request_id(data: bytes) -> int | str | None:
    """The ``id`` member of the JSON object ``data`` begins (a prefix will do), or None;
    found among its top-level members only, without parsing what they hold."""
    depth = 0
    for token in TOKENS.finditer(data):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
        elif text in (b"]", b"}"):
            depth -= 1
        elif depth == 1 and text == b'"id"':
            value = _ID_VALUE.match(data, token.end())
            if value is not None:
                found: int | str = json.loads(value.group(1))
                return found
    return None


def problem(line: bytes) -> str | None:
    """Why ``line`` (whole, within ``MAX_INPUT_BYTES``) is refused, or None."""
    if nesting(line) > MAX_NESTING:
        return f"{too_deep('the request')}: no objmanifest tool takes arguments nested that deep"
    return None


def oversized() -> str:
    return (
        f"the request is longer than {MAX_INPUT_BYTES // (1024 * 1024)} MiB, the most read "
        "at once: give large data as a file (path=), not inline"
    )


def replacement(head: bytes, why: str) -> bytes | None:
    """The line the SDK is given in place of a refused one: a request of ``REFUSED`` with
    its id; None (nothing to answer) if it has none."""
    rid = request_id(head)
    if rid is None:
        return None
    message = {"jsonrpc": "2.0", "id": rid, "method": REFUSED, "params": {"reason": why}}
    return json.dumps(message).encode() + b"\n"


def lines_of(read: Any) -> Iterator[tuple[bytes, bool]]:
    """Each line of what ``read(n)`` returns until it returns b"": (the line, or the first
    ``HEAD`` bytes of one longer than ``MAX_INPUT_BYTES``, and whether it was that long)."""
    buf = bytearray()
    head: bytes | None = None  # set once the line is too long: all that is kept of it

    def keep(piece: bytes) -> None:
        nonlocal head
        if head is not None:
            return
        if len(buf) + len(piece) <= MAX_INPUT_BYTES:
            buf.extend(piece)
            return
        head = (bytes(buf[:HEAD]) + piece[: max(0, HEAD - len(buf))])[:HEAD]
        buf.clear()

    while True:
        chunk = read(CHUNK)
        if not chunk:
            if head is not None or buf:
                yield (head, True) if head is not None else (bytes(buf), False)
            return
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            keep(chunk[start:end])
            yield (head, True) if head is not None else (bytes(buf), False)
            buf.clear()
            head = None
            start = end + 1
        keep(chunk[start:])


def pump(source: int, sink: int) -> None:
    """Copy ``source`` to ``sink`` a line at a time within the bounds (see the module)."""
    try:
        for line, too_long in lines_of(lambda n: os.read(source, n)):
            why = oversized() if too_long else problem(line)
            out = line + b"\n" if why is None else replacement(line[:HEAD], why)
            if out is None:
                sys.stderr.write(f"objmanifest mcp: a message without an id refused: {why}\n")
                continue
            while out:  # a pipe: blocks while the server is behind
                out = out[os.write(sink, out) :]
    except OSError:
        pass  # the server went away
    finally:
        with contextlib.suppress(OSError):
            os.close(sink)


@contextlib.contextmanager
def bounded_stdin() -> Iterator[None]:
    """While inside: file descriptor 0 is a pipe fed by ``pump`` from the real stdin."""
    real = os.dup(0)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)
    thread = threading.Thread(target=pump, args=(real, write_end), name="mcp-stdin", daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.dup2(real, 0)
        os.close(real)


class Refuse:
    """Middleware: a ``REFUSED`` request is answered with its reason as a JSON-RPC
    error (invalid request), before anything else sees it."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == REFUSED:
            params = ctx.params or {}
            raise MCPError(INVALID_REQUEST, str(params.get("reason", "refused")))
        return await call_next(ctx)


__all__ = ["REFUSED", "Refuse", "bounded_stdin", "lines_of", "request_id"]
