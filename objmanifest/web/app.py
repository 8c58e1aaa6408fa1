"""The ASGI app of the status page (Starlette): pages, the JSON API under ``/api``, the
page's static files, and the gate every request passes first.

Routes (all GET or HEAD; anything else is refused with 405, the page is read-only):

=========================================  ===============================================
``/``                                      the board of the task the server was started
                                           on, else the list of tasks
``/tasks/{task}``                          a task's board
``/tasks/{task}/stages/{stage}``           a stage's entries (``?state=&agent=``)
``/tasks/{task}/entries/{file_id}``        an entry: fields, history, lineage graph
``/api``                                   the server: version, store, task, interval
``/api/tasks``                             the tasks under the URL, with their totals
``/api/tasks/{task}``                      the board's data
``/api/tasks/{task}/stages/{stage}``       entries (``?state=&agent=&limit=&offset=``)
``/api/tasks/{task}/entries/{file_id}``    an entry, its history, lineage and its layout
``/metrics``                               the served tasks' metrics, Prometheus text
=========================================  ===============================================

Every API answer has an ETag (of everything but ``store_time``) and ``Cache-Control:
no-cache``; a request with a matching ``If-None-Match`` gets a 304 without a body, which is
how the page polls. Errors are JSON: ``{"error": TYPE, "message": ..., "exit_code": N}`` (the
code the command line gives the same error) with 400 (invalid
input), 404 (no such task, stage or entry), 502 (the store failed) or 500.

``create_app(site, token=..., routes=[...])`` takes extra routes, which sit behind the same
gate (``/metrics`` too). The server commits nothing, so on ``/metrics`` its commit counters
stay at zero: the entries per stage and state, and the attention gauges, are what it shows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlencode

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import objmanifest as om

from ..wire.shapes import api_error_json
from . import pages
from .security import COOKIE, LOOPBACK_NAMES, cookie_value, host_name, same
from .views import Site, View

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-resource-policy": "same-origin",
}

NO_STORE = {"cache-control": "no-store"}

AUTH_HELP = (
    "this server needs its token: open any page once with ?token=TOKEN (a cookie then "
    "keeps it), or send the header 'Authorization: Bearer TOKEN'"
)


class Gate:
    """Every request, before any route: GET and HEAD only; with a token, the token (a
    bearer header, the cookie, or ``?token=`` once, which sets the cookie and redirects to
    the same URL without it); without one, a ``Host`` that names ``hosts`` only. Adds the
    security headers to every answer."""

    def __init__(self, app: ASGIApp, token: str | None, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_value(token) if token else None
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        refusal = self._refusal(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)

    def _refusal(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse(
                "objmanifest web is read-only: GET and HEAD only\n",
                status_code=405,
                headers={"allow": "GET, HEAD"},
            )
        if self.token is None:
            host = host_name(request.headers.get("host"))
            if self.hosts is not None and host not in self.hosts:
                return PlainTextResponse(
                    "objmanifest web answers only requests to a loopback name (localhost, "
                    "127.0.0.1, [::1]); to serve another name, start it with a token\n",
                    status_code=421,
                )
            return None
        given = request.query_params.get("token")
        if given is not None:
            if not same(given, self.token):
                return _unauthorized()
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            raw = request.scope.get("raw_path") or request.url.path.encode()
            path = "/" + bytes(raw).split(b"?", 1)[0].decode("latin-1").lstrip("/")
            target = path + (f"?{urlencode(rest)}" if rest else "")  # never //elsewhere
            response = Response(status_code=303, headers={"location": target})
            assert self.cookie is not None
            response.set_cookie(COOKIE, self.cookie, httponly=True, samesite="strict", path="/")
            return response
        auth = request.headers.get("authorization", "")
        scheme, _, credential = auth.partition(" ")
        if scheme.lower() == "bearer" and same(credential.strip(), self.token):
            return None
        if self.cookie is not None and same(request.cookies.get(COOKIE), self.cookie):
            return None
        return _unauthorized()


def _unauthorized() -> Response:
    return PlainTextResponse(
        f"objmanifest web: {AUTH_HELP}\n",
        status_code=401,
        headers={"www-authenticate": 'Bearer realm="objmanifest"'},
    )


def error_status(error: BaseException) -> int:
    if isinstance(error, om.NotFound):
        return 404
    if isinstance(error, om.InvalidInput):
        return 400
    if isinstance(error, om.StoreError):
        return 502
    return 500


def _json(request: Request, view: View) -> Response:
    headers = {"etag": view.etag, "cache-control": "no-cache, private", "vary": "cookie"}
    if request.headers.get("if-none-match") == view.etag:
        return Response(status_code=304, headers=headers)
    return JSONResponse(view.body, headers=headers)


def _int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise om.InvalidInput(f"{name} must be a whole number, not {value!r}") from None


def file_id_of(request: Request) -> str:
    """The file id at the end of ``.../entries/FILE_ID``, decoded once from the raw path
    (so an id with ``%`` in it is never decoded twice, whatever the server does), each
    segment as UTF-8."""
    raw = request.scope.get("raw_path")
    if not raw:
        return str(request.path_params["file_id"])
    parts = bytes(raw).split(b"?", 1)[0].decode("latin-1").split("/")
    tail = parts[parts.index("tasks") + 3 :]  # [/api]/tasks/TASK/entries/...
    try:
        return "/".join(unquote(part, errors="strict") for part in tail)
    except UnicodeDecodeError:
        raise om.InvalidInput("the file id in the URL is not UTF-8") from None


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value else None


Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    site: Site,
    *,
    token: str | None = None,
    hosts: Sequence[str] | None = None,
    routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The app serving ``site``. ``token``: required on every request (see ``Gate``);
    without one, only requests whose ``Host`` is a loopback name (or one of ``hosts``) are
    answered. ``routes`` are added behind the same gate."""
    static = pages.static_files()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(site.metrics())
    version = pages.asset_version(static)
    where = site.store.url

    def shell(request: Request, view: str, title: str, api: str, **kw: Any) -> Response:
        page = pages.shell(
            view=view,
            title=title,
            api=api,
            where=where,
            interval=site.interval,
            version=version,
            **kw,
        )
        return HTMLResponse(page, headers={"cache-control": "no-cache, private"})

    def board_page(request: Request, task_id: str) -> Response:
        task = site.task(task_id)  # a task that does not exist: 404 now, not in the script
        crumbs: list[tuple[str, str | None]] = [(task.task_id, None)]
        if site.task_id is None:
            crumbs.insert(0, ("tasks", "/"))
        return shell(
            request,
            "board",
            task.task_id,
            f"/api/tasks/{pages.segment(task_id)}",
            crumbs=crumbs,
            data={"task": task.task_id},
        )

    def part_of_task(
        request: Request, task_id: str, view: str, part: tuple[str, str], api: str
    ) -> Response:
        """The page of a stage or an entry of the task (``part``: its kind and name), its
        API ``api`` under the task's."""
        kind, name = part
        return shell(
            request,
            view,
            f"{name} · {task_id}",
            f"/api/tasks/{pages.segment(task_id)}/{api}",
            crumbs=[*_task_crumbs(site, task_id), (name, None)],
            data={"task": task_id, kind: name},
        )

    def root(request: Request) -> Response:
        if site.task_id is not None:
            return board_page(request, site.task_id)
        return shell(request, "tasks", "tasks", "/api/tasks", crumbs=[("tasks", None)])

    def board(request: Request) -> Response:
        return board_page(request, request.path_params["task_id"])

    def stage(request: Request) -> Response:
        task_id, stage = request.path_params["task_id"], request.path_params["stage"]
        site.task(task_id).shard_names(stage)  # NotFound for a stage the task lacks
        return part_of_task(
            request, task_id, "entries", ("stage", stage), f"stages/{pages.segment(stage)}"
        )

    def entry(request: Request) -> Response:
        task_id, file_id = request.path_params["task_id"], file_id_of(request)
        site.task(task_id)
        return part_of_task(
            request, task_id, "entry", ("file", file_id), f"entries/{pages.file_path(file_id)}"
        )

    def api_info(request: Request) -> Response:
        return JSONResponse(site.info(), headers={"cache-control": "no-cache, private"})

    def api_tasks(request: Request) -> Response:
        return _json(request, site.tasks())

    def api_board(request: Request) -> Response:
        return _json(request, site.board(request.path_params["task_id"]))

    def api_stage(request: Request) -> Response:
        view = site.entries(
            request.path_params["task_id"],
            request.path_params["stage"],
            state=_text(request, "state"),
            agent=_text(request, "agent"),
            limit=_int(request, "limit", 200),
            offset=_int(request, "offset", 0),
        )
        return _json(request, view)

    def api_entry(request: Request) -> Response:
        return _json(request, site.entry(request.path_params["task_id"], file_id_of(request)))

    def metrics(request: Request) -> Response:
        try:
            body = generate_latest(registry)
        except om.ObjManifestError as e:
            return PlainTextResponse(
                f"objmanifest web: {e}\n", status_code=error_status(e), headers=NO_STORE
            )
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers=NO_STORE)

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return PlainTextResponse("not found\n", status_code=404)
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return Response(
            static[name],
            media_type=f"{kind}; charset=utf-8",
            headers={"cache-control": "public, max-age=86400"},
        )

    def page_errors(endpoint: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """Errors of a page as a page; of the API, as JSON."""

        def wrapped(request: Request) -> Response:
            try:
                return endpoint(request)
            except Exception as e:
                if not isinstance(e, om.ObjManifestError):
                    log.exception("objmanifest web: %s failed", request.url.path)
                status = error_status(e)
                if request.url.path.startswith("/api"):
                    return JSONResponse(
                        api_error_json(e), status_code=status, headers={"cache-control": "no-store"}
                    )
                title = {404: "not found", 400: "invalid request", 502: "store error"}
                return HTMLResponse(
                    pages.message(
                        title.get(status, "error"), api_error_json(e)["message"], version
                    ),
                    status_code=status,
                )

        return wrapped

    def route(path: str, endpoint: Callable[[Request], Response]) -> Route:
        return Route(path, page_errors(endpoint), methods=["GET", "HEAD"])

    table = [
        route("/", root),
        route("/tasks/{task_id}", board),
        route("/tasks/{task_id}/stages/{stage}", stage),
        route("/tasks/{task_id}/entries/{file_id:path}", entry),
        route("/api", api_info),
        route("/api/tasks", api_tasks),
        route("/api/tasks/{task_id}", api_board),
        route("/api/tasks/{task_id}/stages/{stage}", api_stage),
        route("/api/tasks/{task_id}/entries/{file_id:path}", api_entry),
        Route("/metrics", metrics, methods=["GET", "HEAD"]),
        route("/static/{name}", asset),
        route("/favicon.ico", lambda request: Response(status_code=204)),
        *routes,
    ]
    app = Starlette(routes=table)
    allowed = None if token else frozenset({*LOOPBACK_NAMES, *(h.lower() for h in hosts or ())})
    app.add_middleware(Gate, token=token, hosts=allowed)
    return app


def _task_crumbs(site: Site, task_id: str) -> list[tuple[str, str | None]]:
    crumbs: list[tuple[str, str | None]] = [(task_id, pages.board_url(task_id))]
    if site.task_id is None:
        crumbs.insert(0, ("tasks", "/"))
    return crumbs


__all__ = ["Gate", "create_app", "error_status"]
