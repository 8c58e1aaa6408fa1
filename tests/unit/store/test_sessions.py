"""The HTTP sessions of the GCS and Azure backends read the environment's proxy and CA
bundle once, when made: requests would scan the environment (and ``.netrc``) again on every
request, and azure-core would send its own ``verify=True`` with each one, past the bundle."""

from __future__ import annotations

import pytest

from objmanifest.store import azure_client
from objmanifest.store.gcs_client import make_gcs_client

ENDPOINT = "http://store.example:4443"


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "elsewhere.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/our/bundle.pem")
    return monkeypatch


def test_an_azure_transport_takes_the_proxy_and_ca_bundle_once(
    environment: pytest.MonkeyPatch,
) -> None:
    transport = azure_client._transport(ENDPOINT)
    session = transport.session
    assert session is not None and session.trust_env is False
    assert session.proxies.get("http") == "http://proxy.example:3128"
    assert session.verify == "/our/bundle.pem"
    assert transport.connection_config.verify == "/our/bundle.pem"  # what each request sends

    environment.setenv("NO_PROXY", "store.example")
    environment.delenv("REQUESTS_CA_BUNDLE")
    environment.setenv("CURL_CA_BUNDLE", "/curl/bundle.pem")
    other = azure_client._transport(ENDPOINT)
    assert other.session is not None and "http" not in other.session.proxies
    assert other.connection_config.verify == "/curl/bundle.pem"
    environment.delenv("CURL_CA_BUNDLE")
    assert azure_client._transport(ENDPOINT).connection_config.verify is True
    assert session.proxies.get("http") == "http://proxy.example:3128"  # read once, kept
    assert transport.connection_config.verify == "/our/bundle.pem"


def test_a_gcs_session_and_an_azure_transport_agree_on_the_environment(
    environment: pytest.MonkeyPatch,
) -> None:
    gcs = make_gcs_client(ENDPOINT).session
    azure = azure_client._transport(ENDPOINT).session
    assert azure is not None
    assert (gcs.trust_env, gcs.proxies, gcs.verify) == (
        azure.trust_env,
        azure.proxies,
        azure.verify,
    )
