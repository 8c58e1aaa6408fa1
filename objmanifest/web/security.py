"""Who may look: loopback by default, a token everywhere else, and nothing secret shown.

* Bound to a loopback address without a token, the server answers only requests whose
  ``Host`` is a loopback name (a page elsewhere that points a domain of its own at
  127.0.0.1, DNS rebinding, gets nothing).
* Bound to any other address it needs a token (``--token`` or ``OBJMANIFEST_WEB_TOKEN``),
  checked on every request in constant time: ``Authorization: Bearer TOKEN``, or a cookie
  that opening any page once with ``?token=TOKEN`` sets. The cookie holds a digest of the
  token, never the token, so no response ever carries it.
* Pages show the store's URL (``s3://BUCKET/PREFIX``) and the endpoint's scheme, host and
  port only: no user info, path or query of it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from urllib.parse import urlsplit

from ..errors import InvalidInput

ENV_TOKEN = "OBJMANIFEST_WEB_TOKEN"
COOKIE = "objmanifest_web"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """``host`` (a name or an address to bind to) is on this machine only."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> str | None:
    """The token to require (None: none), refusing a non-loopback host without one and a
    token too short to be one."""
    if token is not None and token != "":
        if len(token) < MIN_TOKEN_CHARS:
            raise InvalidInput(
                f"the web token must have at least {MIN_TOKEN_CHARS} characters; make one "
                "with: python3 -c 'import secrets; print(secrets.token_urlsafe())'"
            )
        if any(c.isspace() or not c.isprintable() for c in token):
            raise InvalidInput("the web token must be printable text without spaces")
        return token
    if not is_loopback(host):
        raise InvalidInput(
            f"--host {host} is not a loopback address, so anyone who can reach it could read "
            f"the tasks: give a token (--token, or better ${ENV_TOKEN}, which `ps` does not "
            "show), or bind to 127.0.0.1"
        )
    return None


def cookie_value(token: str) -> str:
    """What the cookie holds: a digest of the token (the token itself never leaves)."""
    return hmac.new(token.encode(), b"objmanifest web session", hashlib.sha256).hexdigest()


def same(given: str | None, expected: str) -> bool:
    """``given`` equals ``expected``, compared in constant time."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def host_name(header: str | None) -> str | None:
    """The host of a ``Host`` header, without its port (``[::1]:8080`` -> ``::1``)."""
    if not header:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else None
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def shown_endpoint(endpoint_url: str | None) -> str | None:
    """An endpoint as a page may show it: scheme, host and port only."""
    if not endpoint_url:
        return None
    try:
        parts = urlsplit(endpoint_url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


__all__ = [
    "COOKIE",
    "ENV_TOKEN",
    "check_binding",
    "cookie_value",
    "host_name",
    "is_loopback",
    "same",
    "shown_endpoint",
]
