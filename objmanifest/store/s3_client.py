"""The boto3 client of an S3 store: its configuration (retries, timeouts, the connection pool,
``Expect: 100-continue`` only for large bodies) and the checks of an endpoint URL before
any request (no credentials in it, a scheme and a host)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import boto3
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.utils import determine_content_length

from ..errors import InvalidInput
from .urls import endpoint_parts, plain_http, without_credentials

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def _client_config(**overrides: Any) -> Config:
    settings: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
        "retries": {"max_attempts": 5, "mode": "standard"},
        "parameter_validation": False,  # S3Store builds every request itself: a sixth of
        # the client's CPU per request, spent checking what the types already say
        "max_pool_connections": 32,
        "connect_timeout": 10,
        "read_timeout": 60,
    }
    settings.update(overrides)
    return Config(**settings)


CONTINUE_THRESHOLD = 2 * 1024 * 1024


"""A PUT body of at least this many bytes (or of unknown size) asks ``Expect: 100-continue``
first; a smaller one is sent at once. The threshold of AWS's own Go SDK (v2)."""


CONTINUE_HANDLERS = {op: f"objmanifest-continue-{op}" for op in ("PutObject", "UploadPart")}


"""The operations whose ``Expect`` ``make_client`` decides, each with its handler's
``unique_id`` (to unregister it, as ``bench/continue_cost.py`` does for botocore's way)."""


def _continue_only_for_large_bodies(request: AWSRequest, **_: Any) -> None:
    """Drop the ``Expect: 100-continue`` botocore puts on every ``PutObject`` and
    ``UploadPart`` (it turns a bytes body into a file) when the body is small.

    With it the client waits for the server's ``100 Continue`` before sending the body: one
    more round trip for every shard commit and small data object. The header spares the
    bytes of a body the store refuses; for a small body those cost less than a round trip
    on every PUT, so only large bodies keep it. ``Expect`` is not signed: dropping it
    leaves the signature as it is."""
    if "Expect" not in request.headers:
        return
    size = determine_content_length(request.body)
    if size is not None and size < CONTINUE_THRESHOLD:
        del request.headers["Expect"]


def make_client(
    endpoint_url: str | None = None, region: str | None = None, **config: Any
) -> S3Client:
    """A boto3 S3 client with the settings S3-compatible stores need.

    Path-style addressing and ``when_required`` checksums: some stores reject virtual-host
    addressing on loopback and the aws-chunked bodies botocore >= 1.36 sends by default.
    A body below ``CONTINUE_THRESHOLD`` goes without ``Expect: 100-continue`` (one round
    trip per PUT, not two).
    """
    endpoint_url = (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    if endpoint_url is not None:
        check_endpoint(endpoint_url)
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    session = boto3.session.Session()
    client: S3Client = session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region or "us-east-1",
        config=_client_config(**config),
    )
    for operation, unique_id in CONTINUE_HANDLERS.items():
        client.meta.events.register(
            f"before-sign.s3.{operation}", _continue_only_for_large_bodies, unique_id=unique_id
        )
    return client


def check_endpoint(endpoint_url: str) -> str:
    """An endpoint is ``http(s)://HOST[:PORT]``; anything else is refused in one line, and
    one that carries credentials (user info, a query) is refused without showing them."""
    shown = without_credentials(endpoint_url)
    where = "from --endpoint-url, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL"
    user_info, parsed = endpoint_parts(endpoint_url)
    if user_info:
        raise InvalidInput(
            f"invalid S3 endpoint URL {shown!r} ({where}): it carries user info (before '@'); an "
            "endpoint is http(s)://HOST[:PORT] only; credentials go in AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or an AWS profile: AWS_PROFILE), never in a URL"
        )
    if not plain_http(parsed, path=True):
        raise InvalidInput(
            f"invalid S3 endpoint URL {shown!r} ({where}): use http(s)://HOST[:PORT], such "
            "as http://127.0.0.1:9000"
        )
    return endpoint_url
