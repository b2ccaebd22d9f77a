"""Signature Version 2 (issue 20, item 3), from real clients: boto3 signing
requests with SigV2 (signature_version "s3": `Authorization: AWS AK:sig`),
and boto3's presigned URLs in SigV2 form ("s3-query": AWSAccessKeyId,
Expires, Signature), used with plain http.client the way curl or a
browser would. Sub-resources (uploadId, partNumber, response-*) are in the
signed resource; a wrong secret, a tampered URL, an expired URL and one
valid for more than a week are refused with the S3 error code saying why."""

from __future__ import annotations

import base64
import hashlib
import re
import time
import urllib.parse

import boto3
import pytest
from botocore.config import Config

from conftest import ACCESS_KEY, REGION, SECRET_KEY, unique_bucket_name
from signed import one_shard_server
from test_presign import code, fetch


def v2_client(srv, signature_version: str = "s3", secret: str = SECRET_KEY):
    cfg = Config(region_name=REGION, signature_version=signature_version,
                 s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    return boto3.session.Session().client(
        "s3", endpoint_url=srv.endpoint, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret, region_name=REGION, config=cfg)


@pytest.fixture(scope="module")
def env():
    srv = one_shard_server("sigv2")
    try:
        yield srv, unique_bucket_name("sigv2")
    finally:
        srv.close()


def test_sigv2_header_auth_round_trip(env):
    srv, bucket = env
    s3 = v2_client(srv)
    s3.create_bucket(Bucket=bucket)
    body = b"signed with version 2 " * 1000
    s3.put_object(Bucket=bucket, Key="dir/a b+c.txt", Body=body, ContentType="text/x-v2",
                  Metadata={"team": "vision"})
    got = s3.get_object(Bucket=bucket, Key="dir/a b+c.txt")
    assert got["Body"].read() == body
    assert got["ContentType"] == "text/x-v2"
    assert got["Metadata"] == {"team": "vision"}
    got = s3.get_object(Bucket=bucket, Key="dir/a b+c.txt", Range="bytes=5-14")
    assert got["Body"].read() == body[5:15]
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert names == ["dir/a b+c.txt"]
    # Multipart: uploadId and partNumber are signed sub-resources.
    up = s3.create_multipart_upload(Bucket=bucket, Key="mpu")["UploadId"]
    part = b"p" * (5 << 20)
    e1 = s3.upload_part(Bucket=bucket, Key="mpu", UploadId=up, PartNumber=1, Body=part)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mpu", UploadId=up, PartNumber=2, Body=b"end")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mpu", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.head_object(Bucket=bucket, Key="mpu")["ContentLength"] == len(part) + 3
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "mpu"}]})
    assert s3.get_bucket_location(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    s3.delete_object(Bucket=bucket, Key="dir/a b+c.txt")


def test_sigv2_with_a_wrong_secret_is_refused(env):
    srv, bucket = env
    v2_client(srv).create_bucket(Bucket=bucket + "-w")
    bad = v2_client(srv, secret=SECRET_KEY + "x")
    with pytest.raises(Exception) as e:
        bad.list_objects_v2(Bucket=bucket + "-w")
    err = e.value.response["Error"]
    assert err["Code"] == "SignatureDoesNotMatch", err


def test_sigv2_presigned_urls(env):
    srv, bucket = env
    s3 = v2_client(srv)
    s3.create_bucket(Bucket=bucket + "-p")
    b = bucket + "-p"
    s3.put_object(Bucket=b, Key="k 1", Body=b"presigned v2", ContentType="application/x-one")
    q = v2_client(srv, "s3-query")
    url = q.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "k 1"},
                                   ExpiresIn=300)
    assert "AWSAccessKeyId=" in url and "Signature=" in url and "X-Amz" not in url, url
    status, headers, body = fetch(url)
    assert (status, body) == (200, b"presigned v2"), body
    # A PUT by presigned URL, then read back over SigV2 header auth.
    put = q.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "up"},
                                   ExpiresIn=300)
    data = bytes(range(256)) * 100
    status, headers, body = fetch(put, "PUT", data)
    assert status == 200, body
    assert headers["etag"].strip('"') == hashlib.md5(data).hexdigest()
    assert s3.get_object(Bucket=b, Key="up")["Body"].read() == data
    # Tampering: another key, another signature, a longer expiry, the method.
    sig = re.search(r"Signature=([^&]+)", url).group(1)
    exp = re.search(r"Expires=(\d+)", url).group(1)
    # Flip one bit of the signature itself (the URL form may start with %2B or %2F, so
    # editing its first character could make it not base64 rather than wrong).
    raw = bytearray(base64.b64decode(urllib.parse.unquote(sig)))
    raw[0] ^= 1
    flipped = urllib.parse.quote(base64.b64encode(bytes(raw)).decode(), safe="")
    cases = {
        "signature changed": url.replace("Signature=" + sig, "Signature=" + flipped),
        "other key": url.replace("/k%201?", "/k%202?"),
        "longer expiry": url.replace("Expires=" + exp, f"Expires={int(exp) + 60}"),
    }
    for what, bad in cases.items():
        assert bad != url, what
        status, _, body = fetch(bad)
        assert (status, code(body)) == (403, "SignatureDoesNotMatch"), (what, body)
    status, _, body = fetch(url, "DELETE")
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body
    # Expired, and valid for more than a week.
    old = q.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "k 1"},
                                   ExpiresIn=1)
    time.sleep(2.1)
    status, _, body = fetch(old)
    assert (status, code(body)) == (403, "AccessDenied") and b"expired" in body, body
    far = q.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "k 1"},
                                   ExpiresIn=8 * 86400)
    status, _, body = fetch(far)
    assert (status, code(body)) == (400, "AuthorizationQueryParametersError"), body


def test_sigv2_presigned_response_overrides_are_signed(env):
    srv, bucket = env
    s3 = v2_client(srv)
    b = bucket + "-r"
    s3.create_bucket(Bucket=b)
    s3.put_object(Bucket=b, Key="file.bin", Body=b"attachment", ContentType="application/x-a")
    q = v2_client(srv, "s3-query")
    params = {"Bucket": b, "Key": "file.bin", "ResponseContentType": "text/plain",
              "ResponseContentDisposition": 'attachment; filename="f.txt"'}
    url = q.generate_presigned_url("get_object", Params=params, ExpiresIn=300)
    assert "response-content-type=" in url
    status, headers, body = fetch(url)
    assert (status, body) == (200, b"attachment"), body
    assert headers["content-type"] == "text/plain"
    assert headers["content-disposition"] == 'attachment; filename="f.txt"'
    # The override is in the signed resource: changing it breaks the URL.
    status, _, body = fetch(url.replace("text%2Fplain", "text%2Fhtml"))
    assert (status, code(body)) == (403, "SignatureDoesNotMatch"), body
