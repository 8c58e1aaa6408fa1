"""``objmanifest mcp``: the task as Model Context Protocol tools for an LLM agent
(``objmanifest.mcp``), on stdio until the client closes it, or on streamable HTTP on
loopback until Ctrl-C or SIGTERM. Its SDK is the optional extra ``objmanifest[mcp]``:
without it the command says which extra to install (exit 12)."""

from __future__ import annotations

from objmanifest.mcp import tools  # the module: it imports cli's modules in turn

from ..local.errors import Stopped
from .context import Context
from .extras import load_extra

EXTRA_MODULES = (
    "mcp",
    "mcp_types",
    "anyio",
    "starlette",
    "uvicorn",
    "httpx",
    "httpx2",
    "sse_starlette",
    "jsonschema",
    "jwt",
    "multipart",
    "opentelemetry",
    "typing_inspection",
)
"""Modules of the ``mcp`` extra (and of what it pulls in)."""


def cmd_mcp(ctx: Context) -> int:
    args = ctx.args
    if args.http is None:
        ctx.out.data_on_stdout()  # stdout carries the protocol: errors go to stderr
    root = tools.check_root(args.root)  # InvalidInput: exit 2, before any request
    server = load_extra("objmanifest.mcp.server", "mcp", EXTRA_MODULES)
    agent = ctx.agent()  # the task must exist: exit 8 now, not a tool error later
    session = tools.Session(ctx.task(), agent, root, args.max_hold)
    mcp = server.build(session)
    where = f"task {ctx.task_id()} as agent {agent.name} (root {root}, hold {args.max_hold:g}s)"
    try:
        if args.http is None:
            ctx.out.stderr.write(f"objmanifest mcp: {where} on stdio\n")
            ctx.out.stderr.flush()
            server.serve_stdio(mcp)
        else:
            sock = server.listen(args.http)
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
            ctx.out.result(
                {"url": url, "task": ctx.task_id(), "agent": agent.name, "root": str(root)},
                f"objmanifest mcp: {where} at {url}; Ctrl-C stops it",
            )
            try:
                server.serve_http(mcp, sock)
            finally:
                sock.close()
    except (KeyboardInterrupt, Stopped):
        pass  # Ctrl-C or SIGTERM: how a server is stopped
    finally:
        released = session.close()
        if released:
            ctx.out.stderr.write(
                f"objmanifest mcp: released {len(released)} claim(s) still held: "
                f"{', '.join(released)}\n"
            )
    return 0
