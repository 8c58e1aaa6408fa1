"""Store URLs of every scheme: what each accepts, and one line naming the fix for anything
else (``objmanifest.store.urls``); and which backend module a scheme opens."""

from __future__ import annotations

import pytest

import objmanifest as om
from objmanifest.store import Head, completed_from, parse_url
from objmanifest.store.urls import StoreURL, parse


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("s3://work/jobs/nightly", ("s3", "work", "jobs/nightly")),
        ("s3://Old_Bucket", ("s3", "Old_Bucket", "")),
        ("az://pipelines/jobs", ("az", "pipelines", "jobs")),
        ("az://a-b-c", ("az", "a-b-c", "")),
        ("gs://my-bucket/a/b", ("gs", "my-bucket", "a/b")),
        ("gs://my.bucket_1", ("gs", "my.bucket_1", "")),
        ("file:///srv/objmanifest", ("file", "/srv/objmanifest", "")),
        ("file:///srv/objmanifest/", ("file", "/srv/objmanifest", "")),
        ("file://localhost/srv/x", ("file", "/srv/x", "")),
        ("file:///tmp/my%20dir", ("file", "/tmp/my dir", "")),
        ("memory://tests/p", ("memory", "tests", "p")),
    ],
)
def test_each_scheme_names_its_bucket_container_or_directory(
    url: str, parsed: tuple[str, str, str]
) -> None:
    assert parse_url(url) == parsed
    assert str(parse(url)) == str(StoreURL(*parsed))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("az://Pipelines/x", "invalid container name 'Pipelines'"),
        ("az://a--b/x", "invalid container name 'a--b'"),
        ("az://ab/x", "3-63 lowercase letters"),
        ("gs://UPPER/x", "invalid bucket name 'UPPER'"),
        ("gs://-lead/x", "starting and ending with a letter or digit"),
        ("s3://a b/p", "invalid bucket name"),
        ("az://cont/a/../b", "'..' segment"),
        ("gs://bucket/a//b", "empty, '.' or '..' segment"),
        ("gs://bucket//b", "empty, '.' or '..' segment"),
        ("az://cont//b", "empty, '.' or '..' segment"),
        ("s3://bucket//b/c", "empty, '.' or '..' segment"),
        ("file://host/srv/x", "not a host ('host')"),
        ("file:relative/dir", "file:///ABSOLUTE/DIR (three slashes)"),
        ("file:///", "the root directory itself cannot be a store"),
        ("file:///srv/../etc", "'..' segment"),
        ("file:///srv/a//b", "empty, '.' or '..' segment"),
        ("file:///srv/%00x", "control character"),
        ("file:///srv/%ff", "not UTF-8"),
        ("file:///srv/x?mode=1", "no query or fragment"),
        ("file:///srv/x#frag", "no query or fragment"),
        ("ftp://host/x", "not a store URL"),
        ("az://", "not a store URL"),
        ("gs:/bucket", "not a store URL"),
    ],
)
def test_a_url_that_breaks_its_schemes_rules_is_one_line_naming_the_fix(
    url: str, says: str
) -> None:
    with pytest.raises(om.InvalidInput) as caught:
        om.connect(url)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("az://user:S3cret@container/p", "AZURE_STORAGE_CONNECTION_STRING"),
        ("gs://user:S3cret@bucket/p", "application default credentials"),
        ("s3://user:S3cret@bucket/p", "AWS_ACCESS_KEY_ID"),
        ("file://user:S3cret@host/p", "the directory's own permissions"),
    ],
)
def test_a_url_with_a_credential_is_refused_without_showing_it(url: str, where: str) -> None:
    with pytest.raises(om.InvalidInput) as caught:
        om.connect(url)
    assert "S3cret" not in str(caught.value) and "user:" not in str(caught.value)
    assert where in str(caught.value) and "***@" in str(caught.value)


def test_a_boto3_client_or_region_is_for_s3_urls_only() -> None:
    with pytest.raises(om.InvalidInput, match="for s3:// URLs only"):
        om.connect("az://container/p", region="eu-west-1")
    with pytest.raises(om.InvalidInput, match="a directory has no endpoint"):
        om.connect("file:///srv/x", endpoint_url="http://127.0.0.1:9000")


def test_a_completion_is_told_by_the_upload_the_store_recorded_else_by_the_multipart_etag() -> None:
    etags = ["0cc175b9c0f1b6a831c399e269772661", "92eb5ffee6ae2fec3ad71c777531578f"]
    s3_etag = '"8a6f6e4a2d9a0d9d0a2ea48fc5b7a5fb-2"'
    implied = om.store.base.checksum.multipart_etag(etags)
    assert implied is not None
    assert completed_from(Head(f'"{implied}"', 2, {}), "any", etags) is True
    assert completed_from(Head(s3_etag, 2, {}), "any", etags) is False
    assert completed_from(Head('"0x8D1"', 2, {}, completed_upload="u1"), "u1", etags) is True
    assert completed_from(Head('"0x8D1"', 2, {}, completed_upload="u1"), "u2", etags) is False
    assert completed_from(Head('"x"', 2, {}), "u1", ["not-an-md5"]) is None
