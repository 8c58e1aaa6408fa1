"""The web status page (``objmanifest web``): read-only, live views of the tasks of a store.

* ``views.py``: what each view shows, as JSON-able data read through the public API
  (``Site``: one ``Task`` per task id, opened once and reused, so an idle page costs the
  store conditional GETs answered 304); no web framework needed.
* ``graph.py``: the layered layout of a lineage graph.
* ``security.py``: the token, the cookie derived from it, loopback hosts, what may be shown
  of an endpoint.
* ``app.py``: the ASGI app (Starlette, the ``web`` extra): the pages, the JSON API under
  ``/api``, the token gate; ``server.py`` runs it with uvicorn.

Nothing here imports Starlette or uvicorn but ``app.py`` and ``server.py``, so the rest
works (and is tested) without the extra. The page never changes anything in the store,
never shows a credential, and never answers a request without the token once one is set.
"""
