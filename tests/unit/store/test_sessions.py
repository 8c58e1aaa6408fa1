"""The HTTP sessions of the GCS and Azure backends read the environment's proxy and CA
bundle once, when made: requests would scan the environment (and ``.netrc``) again on every
request, and azure-core would send its own ``verify=True`` with each one, past the bundle.
One test holds both clients to it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import requests

from objmanifest.store import azure_client
from objmanifest.store.gcs_client import make_gcs_client

ENDPOINT = "http://store.example:4443"


def gcs(url: str) -> tuple[requests.Session, str | bool]:
    """A GCS client's session, and the ``verify`` each of its requests sends."""
    session = make_gcs_client(url).session
    return session, session.verify


def azure(url: str) -> tuple[requests.Session, str | bool]:
    """An Azure transport's session, and the ``verify`` azure-core sends with each request."""
    transport = azure_client._transport(url)
    assert transport.session is not None
    return transport.session, transport.connection_config.verify


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "elsewhere.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/our/bundle.pem")
    return monkeypatch


@pytest.mark.parametrize("made", [gcs, azure], ids=["gcs", "azure"])
def test_a_client_takes_the_proxy_and_ca_bundle_once_when_made(
    environment: pytest.MonkeyPatch,
    made: Callable[[str], tuple[requests.Session, str | bool]],
) -> None:
    session, verify = made(ENDPOINT)
    assert session.trust_env is False
    assert session.proxies.get("http") == "http://proxy.example:3128"
    assert session.verify == verify == "/our/bundle.pem"

    environment.setenv("NO_PROXY", "store.example")
    bypassed, bypassed_verify = made(ENDPOINT)
    assert "http" not in bypassed.proxies and bypassed_verify == "/our/bundle.pem"
    environment.delenv("REQUESTS_CA_BUNDLE")
    environment.setenv("CURL_CA_BUNDLE", "/curl/bundle.pem")
    assert made(ENDPOINT)[1] == "/curl/bundle.pem"
    environment.delenv("CURL_CA_BUNDLE")
    environment.delenv("HTTP_PROXY")
    assert made(ENDPOINT)[1] is True
    assert session.proxies.get("http") == "http://proxy.example:3128"  # read once, kept
    assert session.verify == "/our/bundle.pem"


def test_a_gcs_session_and_an_azure_transport_agree_on_the_environment(
    environment: pytest.MonkeyPatch,
) -> None:
    gcs_session, gcs_verify = gcs(ENDPOINT)
    azure_session, azure_verify = azure(ENDPOINT)
    assert (gcs_session.trust_env, gcs_session.proxies, gcs_verify) == (
        azure_session.trust_env,
        azure_session.proxies,
        azure_verify,
    )
