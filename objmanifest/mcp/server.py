"""The MCP server: a ``tools.Session``'s calls as tools of the ``mcp`` SDK's ``MCPServer``,
on stdio or streamable HTTP on loopback. The only module that imports the SDK.

Tools are plain functions: the SDK runs each call in a worker thread, so a store request
never blocks its event loop. Each returns a ``CallToolResult`` built here, the result (or
the error, ``isError``) as JSON text and as structured content.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from objmanifest import __version__

from .stdio import Refuse, bounded_stdin
from .tools import MAX_INLINE, MAX_LOG, MAX_WAIT, Reply, Session

INSTRUCTIONS = """\
objmanifest hands files between agents through one S3 bucket. A task has stages; each
file (an entry, named by its file id) belongs to one stage and moves pending -> writing
(claimed by one agent, under a lease) -> ready (its data stored) -> consumed.

To produce: claim a file (by file_id, or any of a stage), put its data (path= a file
under this server's root, or text= up to 1 MiB of UTF-8), or fail/release it if you
cannot. The server keeps your claims and renews their leases while you work, for at most
its hold time; then it releases the claim and tells you. To use another agent's output:
consume it (path= to write it under the root, or inline text). status shows the task.

Every error is a result with "error" (its name), "message" (what happened, naming the
object) and "next_step" (what to do); "notices" tell you of claims released or lost.
"""

FileId = Annotated[
    str, Field(description="The file id of the entry, as declared (like 'raw/a.json')")
]
OptionalFileId = Annotated[
    str | None, Field(description="The file id of one entry; omit to take any of `stage`")
]
Stage = Annotated[str | None, Field(description="A stage of the task (see status)")]
Wait = Annotated[
    float,
    Field(
        description=f"Seconds to keep trying while there is nothing yet (0 to {MAX_WAIT:g})",
        ge=0,
        le=MAX_WAIT,
    ),
]
LocalPath = Annotated[
    str | None,
    Field(
        description="A file path relative to the server's root directory (absolute paths "
        "must be inside it; '..' and symlinks leading out are refused)"
    ),
]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def result(reply: Reply) -> CallToolResult:
    """A session's reply as the SDK's result: JSON text, structured content, ``isError``."""
    text = json.dumps(reply.data, ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=reply.data,
        is_error=reply.error,
    )


def build(session: Session) -> MCPServer[Any]:
    """The MCP server with one tool per call of ``session``."""
    server: MCPServer[Any] = MCPServer(
        "objmanifest",
        title="objmanifest",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
    )
    server.middleware.append(Refuse())

    def call(op: Callable[[], dict[str, Any]]) -> CallToolResult:
        return result(session.run(op))

    @server.tool(annotations=READ)
    def status() -> CallToolResult:
        """The task at a glance: its stages, how many entries of each are in each state,
        entries that need attention (stuck, late, dead), and the claims you hold (with the
        seconds left of each hold). Call it first, and whenever you wonder what to do."""
        return call(session.status)

    @server.tool(annotations=READ)
    def show(file_id: FileId) -> CallToolResult:
        """Every field of one entry: stage, state, holder and epoch, lease, size, checksum,
        dependencies, consumers, retries, last error. Errors: NotFound (not declared: check
        the id, or declare it), InvalidFileId (not a valid file id)."""
        return call(lambda: session.show(file_id))

    @server.tool(annotations=WRITE)
    def declare(
        file_id: FileId,
        stage: Annotated[str, Field(description="The stage that produces the file")],
        depends_on: Annotated[
            list[str] | None,
            Field(description="File ids that must be ready before this one can be claimed"),
        ] = None,
        consumers: Annotated[
            list[str] | None,
            Field(
                description="Roles that must each consume it; omit for a queue entry that "
                "any one agent consumes"
            ),
        ] = None,
    ) -> CallToolResult:
        """Declare a file the task will produce, so that an agent can claim it. Declaring
        the same file again is a no-op. Errors: NotFound (no such stage, or an unknown
        dependency), DeclarationConflict (declared before with other settings)."""
        return call(lambda: session.declare(file_id, stage, depends_on, consumers))

    @server.tool(annotations=WRITE)
    def claim(
        file_id: OptionalFileId = None, stage: Stage = None, wait: Wait = 0.0
    ) -> CallToolResult:
        """Claim a file to produce it: by file_id, or any claimable file of stage. You then
        hold it alone; the server renews its lease while you work, up to its hold time
        (hold_seconds), after which it is released and you are told. Next: put its data,
        or fail/release it. Errors: NotClaimable / NothingClaimable (taken, done, or
        waiting for its dependencies: claim another, or later with wait), NotFound."""
        return call(lambda: session.claim(file_id, stage, wait))

    @server.tool(annotations=WRITE)
    def put(
        file_id: FileId,
        path: LocalPath = None,
        text: Annotated[
            str | None,
            Field(description=f"The data itself, as text (at most {MAX_INLINE} bytes UTF-8)"),
        ] = None,
    ) -> CallToolResult:
        """Store the data of a file you claimed and make it ready for its consumers: give
        path (a file under the server's root) or text, not both. Binary or large data:
        write it to a file and give path. Errors: LeaseLost (you no longer hold it: stop,
        claim another), InvalidInput (no claim held here, path outside the root, text too
        large). After another error you still hold the claim: try again, or fail it."""
        return call(lambda: session.put(file_id, path, text))

    @server.tool(annotations=WRITE)
    def renew(file_id: FileId) -> CallToolResult:
        """Move the lease of a claim you hold forward now. Rarely needed: the server renews
        held claims in the background. It does not extend the hold time. Errors: LeaseLost
        (you no longer hold it: stop working on it)."""
        return call(lambda: session.renew(file_id))

    @server.tool(annotations=WRITE)
    def fail(
        file_id: FileId,
        reason: Annotated[str, Field(description="Why it could not be produced, for a human")],
    ) -> CallToolResult:
        """Give up a claim because producing the file failed: it spends one of its retries
        and becomes claimable again (or dead once its retries are spent). To hand it back
        without counting a failure, use release. Errors: LeaseLost."""
        return call(lambda: session.fail(file_id, reason))

    @server.tool(annotations=WRITE)
    def release(file_id: FileId) -> CallToolResult:
        """Hand a claim back without spending a retry (you will not do the work, or not
        now): the file is pending again for any agent. Errors: LeaseLost."""
        return call(lambda: session.release(file_id))

    @server.tool(annotations=WRITE)
    def consume(file_id: FileId, path: LocalPath = None, wait: Wait = 0.0) -> CallToolResult:
        """Get a ready file's data, verified by its checksum, and mark it consumed: with
        path, written to that file under the server's root; without, returned as text (at
        most 1 MiB of UTF-8; larger or binary data is refused: give path). Consuming again
        gives the data again. Errors: NotReady (not produced yet: later, or with wait),
        NotAConsumer (meant for other roles), ChecksumMismatch (damaged: sent back to be
        produced again), AlreadyConsumed (by another agent, for a queue entry)."""
        return call(lambda: session.consume(file_id, path, wait))

    @server.tool(annotations=READ)
    def log(
        file_id: Annotated[
            str | None, Field(description="One entry's history; omit for the whole task's")
        ] = None,
        limit: Annotated[
            int, Field(description="How many of the newest records", ge=1, le=MAX_LOG)
        ] = 100,
    ) -> CallToolResult:
        """The task's journal (every change: command, agent, store time, what it did to
        each entry), or one entry's transitions across claims and takeovers, oldest first.
        For finding out what happened to a file, or who made it."""
        return call(lambda: session.log(file_id, limit))

    @server.tool(annotations=READ)
    def lineage(file_id: FileId) -> CallToolResult:
        """The files a file was made from (through its dependencies, transitively), each
        with its producer, epoch, checksum and size. Errors: NotFound."""
        return call(lambda: session.lineage(file_id))

    return server


def serve_stdio(server: MCPServer[Any]) -> None:
    """Serve on stdin/stdout until the client closes stdin; a line of stdin past the
    bounds of ``wire.inputs`` is answered with a JSON-RPC error (``stdio``)."""
    with bounded_stdin():
        server.run("stdio")


def listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: any free port); ``OSError`` if taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on 127.0.0.1:{port}: {e.strerror}") from None
    return sock


def serve_http(server: MCPServer[Any], sock: socket.socket) -> None:
    """Serve streamable HTTP at ``/mcp`` on ``sock`` (loopback) until a signal stops it;
    the SDK checks the Host header against loopback names (DNS rebinding)."""
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False)
    anyio.run(uvicorn.Server(config).serve, [sock])


__all__ = ["build", "listen", "result", "serve_http", "serve_stdio"]
