"""The HTML of each page: a shell that names the view and its JSON API, which the page's
script (``static/app.js``) polls and draws with DOM calls that set text, never markup.

Everything the shell itself says that a user chose (task ids, stage names, file ids, the
store's URL) goes through ``html.escape``, and URLs through ``quote``; the page's Content
Security Policy runs no script but ``/static/app.js``, so markup that slipped through
anyway would stay inert.
"""

from __future__ import annotations

import hashlib
from html import escape
from importlib import resources
from urllib.parse import quote

STATIC = ("app.js", "style.css")


def static_files() -> dict[str, bytes]:
    """The page's script and style sheet, from the package."""
    folder = resources.files(__package__).joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in STATIC}


def asset_version(files: dict[str, bytes]) -> str:
    """A digest of the static files, so a new release is never served from a stale cache."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(files[name])
    return digest.hexdigest()[:12]


def segment(value: str) -> str:
    """One path segment of a URL (a task id, a stage name)."""
    return quote(value, safe="")


def file_path(file_id: str) -> str:
    """A file id in a URL path: each of its segments quoted, joined by ``/``."""
    return "/".join(quote(part, safe="") for part in file_id.split("/"))


def board_url(task_id: str) -> str:
    return f"/tasks/{segment(task_id)}"


def stage_url(task_id: str, stage: str) -> str:
    return f"/tasks/{segment(task_id)}/stages/{segment(stage)}"


def entry_url(task_id: str, file_id: str) -> str:
    return f"/tasks/{segment(task_id)}/entries/{file_path(file_id)}"


def shell(
    *,
    view: str,
    title: str,
    api: str,
    crumbs: list[tuple[str, str | None]],
    where: str,
    interval: float,
    version: str,
    data: dict[str, str] | None = None,
) -> str:
    """The page of ``view`` (``tasks``, ``board``, ``entries``, ``entry``): its title, the
    breadcrumbs (text, link or None), the store it shows, and what its script needs."""
    attrs = {"view": view, "api": api, "interval": f"{interval:g}", **(data or {})}
    body_attrs = " ".join(f'data-{k}="{escape(v, quote=True)}"' for k, v in attrs.items())
    nav = " <span class=sep>/</span> ".join(
        f'<a href="{escape(link, quote=True)}">{escape(text)}</a>'
        if link is not None
        else f"<span>{escape(text)}</span>"
        for text, link in crumbs
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{escape(title)} · objmanifest</title>
<link rel="stylesheet" href="/static/style.css?v={version}">
<script src="/static/app.js?v={version}" defer></script>
</head>
<body {body_attrs}>
<header>
<nav><a class="brand" href="/">objmanifest</a> <span class=sep>/</span> {nav}</nav>
<span class="where" title="the store this page reads">{escape(where)}</span>
<span id="live" class="live" aria-live="polite">connecting</span>
</header>
<main id="main">
<noscript><p>This page draws itself with JavaScript. The same data is at
<a href="{escape(api, quote=True)}">{escape(api)}</a> (JSON).</p></noscript>
<p class="loading">loading…</p>
</main>
</body>
</html>
"""


def message(title: str, text: str, version: str) -> str:
    """A page that only says something (a task that does not exist, a missing token)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)} · objmanifest</title>
<link rel="stylesheet" href="/static/style.css?v={version}">
</head>
<body>
<header><nav><a class="brand" href="/">objmanifest</a></nav></header>
<main><h1>{escape(title)}</h1><p class="error">{escape(text)}</p></main>
</body>
</html>
"""


__all__ = [
    "board_url",
    "entry_url",
    "file_path",
    "message",
    "segment",
    "shell",
    "stage_url",
    "static_files",
]
