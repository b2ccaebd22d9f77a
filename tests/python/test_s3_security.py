"""Regression tests for the S3 correctness/security items of issue 15, against
the real server with boto3, requests and hand-built requests:

* an `x-amz-*` header the signature does not cover is refused (403
  AccessDenied), for presigned URLs and header auth alike: a presigned PUT
  plus an added `x-amz-copy-source` used to copy any object;
* a forged ListObjectsV2 continuation token with a NUL in it used to list the
  internal multipart keys;
* more metadata headers than an object record holds are refused with 400
  before the body is read (they used to fail with 500 after the upload).
"""

from __future__ import annotations

import socket

import pytest
import requests
from botocore.exceptions import ClientError

import s3wire
from conftest import ACCESS_KEY, SECRET_KEY, unique_bucket_name

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

UNSIGNED_MESSAGE = "There were headers present in the request which were not signed"


def error_code(resp) -> str | None:
    return s3wire.Response(resp.status_code, {}, resp.content).error_code()


@pytest.fixture(scope="module")
def buckets(server):
    c = server.client()
    src, dst = unique_bucket_name("secret"), unique_bucket_name("open")
    c.create_bucket(Bucket=src)
    c.create_bucket(Bucket=dst)
    c.put_object(Bucket=src, Key="secret", Body=b"top secret bytes")
    return c, src, dst


# ---------------------------------------------------------------------------
# unsigned x-amz-* headers
# ---------------------------------------------------------------------------

def test_presigned_put_with_added_copy_source_is_refused(server, buckets):
    c, src, dst = buckets
    url = c.generate_presigned_url("put_object", Params={"Bucket": dst, "Key": "upload"},
                                   ExpiresIn=300)
    r = requests.put(url, data=b"mine", headers={"x-amz-copy-source": f"/{src}/secret"},
                     timeout=10)
    assert r.status_code == 403, r.text
    assert error_code(r) == "AccessDenied", r.text
    assert UNSIGNED_MESSAGE in r.text
    # Nothing was copied.
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=dst, Key="upload")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    # The URL itself still works as meant.
    r = requests.put(url, data=b"mine", timeout=10)
    assert r.status_code == 200, r.text
    assert c.get_object(Bucket=dst, Key="upload")["Body"].read() == b"mine"


@pytest.mark.parametrize("name,value", [
    ("x-amz-meta-owner", "mallory"),
    ("X-Amz-Metadata-Directive", "REPLACE"),
    ("x-amz-checksum-crc32", "AAAAAA=="),
    ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
])
def test_presigned_put_with_any_added_amz_header_is_refused(server, buckets, name, value):
    c, _, dst = buckets
    url = c.generate_presigned_url("put_object", Params={"Bucket": dst, "Key": "other"},
                                   ExpiresIn=300)
    r = requests.put(url, data=b"x", headers={name: value}, timeout=10)
    assert r.status_code == 403, r.text
    assert error_code(r) == "AccessDenied"


def test_presigned_get_with_harmless_headers_still_works(server, buckets):
    c, src, _ = buckets
    url = c.generate_presigned_url("get_object", Params={"Bucket": src, "Key": "secret"},
                                   ExpiresIn=300)
    # Headers outside x-amz-*, and one repeating what the URL signed.
    for headers in ({}, {"User-Agent": "curl/8.5", "X-Amzn-Trace-Id": "Root=1-abc"},
                    {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}):
        r = requests.get(url, headers=headers, timeout=10)
        assert r.status_code == 200, (headers, r.text)
        assert r.content == b"top secret bytes"


def test_header_auth_with_added_copy_source_is_refused(server, buckets):
    _, src, dst = buckets
    host = f"{server.host}:{server.s3_port}"
    path = f"/{dst}/header-auth"
    signed, _ = s3wire.Signer(ACCESS_KEY, SECRET_KEY).sign(
        "PUT", path, {"host": host}, s3wire.UNSIGNED_PAYLOAD)
    r = s3wire.send(server.host, server.s3_port, "PUT", path,
                    {**signed, "x-amz-copy-source": f"/{src}/secret"}, body=b"")
    assert r.status == 403, r.body
    assert r.error_code() == "AccessDenied"
    # The same signed request without the added header is fine.
    r = s3wire.send(server.host, server.s3_port, "PUT", path, signed, body=b"")
    assert r.status == 200, r.body


# ---------------------------------------------------------------------------
# internal keys and listing
# ---------------------------------------------------------------------------

def test_forged_continuation_token_cannot_list_internal_keys(server, buckets):
    c, _, dst = buckets
    upload = c.create_multipart_upload(Bucket=dst, Key="pending")["UploadId"]
    try:
        # base64url("\0!") = "ACE": resumes after "\0!" + everything, which
        # with delimiter "!" used to list "\0u/pending\0<id>".
        r = requests.get(
            c.generate_presigned_url("list_objects_v2", Params={
                "Bucket": dst, "ContinuationToken": "ACE", "Delimiter": "!"}, ExpiresIn=300),
            timeout=10)
        assert b"pending" not in r.content, r.content
        assert r.status_code == 400, r.content
        assert error_code(r) == "InvalidArgument"
        with pytest.raises(ClientError) as e:
            c.list_objects_v2(Bucket=dst, ContinuationToken="ACE", Delimiter="!")
        assert e.value.response["Error"]["Code"] == "InvalidArgument"
    finally:
        c.abort_multipart_upload(Bucket=dst, Key="pending", UploadId=upload)


# ---------------------------------------------------------------------------
# metadata bounds, before the body
# ---------------------------------------------------------------------------

def test_too_many_metadata_headers_is_400_not_500(server, buckets):
    c, _, dst = buckets
    # 63 stored entries fit (the record holds 64, one kept for the checksum).
    ok = {f"k{i}": "v" for i in range(63)}
    c.put_object(Bucket=dst, Key="meta-ok", Body=b"x", Metadata=ok)
    assert c.head_object(Bucket=dst, Key="meta-ok")["Metadata"] == ok
    for count in (64, 65, 80):  # past ~90, the HTTP header-count limit (431) comes first
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket=dst, Key="meta-many", Body=b"x",
                         Metadata={f"k{i}": "v" for i in range(count)})
        err = e.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 400, (count, err)
        assert err["Error"]["Code"] == "MetadataTooLarge"
        assert "metadata headers" in err["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        c.create_multipart_upload(Bucket=dst, Key="meta-many",
                                  Metadata={f"k{i}": "v" for i in range(70)})
    assert e.value.response["Error"]["Code"] == "MetadataTooLarge"


def _head_only_put(server, path: str, headers: dict) -> bytes:
    """Sends a signed PUT head announcing 64 MiB with Expect: 100-continue
    and no body; returns the first response head the server sends."""
    host = f"{server.host}:{server.s3_port}"
    hdrs = {"host": host, "content-length": str(64 << 20), "expect": "100-continue", **headers}
    signed, _ = s3wire.Signer(ACCESS_KEY, SECRET_KEY).sign(
        "PUT", path, hdrs, s3wire.UNSIGNED_PAYLOAD)
    head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in signed.items())
    s = socket.create_connection((server.host, server.s3_port), timeout=10)
    try:
        s.sendall(head.encode() + b"\r\n")
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def test_metadata_bounds_are_checked_before_the_body(server, buckets):
    _, _, dst = buckets
    many = {f"x-amz-meta-k{i}": "v" for i in range(70)}
    first = _head_only_put(server, f"/{dst}/meta-early", many)
    assert first.startswith(b"HTTP/1.1 400"), first[:200]
    big = {"x-amz-meta-big": "v" * 2100}
    first = _head_only_put(server, f"/{dst}/meta-early", big)
    assert first.startswith(b"HTTP/1.1 400"), first[:200]
