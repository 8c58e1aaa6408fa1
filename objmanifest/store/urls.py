"""Store URLs: which backend a URL names, and the rules of its bucket, container or root.

``s3://BUCKET/PREFIX`` (AWS S3 or any S3-compatible store), ``az://CONTAINER/PREFIX``
(Azure Blob Storage), ``gs://BUCKET/PREFIX`` (Google Cloud Storage), ``file:///ABSOLUTE/DIR``
(a directory, the whole path being the store's root) and ``memory://NAME/PREFIX`` (in one
process). A URL never carries a credential: each backend takes its own from the place its
cloud's tools read them, so a URL can be shown, logged and pasted anywhere.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import ParseResult, unquote, urlparse

from ..errors import InvalidInput

SCHEMES = ("s3", "az", "gs", "file", "memory")

FORMS = "s3://BUCKET[/PREFIX], az://CONTAINER[/PREFIX], gs://BUCKET[/PREFIX] or file:///DIR"
"""The URL forms, as messages name them (``memory://`` is for tests in one process)."""

EXTRAS = {"az": "azure", "gs": "gcs"}
"""The schemes whose backend needs an optional extra, and its name."""

CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile: AWS_PROFILE)",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or Azure's own credential chain (az login, a "
    "managed identity, AZURE_CLIENT_ID ...) with the account's URL in AZURE_STORAGE_ACCOUNT_URL",
    "gs": "application default credentials (gcloud auth application-default login, or "
    "GOOGLE_APPLICATION_CREDENTIALS)",
    "file": "the directory's own permissions",
    "memory": "nothing",
}
"""Where each backend takes its credentials from (never from the URL)."""

_NAMES = {
    "s3": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}"),
        "a bucket name has letters, digits, '.', '-' and '_' only (on AWS: 3-63 lowercase "
        "letters, digits, '.' and '-'), such as s3://my-bucket/jobs",
    ),
    "memory": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}"),
        "a name has letters, digits, '.', '-' and '_' only, such as memory://tests/jobs",
    ),
    "az": (
        re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]"),
        "a container name has 3-63 lowercase letters, digits and single '-' between them, "
        "such as az://pipelines/jobs",
    ),
    "gs": (
        re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
        "a bucket name has 3-222 lowercase letters, digits, '.', '-' and '_', starting and "
        "ending with a letter or digit, such as gs://my-bucket/jobs",
    ),
}
"""The rule each scheme's bucket or container name follows, and how a message says it."""


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL: its scheme, its bucket or container (for ``file``, the root
    directory, an absolute path), and the prefix under it (none for ``file``)."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.bucket}"
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{tail}"


def endpoint_parts(url: str) -> tuple[bool, ParseResult | None]:
    """Whether ``url`` carries user info (before '@' in its authority), and its parts
    (None where it does not parse: a port that is not a number), for a backend to judge
    its endpoint by."""
    authority = url.partition("://")[2].partition("/")[0]
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parsed = None
    return "@" in authority, parsed


_NOT_IN_HOSTS = frozenset('<>"{}|\\^`[]')
"""Characters no host name or address has (besides spaces and control characters)."""


def plain_http(parsed: ParseResult | None, *, path: bool) -> bool:
    """Whether ``parsed`` is ``http(s)://HOST[:PORT]``, with a path where ``path`` allows
    one, and without a query or a fragment."""
    return not (
        parsed is None
        or parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or any(not c.isprintable() or c.isspace() or c in _NOT_IN_HOSTS for c in parsed.hostname)
        or (not path and parsed.path.strip("/"))
        or parsed.query
        or parsed.fragment
    )


def without_credentials(url: str) -> str:
    """``url`` as it may be shown: any user info (``user:password@``), query and fragment
    replaced by ``***``, whatever else is wrong with it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    shown = f"{scheme}{sep}{authority}{slash}{path}"
    for mark in ("?", "#"):
        if mark in shown:
            shown = shown.partition(mark)[0] + mark + "***"
    return shown


def parse(url: object) -> StoreURL:
    """Check ``url`` against its scheme's rules; one line naming the fix otherwise."""
    if not isinstance(url, str):
        raise InvalidInput(f"a store URL is a string such as {FORMS}, not {url!r}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if "@" in url.partition("://")[2].partition("/")[0]:
        where = CREDENTIALS.get(scheme, CREDENTIALS["s3"])
        raise InvalidInput(
            f"invalid {_named(scheme)} in {without_credentials(url)!r}: a store URL names no "
            "credentials, "
            f"and this one has user info (before '@'); use {FORMS}, with the credentials in "
            f"{where}"
        )
    if any(unicodedata.category(c) == "Cc" for c in url):
        raise InvalidInput(f"a store URL has no control characters (a newline, a tab ...): {url!r}")
    try:
        parsed = urlparse(url)
    except ValueError:  # "Invalid IPv6 URL": a '[' in the bucket
        parsed = None
    if parsed is None or parsed.scheme not in SCHEMES:
        raise InvalidInput(f"not a store URL: {url!r}; use {FORMS}")
    if parsed.query or parsed.fragment or parsed.params:
        raise InvalidInput(f"a store URL has no query or fragment: {without_credentials(url)!r}")
    if parsed.scheme == "file":
        return StoreURL("file", _root(url, parsed.netloc, parsed.path), "")
    if not parsed.netloc:
        raise InvalidInput(f"not a store URL: {url!r}; use {FORMS}")
    rule, told = _NAMES[parsed.scheme]
    if not rule.fullmatch(parsed.netloc):
        raise InvalidInput(f"invalid {_named(parsed.scheme)} {parsed.netloc!r} in {url!r}: {told}")
    prefix = parsed.path.removeprefix("/").rstrip("/")  # gs://b//x: an empty first segment
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise InvalidInput(
            f"the prefix of {url!r} has an empty, '.' or '..' segment; use a plain path "
            f"such as {parsed.scheme}://{parsed.netloc}/jobs/nightly"
        )
    return StoreURL(parsed.scheme, parsed.netloc, prefix)


def _named(scheme: str) -> str:
    """What the part after ``://`` is called in ``scheme``'s URLs."""
    return {"az": "container name", "file": "directory"}.get(scheme, "bucket name")


def _root(url: str, host: str, path: str) -> str:
    """The absolute directory of a ``file://`` URL (percent escapes decoded)."""
    if host not in ("", "localhost"):
        raise InvalidInput(
            f"invalid store URL {url!r}: a file:// URL names a directory of this machine "
            "(or a share mounted on it), the whole path being the store's root: use "
            f"file:///ABSOLUTE/DIR, such as file:///mnt/shared/jobs, not a host ({host!r})"
        )
    try:
        root = unquote(path, errors="strict") if "%" in path else path
    except UnicodeDecodeError:
        raise InvalidInput(
            f"the directory of {url!r} is not UTF-8 once its percent escapes are decoded"
        ) from None
    if not root.startswith("/"):
        raise InvalidInput(f"invalid store URL {url!r}: use file:///ABSOLUTE/DIR (three slashes)")
    if "\x00" in root or any(unicodedata.category(c) == "Cc" for c in root):
        raise InvalidInput(f"the directory of {url!r} has a control character")
    trimmed = root.rstrip("/") or "/"
    if trimmed == "/":
        raise InvalidInput(
            f"invalid store URL {url!r}: the root directory itself cannot be a store; name a "
            "directory of its own, such as file:///srv/objmanifest"
        )
    if any(part in ("", ".", "..") for part in trimmed.split("/")[1:]):
        raise InvalidInput(
            f"the directory of {url!r} has an empty, '.' or '..' segment; write the path "
            "plainly, such as file:///srv/objmanifest/jobs"
        )
    return trimmed
