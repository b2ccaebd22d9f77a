"""PutObject body encodings, sent byte by byte: aws-chunked (signed, signed with
trailer, unsigned trailer), HTTP Transfer-Encoding: chunked, UNSIGNED-PAYLOAD,
and boto3's own TLS-style aws-chunked upload forced over plain HTTP."""

from __future__ import annotations

import hashlib
import io
import os
from unittest import mock

import pytest

import s3wire
from conftest import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SIZES = [0, 1, 1000, 64 * 1024, 200 * 1024 + 7]


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def signer() -> s3wire.Signer:
    return s3wire.Signer(ACCESS_KEY, SECRET_KEY)


def assert_stored(s3, bucket, key, payload, resp=None):
    if resp is not None:
        assert resp.status == 200, (resp.status, resp.body[:500])
        assert resp.headers.get("etag") == f'"{md5(payload)}"', resp.headers
    obj = s3.get_object(Bucket=bucket, Key=key)
    body = obj["Body"].read()
    assert len(body) == len(payload)
    assert md5(body) == md5(payload)
    assert obj["ETag"] == f'"{md5(payload)}"'
    # The aws-chunked framing is a transfer detail, never part of the object.
    assert "aws-chunked" not in (obj.get("ContentEncoding") or "")


# -- signer self-checks (no server needed) ----------------------------------

def test_signer_matches_aws_published_chunked_example():
    """The AWS docs example of a chunked upload: 66560 'a' in 64 KiB + 1 KiB chunks."""
    s = s3wire.Signer("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                      "us-east-1", amz_date="20130524T000000Z")
    payload = b"a" * 66560
    body_len = len(s3wire.signed_chunked_body(None, "0" * 64, payload, 65536))
    assert body_len == 66824
    headers = {
        "host": "s3.amazonaws.com",
        "content-encoding": "aws-chunked",
        "content-length": str(body_len),
        "x-amz-decoded-content-length": "66560",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
    }
    _, seed = s.sign("PUT", "/examplebucket/chunkObject.txt", headers, s3wire.STREAMING_SIGNED)
    assert seed == "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    c1 = s.chunk_signature(seed, payload[:65536])
    c2 = s.chunk_signature(c1, payload[65536:])
    c3 = s.chunk_signature(c2, b"")
    assert c1 == "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
    assert c2 == "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
    assert c3 == "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
    body = s3wire.signed_chunked_body(s, seed, payload, 65536)
    assert body.startswith(b"10000;chunk-signature=" + c1.encode() + b"\r\n")
    assert body.endswith(b"0;chunk-signature=" + c3.encode() + b"\r\n\r\n")


def test_signer_matches_aws_published_trailer_example():
    """The AWS docs example of a chunked upload with a signed CRC32C trailer."""
    s = s3wire.Signer("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                      "us-east-1", amz_date="20130524T000000Z")
    headers = {
        "host": "s3.amazonaws.com",
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": "66560",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "x-amz-trailer": "x-amz-checksum-crc32c",
    }
    _, seed = s.sign("PUT", "/examplebucket/chunkObject.txt", headers,
                     s3wire.STREAMING_SIGNED_TRAILER)
    assert seed == "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
    body = s3wire.signed_chunked_body(s, seed, b"a" * 66560, 65536,
                                      ("x-amz-checksum-crc32c", "sOO8/Q=="))
    assert body.endswith(
        b"\r\n0;chunk-signature="
        b"2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992\r\n"
        b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
        b"x-amz-trailer-signature:"
        b"d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n\r\n")


def test_signer_matches_botocore():
    """Our header signer agrees with botocore's on an awkward key."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    path = s3wire.encode_key_path("bucket-x", "dir/ünï cödé+=&?#~.txt")
    req = AWSRequest(method="PUT", url=f"http://127.0.0.1:9000{path}", data=b"hello",
                     headers={"Content-Length": "5"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    amz_date = req.headers["X-Amz-Date"]
    ours, _ = s3wire.Signer(ACCESS_KEY, SECRET_KEY, amz_date=amz_date).sign(
        "PUT", path, {"host": "127.0.0.1:9000", "content-length": "5"},
        s3wire.sha256_hex(b"hello"))
    assert ours["Authorization"] == req.headers["Authorization"]


# -- against the server -----------------------------------------------------

def test_put_signed_aws_chunked(server, s3, bucket):
    for size in SIZES:
        payload = os.urandom(size)
        key = f"signed-chunked/{size}"
        resp = s3wire.put_streaming_signed(server.host, server.s3_port, signer(), bucket, key,
                                           payload, chunk_size=64 * 1024)
        assert_stored(s3, bucket, key, payload, resp)
    # Small, uneven chunks too (the spec allows any size for the last one).
    payload = os.urandom(50_000)
    resp = s3wire.put_streaming_signed(server.host, server.s3_port, signer(), bucket,
                                       "signed-chunked/small-chunks", payload, chunk_size=8192)
    assert_stored(s3, bucket, "signed-chunked/small-chunks", payload, resp)


def test_put_signed_aws_chunked_with_trailer(server, s3, bucket):
    for size in SIZES:
        payload = os.urandom(size)
        key = f"signed-trailer/{size}"
        resp = s3wire.put_streaming_signed(server.host, server.s3_port, signer(), bucket, key,
                                           payload, with_trailer=True)
        assert_stored(s3, bucket, key, payload, resp)


def test_put_unsigned_trailer_with_content_length(server, s3, bucket):
    for size in SIZES:
        payload = os.urandom(size)
        key = f"unsigned-trailer/{size}"
        resp = s3wire.put_unsigned_trailer(server.host, server.s3_port, signer(), bucket, key,
                                           payload)
        assert_stored(s3, bucket, key, payload, resp)


def test_put_unsigned_trailer_with_transfer_encoding_chunked(server, s3, bucket):
    """aws-chunked inside HTTP chunked, no Content-Length: boto3's wire format over TLS."""
    for size in SIZES:
        payload = os.urandom(size)
        key = f"unsigned-trailer-te/{size}"
        resp = s3wire.put_unsigned_trailer(server.host, server.s3_port, signer(), bucket, key,
                                           payload, transfer_chunked=True)
        assert_stored(s3, bucket, key, payload, resp)


def test_put_transfer_encoding_chunked(server, s3, bucket):
    cases = {
        "te/empty": [b""],
        "te/one": [b"hello world"],
        "te/many": [os.urandom(n) for n in (1, 100, 65536, 3, 250_000, 17)],
    }
    for key, pieces in cases.items():
        resp = s3wire.put_plain_chunked(server.host, server.s3_port, signer(), bucket, key,
                                        pieces)
        assert_stored(s3, bucket, key, b"".join(pieces), resp)


def test_put_unsigned_payload_and_signed_payload(server, s3, bucket):
    payload = os.urandom(100_000)
    resp = s3wire.put_signed_single(server.host, server.s3_port, signer(), bucket,
                                    "single/unsigned", payload, unsigned=True)
    assert_stored(s3, bucket, "single/unsigned", payload, resp)
    resp = s3wire.put_signed_single(server.host, server.s3_port, signer(), bucket,
                                    "single/signed", payload)
    assert_stored(s3, bucket, "single/signed", payload, resp)
    # boto3 with payload signing disabled sends UNSIGNED-PAYLOAD.
    client = server.client(s3={"payload_signing_enabled": False})
    client.put_object(Bucket=bucket, Key="single/boto3-unsigned", Body=payload)
    assert_stored(s3, bucket, "single/boto3-unsigned", payload)


def test_boto3_tls_style_unsigned_trailer_upload(server, s3, bucket):
    """Make boto3 believe it talks TLS so it sends what it sends to real S3:
    Transfer-Encoding: chunked, Content-Encoding: aws-chunked,
    x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER, CRC32 trailer."""
    import botocore.httpchecksum as hc

    real_urlparse = hc.urlparse

    def tls_urlparse(url, *a, **kw):
        parsed = real_urlparse(url, *a, **kw)
        return parsed._replace(scheme="https") if parsed.scheme == "http" else parsed

    seen = []
    client = server.client()
    client.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **kw: seen.append(dict(request.headers)))
    payloads = {"boto3-trailer/small": os.urandom(1234),
                "boto3-trailer/empty": b"",
                "boto3-trailer/big": os.urandom(3 * 1024 * 1024 + 5)}
    with mock.patch.object(hc, "urlparse", tls_urlparse):
        for key, payload in payloads.items():
            body = io.BytesIO(payload) if len(payload) > 4096 else payload
            client.put_object(Bucket=bucket, Key=key, Body=body)
    headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in seen[0].items()}
    if "aws-chunked" not in headers.get("content-encoding", ""):
        pytest.skip(f"this botocore does not use aws-chunked here: {headers}")
    assert headers.get("x-amz-content-sha256") == s3wire.STREAMING_UNSIGNED_TRAILER
    for key, payload in payloads.items():
        assert_stored(s3, bucket, key, payload)


def test_bad_chunk_signature_is_rejected(server, s3, bucket):
    payload = os.urandom(200 * 1024)
    key = "bad-chunk-signature"
    resp = s3wire.put_streaming_signed(server.host, server.s3_port, signer(), bucket, key,
                                       payload, corrupt_chunk=1)
    assert resp.status == 403, (resp.status, resp.body[:500])
    assert resp.error_code() == "SignatureDoesNotMatch", resp.body[:500]
    # Nothing half-written may be visible.
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key=key)
    # A rejected overwrite leaves the previous version intact.
    s3.put_object(Bucket=bucket, Key=key, Body=b"previous")
    resp = s3wire.put_streaming_signed(server.host, server.s3_port, signer(), bucket, key,
                                       payload, corrupt_chunk=2)
    assert resp.status == 403, (resp.status, resp.body[:500])
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"previous"
