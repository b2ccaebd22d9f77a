"""Presigned URLs made by boto3's generate_presigned_url, used the way a
browser or curl would (plain http.client, no SDK): a GET and a PUT
succeed; an expired URL, a tampered signature, a URL for another key or
method, and a changed X-Amz-Expires are refused with 403 and the S3 error
code saying why. One shard: signing does not depend on the shard count."""

from __future__ import annotations

import http.client
import re
import time
from urllib.parse import urlsplit

import pytest

from conftest import unique_bucket_name
from signed import one_shard_server


@pytest.fixture(scope="module")
def env():
    srv = one_shard_server("presign")
    try:
        s3 = srv.client()
        bucket = unique_bucket_name("presign")
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="dir/object one.bin", Body=b"presigned payload",
                      ContentType="application/x-presigned")
        yield srv, s3, bucket
    finally:
        srv.close()


def fetch(url: str, method: str = "GET", body: bytes | None = None,
          headers: dict | None = None) -> tuple[int, dict, bytes]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        target = u.path + ("?" + u.query if u.query else "")
        conn.request(method, target, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def code(body: bytes) -> str | None:
    m = re.search(rb"<Code>([^<]*)</Code>", body)
    return m.group(1).decode() if m else None


def test_presigned_get(env):
    srv, s3, bucket = env
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket,
                                                           "Key": "dir/object one.bin"},
                                    ExpiresIn=300)
    assert "X-Amz-Signature=" in url and "Authorization" not in url
    status, headers, body = fetch(url)
    assert status == 200, body
    assert body == b"presigned payload"
    assert headers["content-type"] == "application/x-presigned"
    # A presigned HEAD.
    url = s3.generate_presigned_url("head_object", Params={"Bucket": bucket,
                                                            "Key": "dir/object one.bin"})
    status, headers, body = fetch(url, "HEAD")
    assert status == 200 and int(headers["content-length"]) == len(b"presigned payload")


def test_presigned_put(env):
    srv, s3, bucket = env
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up/loaded"},
                                    ExpiresIn=300)
    data = bytes(range(256)) * 300
    status, headers, body = fetch(url, "PUT", data)
    assert status == 200, body
    assert headers["etag"].strip('"') == __import__("hashlib").md5(data).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="up/loaded")
    assert got["Body"].read() == data
    # With a signed Content-Type: the header must be sent as signed.
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up/typed",
                                                          "ContentType": "text/x-signed"})
    status, _, body = fetch(url, "PUT", b"typed", {"Content-Type": "text/x-signed"})
    assert status == 200, body
    assert s3.head_object(Bucket=bucket, Key="up/typed")["ContentType"] == "text/x-signed"
    status, _, body = fetch(url, "PUT", b"typed", {"Content-Type": "text/other"})
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body


def test_expired_presigned_url_is_refused(env):
    srv, s3, bucket = env
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket,
                                                           "Key": "dir/object one.bin"},
                                    ExpiresIn=2)
    put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "late"},
                                    ExpiresIn=2)
    status, _, body = fetch(url)
    assert status == 200, body  # valid for its 2 seconds
    time.sleep(3.1)
    status, _, body = fetch(url)
    assert (status, code(body)) == (403, "AccessDenied"), body
    assert b"expired" in body
    status, _, body = fetch(put, "PUT", b"too late")
    assert (status, code(body)) == (403, "AccessDenied"), body
    with pytest.raises(Exception) as e:
        s3.head_object(Bucket=bucket, Key="late")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_tampered_presigned_urls_are_refused(env):
    srv, s3, bucket = env
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket,
                                                           "Key": "dir/object one.bin"},
                                    ExpiresIn=300)
    sig = re.search(r"X-Amz-Signature=([0-9a-f]{64})", url).group(1)
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    cases = {
        "signature changed": url.replace(sig, flipped),
        "other key": url.replace("object%20one.bin", "object%20two.bin"),
        "longer expiry": url.replace("X-Amz-Expires=300", "X-Amz-Expires=3000"),
        "other access key": url.replace("X-Amz-Credential=percore", "X-Amz-Credential=percorf"),
    }
    for what, bad in cases.items():
        assert bad != url, what
        status, _, body = fetch(bad)
        want = "InvalidAccessKeyId" if what == "other access key" else "SignatureDoesNotMatch"
        assert (status, code(body)) == (403, want), (what, body)
    # The method is signed: a GET URL does not allow a PUT (or DELETE).
    status, _, body = fetch(url, "PUT", b"overwrite")
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body
    status, _, body = fetch(url, "DELETE")
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body
    assert s3.get_object(Bucket=bucket, Key="dir/object one.bin")["Body"].read() == \
        b"presigned payload"
    # A presigned PUT whose body is replaced still stores (UNSIGNED-PAYLOAD),
    # but one for another bucket does not.
    put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "p"})
    status, _, body = fetch(put.replace(f"/{bucket}/", "/not-this-bucket/"), "PUT", b"x")
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body
