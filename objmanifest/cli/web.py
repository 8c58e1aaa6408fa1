"""``objmanifest web``: the live, read-only status page (``objmanifest.web``), served until
Ctrl-C or SIGTERM. Its framework is the optional extra ``objmanifest[web]``: without it the
command says which extra to install (exit 12)."""

from __future__ import annotations

from objmanifest.web.security import check_binding

from ..local.errors import Stopped
from ..web.views import Site
from .context import Context
from .extras import load_extra

EXTRA_MODULES = ("starlette", "uvicorn", "anyio", "h11", "click")
"""Modules of the ``web`` extra (and of what it pulls in)."""


def cmd_web(ctx: Context) -> int:
    args = ctx.args
    token = check_binding(args.host, args.token or None)  # InvalidInput: exit 2
    server = load_extra("objmanifest.web.server", "web", EXTRA_MODULES)
    store = ctx.store()
    task_id = ctx.opt("task") or None
    site = Site(store, task_id, interval=args.interval, policy=ctx.policy())
    if task_id is not None:
        site.task(task_id)  # a task that does not exist: exit 8 now, not a page that says so
    sock = server.listen(args.host, args.port)

    def ready(url: str) -> None:
        shows = f"task {task_id}" if task_id else f"the tasks under {store.url}"
        guarded = ", token required" if token else ""
        ctx.out.result(
            {"url": url, "task": task_id, "store": store.url, "token_required": bool(token)},
            f"objmanifest web: {shows} at {url} (read-only{guarded}); Ctrl-C stops it",
        )

    try:
        server.serve(site, sock, token=token, on_ready=ready)
    except (KeyboardInterrupt, Stopped):
        pass  # Ctrl-C or SIGTERM: how it is stopped (uvicorn re-raises the signal it caught)
    finally:
        sock.close()
    return 0
