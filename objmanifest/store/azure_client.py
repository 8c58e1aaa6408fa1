"""The ``BlobServiceClient`` of an Azure store: where its credentials come from, its retry
policy and transfer sizes, and how text is shown without the secrets it may carry.

Credentials are Azure's own, never ours: ``AZURE_STORAGE_CONNECTION_STRING`` when it is
set (an account key or a SAS token in it, or ``UseDevelopmentStorage=true`` for Azurite);
otherwise an account URL (``endpoint_url``, else ``AZURE_STORAGE_ACCOUNT_URL``) with
azure-identity's ``DefaultAzureCredential`` (environment, workload or managed identity, the
Azure CLI's login ...). Account keys, SAS tokens and connection strings are never shown:
``redact`` removes them from any text before it reaches an error, a log line or a repr.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import requests
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import HttpTransport, RequestsTransport
from azure.identity import DefaultAzureCredential
from azure.storage.blob import BlobServiceClient, ExponentialRetry
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from ..core.runtime import Runtime
from ..errors import InvalidInput
from .sessions import pinned_session
from .urls import endpoint_parts, plain_http, without_credentials

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_URL = "AZURE_STORAGE_ACCOUNT_URL"

SINGLE_PUT = 5000 * 1024 * 1024
"""The largest body one Put Blob takes (API 2019-12-12 and later): every whole object goes
in one request, its condition and its ``Content-MD5`` with it, never as blocks the SDK
would stage and commit on its own."""

GET_CHUNK = 8 * 1024 * 1024
"""A read asks for at most this many bytes at a time (the first request too), so a stream
holds one chunk in memory, not the SDK's default 32 MiB."""

CONNECTIONS = 32
"""Connections kept open to the account (as many requests at once as are useful)."""

RETRIES = 5
"""Retries of a request refused as busy (503 ServerBusy, 500 OperationTimedOut and other
5xx), timed out (408) or not sent (the connection could not be made)."""

CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
"""An Azure container name: 3-63 lowercase letters, digits and single hyphens between them."""

_SECRET_FIELDS = re.compile(
    r"(?<![A-Za-z0-9_])(AccountKey|SharedAccessSignature|SharedAccessKey|sig|se|sp|sv|skoid|sktid|saoid|"
    r"suoid|sdd|ss|srt|st|spr|sip|sr|skt|ske|sks|skv|sduoid|ses)=[^;&\s'\"]*",
    re.IGNORECASE,
)
"""``name=value`` fields of a connection string or a SAS token, whose values are hidden."""


class AzureRetry(ExponentialRetry):
    """The one retry policy of an Azure store: exponential backoff with jitter on the
    runtime's clock, for answers that say nothing was done (busy, timed out, not sent).

    A PUT whose answer was lost after it was sent is not sent again: it may have been
    applied, and a retry of a conditional write would meet its own write and be refused.
    It is raised at once, and the store reports ``OutcomeUnknown``; a read or a delete is
    retried (repeating either changes nothing)."""

    def __init__(self, runtime: Runtime, retries: int = RETRIES) -> None:
        super().__init__(
            initial_backoff=0,
            increment_base=2,
            retry_total=retries,
            retry_connect=retries,
            retry_read=retries,
            retry_status=retries,
        )
        self._runtime = runtime

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        base = min(8.0, 0.1 * 2 ** int(settings["count"]))
        return float(base * (0.5 + self._runtime.random()))

    def sleep(self, settings: dict[str, Any], transport: Any) -> None:
        self._runtime.sleep(self.get_backoff_time(settings))

    def increment(
        self, settings: dict[str, Any], request: Any, response: Any = None, error: Any = None
    ) -> bool:
        if isinstance(error, ServiceResponseError) and _changes_what_it_names(request):
            return False
        return bool(super().increment(settings, request, response, error))


def _changes_what_it_names(request: Any) -> bool:
    """A PUT other than Put Block: sent twice, the second may meet the first's change. A
    block sent again is the same block (its id names its bytes)."""
    url = str(getattr(request, "url", ""))
    return getattr(request, "method", "") == "PUT" and "comp=block&" not in f"{url}&"


def _transport(account_url: str) -> RequestsTransport:
    """requests with ``CONNECTIONS`` pooled connections and no retries of its own (the
    store's retry policy is the only one), the environment's proxy and CA bundle read once
    (``sessions``). azure-core passes its own ``verify`` with every request, so the bundle
    is the transport's too."""
    adapter = HTTPAdapter(
        pool_connections=CONNECTIONS,
        pool_maxsize=CONNECTIONS,
        max_retries=Retry(total=False, redirect=False, raise_on_status=False),
    )
    session = pinned_session(requests.Session(), account_url, adapter)
    return RequestsTransport(session=session, session_owner=True, connection_verify=session.verify)


@dataclass(frozen=True)
class Credentials:
    """Where a store's client comes from: the account URL, and how it signs in (``how``,
    for messages); the secrets themselves stay in the client."""

    account_url: str
    how: str
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Values to hide wherever text is shown (an account key, a SAS token)."""


def _settings(connection_string: str) -> dict[str, str]:
    fields = [part.split("=", 1) for part in connection_string.strip().rstrip(";").split(";")]
    if not connection_string.strip() or any(len(f) != 2 or not f[0].strip() for f in fields):
        raise InvalidInput(
            f"{CONNECTION_STRING} is not a connection string (NAME=VALUE pairs separated by "
            "';'); copy it from the portal or `az storage account show-connection-string`, "
            "or unset it to sign in with azure-identity"
        )
    return {name.strip().lower(): value.strip() for name, value in fields}


def _connection_secrets(settings: dict[str, str]) -> tuple[str, ...]:
    found = [settings.get("accountkey", ""), settings.get("sharedaccesssignature", "")]
    sas = settings.get("sharedaccesssignature", "")
    found += [v for _, _, v in (part.partition("=") for part in sas.split("&"))]
    return tuple(s for s in found if len(s) >= 8)


def connection_endpoint(settings: dict[str, str]) -> str:
    """The blob endpoint a connection string names (for messages and comparison)."""
    if settings.get("usedevelopmentstorage", "").lower() == "true":
        return "http://127.0.0.1:10000/devstoreaccount1"
    if settings.get("blobendpoint"):
        return settings["blobendpoint"].rstrip("/")
    account = settings.get("accountname", "ACCOUNT")
    protocol = settings.get("defaultendpointsprotocol", "https")
    suffix = settings.get("endpointsuffix", "core.windows.net")
    return f"{protocol}://{account}.blob.{suffix}"


def _elsewhere(given: str, named: str) -> str:
    """The account URL of ``given``: itself, or with the path of ``named`` when it has none
    (an emulator's account is the first segment of its path)."""
    if urlparse(given).path.strip("/"):
        return given
    return given.rstrip("/") + urlparse(named).path.rstrip("/")


def check_container(container: str) -> str:
    if not isinstance(container, str) or not CONTAINER.fullmatch(container):
        raise InvalidInput(
            f"invalid container name {container!r}: an Azure container has 3-63 lowercase "
            "letters, digits and single hyphens between them, such as az://jobs/nightly"
        )
    return container


def check_account_url(url: str, where: str) -> str:
    """An account URL is ``http(s)://HOST[:PORT][/ACCOUNT]``: no user info, no query (a
    SAS token there would show in shell histories and process lists)."""
    shown = without_credentials(redact(url))
    user_info, parsed = endpoint_parts(url)
    if user_info or (parsed is not None and (parsed.query or parsed.fragment)):
        raise InvalidInput(
            f"invalid Azure account URL {shown!r} ({where}): it carries credentials (user "
            "info or a query such as a SAS token); an account URL is "
            "https://ACCOUNT.blob.core.windows.net only. Put a SAS token or an account key in "
            f"{CONNECTION_STRING}, or sign in with azure-identity (az login, a managed identity)"
        )
    if not plain_http(parsed, path=True):
        raise InvalidInput(
            f"invalid Azure account URL {shown!r} ({where}): use "
            "https://ACCOUNT.blob.core.windows.net (or http://127.0.0.1:10000/devstoreaccount1 "
            "for Azurite)"
        )
    return url.rstrip("/")


def make_service(
    endpoint_url: str | None = None,
    *,
    runtime: Runtime,
    retries: int = RETRIES,
    connection_string: str | None = None,
    transport: HttpTransport[Any, Any] | None = None,
) -> tuple[BlobServiceClient, Credentials]:
    """The client of the account, and where its credentials came from.

    ``AZURE_STORAGE_CONNECTION_STRING`` wins when set; an ``endpoint_url`` given with it is
    where its requests go, signed with its key or SAS token (as an S3 endpoint takes the
    AWS credentials; a bare ``http://HOST:PORT`` keeps the account path of the connection
    string's endpoint: Azurite's ``/devstoreaccount1``). Without it, the account URL is
    ``endpoint_url`` or ``AZURE_STORAGE_ACCOUNT_URL``, signed in with
    ``DefaultAzureCredential``. ``connection_string`` stands for the variable's value;
    ``transport`` for requests with a pool of ``CONNECTIONS``.
    """
    options: dict[str, Any] = {
        "retry_policy": AzureRetry(runtime, retries),
        "max_single_put_size": SINGLE_PUT,
        "max_single_get_size": GET_CHUNK,
        "max_chunk_get_size": GET_CHUNK,
        "connection_timeout": 10,
        "read_timeout": 60,
    }
    if connection_string is None:
        connection_string = os.environ.get(CONNECTION_STRING, "")
    if connection_string.strip():
        settings = _settings(connection_string)
        secrets = _connection_secrets(settings)
        endpoint = check_account_url(
            connection_endpoint(settings), f"the blob endpoint {CONNECTION_STRING} names"
        )
        if endpoint_url is not None:
            endpoint = _elsewhere(check_account_url(endpoint_url, "from --endpoint-url"), endpoint)
            if settings.get("usedevelopmentstorage", "").lower() == "true":
                raise InvalidInput(
                    f"{CONNECTION_STRING}=UseDevelopmentStorage=true names its own endpoint; "
                    "give the emulator's connection string (with its BlobEndpoint) to reach it "
                    "at --endpoint-url, or leave --endpoint-url out"
                )
            settings["blobendpoint"] = endpoint
            connection_string = ";".join(f"{name}={value}" for name, value in settings.items())
        options["transport"] = transport or _transport(endpoint)
        try:
            service = BlobServiceClient.from_connection_string(connection_string, **options)
        except ValueError:
            raise InvalidInput(
                f"{CONNECTION_STRING} names no blob endpoint or no credentials (it needs "
                "AccountName and AccountKey, or BlobEndpoint and SharedAccessSignature); copy "
                "it from `az storage account show-connection-string`"
            ) from None
        return service, Credentials(
            endpoint, f"the connection string in {CONNECTION_STRING}", secrets
        )
    if endpoint_url is not None:
        url = check_account_url(endpoint_url, "from --endpoint-url")
    elif os.environ.get(ACCOUNT_URL, "").strip():
        url = check_account_url(os.environ[ACCOUNT_URL].strip(), f"from {ACCOUNT_URL}")
    else:
        raise InvalidInput(
            f"no Azure account to connect to: set {CONNECTION_STRING}, or give the account URL "
            f"(--endpoint-url or {ACCOUNT_URL}, such as https://ACCOUNT.blob.core.windows.net) "
            "and sign in the way azure-identity finds (az login, a managed identity, "
            "AZURE_CLIENT_ID with AZURE_TENANT_ID and AZURE_CLIENT_SECRET ...)"
        )
    if not url.lower().startswith("https://"):
        raise InvalidInput(
            f"the account URL {redact(url)!r} is not https, and azure-identity signs in over "
            f"https only; use https://ACCOUNT.blob.core.windows.net, or set {CONNECTION_STRING} "
            "(an emulator such as Azurite: its connection string)"
        )
    options["transport"] = transport or _transport(url)
    service = BlobServiceClient(url, credential=DefaultAzureCredential(), **options)
    return service, Credentials(url, "azure-identity (DefaultAzureCredential)")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without the secrets it may carry: the values of connection-string and SAS
    fields (``AccountKey=``, ``sig=`` ...), user info in URLs, and every value of
    ``secrets`` wherever it appears."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = _SECRET_FIELDS.sub(lambda m: f"{m.group(1)}=***", text)
    return re.sub(r"://[^/@\s]*@", "://***@", text)
