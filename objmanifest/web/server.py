"""Running the status page: uvicorn on a socket bound here, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import uvicorn
from starlette.routing import BaseRoute

from .app import create_app
from .views import Site


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: any free port); ``OSError`` if taken."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def make_server(
    site: Site,
    sock: socket.socket,
    *,
    token: str | None,
    routes: Sequence[BaseRoute] = (),
) -> uvicorn.Server:
    """A uvicorn server of ``site`` for ``sock`` (``run(sockets=[sock])`` serves it; setting
    ``should_exit`` stops it)."""
    host = sock.getsockname()[0]
    app = create_app(site, token=token, hosts=[host], routes=routes)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)


def serve(
    site: Site,
    sock: socket.socket,
    *,
    token: str | None,
    on_ready: Callable[[str], None],
    routes: Sequence[BaseRoute] = (),
) -> None:
    """Serve ``site`` on ``sock`` until a signal stops it; ``on_ready(url)`` once it
    listens."""
    server = make_server(site, sock, token=token, routes=routes)
    on_ready(url_of(sock))
    server.run(sockets=[sock])


__all__ = ["listen", "make_server", "serve", "url_of"]
