"""The requests sessions of the backends whose SDKs speak through requests (GCS, Azure).

requests reads the environment on every request when a session trusts it: the proxy for the
URL (``HTTPS_PROXY``, ``NO_PROXY`` ...), the CA bundle (``REQUESTS_CA_BUNDLE``,
``CURL_CA_BUNDLE``) and ``.netrc``, a scan that costs a fraction of a millisecond each time.
A store's session reads the proxy and the CA bundle once, when it is made, and never
``.netrc`` (the SDKs sign their requests themselves).
"""

from __future__ import annotations

import os

import requests
import requests.adapters
import requests.utils


def ca_bundle() -> str | bool:
    """The CA bundle the environment names (as requests reads it), else True: the system's."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True


def pinned_session(
    session: requests.Session, url: str, adapter: requests.adapters.HTTPAdapter
) -> requests.Session:
    """``session`` for requests to ``url`` through ``adapter`` (its pool), with the proxy
    and CA bundle the environment names now, and no further look at the environment."""
    session.trust_env = False
    session.proxies.update(requests.utils.get_environ_proxies(url))
    session.verify = ca_bundle()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
