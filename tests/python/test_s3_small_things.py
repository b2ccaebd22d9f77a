"""The small things of issue 20 (item 7, part): `response-*` overrides on
GET and HEAD, ListBuckets paging and prefix (max-buckets,
continuation-token), and NotImplemented answers that name the S3
operation. boto3 where it speaks the feature, signed raw requests where
the exact status and body matter."""

from __future__ import annotations

import datetime

import pytest

from conftest import unique_bucket_name
from signed import one_shard_server, request


@pytest.fixture(scope="module")
def env():
    srv = one_shard_server("small-things")
    try:
        s3 = srv.client()
        bucket = unique_bucket_name("small")
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="report.bin", Body=b"0123456789",
                      ContentType="application/x-report", CacheControl="max-age=60")
        yield srv, s3, bucket
    finally:
        srv.close()


def test_response_overrides_replace_the_headers(env):
    srv, s3, bucket = env
    expires = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    got = s3.get_object(Bucket=bucket, Key="report.bin", ResponseContentType="text/plain",
                        ResponseContentDisposition='attachment; filename="r.txt"',
                        ResponseCacheControl="no-store", ResponseContentLanguage="fr",
                        ResponseContentEncoding="identity", ResponseExpires=expires)
    assert got["Body"].read() == b"0123456789"
    h = got["ResponseMetadata"]["HTTPHeaders"]
    assert h["content-type"] == "text/plain"
    assert h["content-disposition"] == 'attachment; filename="r.txt"'
    assert h["cache-control"] == "no-store"  # replaces the stored one
    assert h["content-language"] == "fr"
    assert h["content-encoding"] == "identity"
    assert "2030" in h["expires"]
    # With a range, and on HEAD.
    got = s3.get_object(Bucket=bucket, Key="report.bin", Range="bytes=2-4",
                        ResponseContentType="text/x-part")
    assert got["Body"].read() == b"234" and got["ContentType"] == "text/x-part"
    r = request(srv, "HEAD", f"/{bucket}/report.bin",
                query=[("response-content-type", "text/x-head")])
    assert r.status == 200 and r.headers["content-type"] == "text/x-head"
    # Without overrides, the stored headers.
    got = s3.get_object(Bucket=bucket, Key="report.bin")
    assert got["ContentType"] == "application/x-report"
    assert got["CacheControl"] == "max-age=60"


def test_response_override_with_a_line_break_is_refused(env):
    srv, s3, bucket = env
    r = request(srv, "GET", f"/{bucket}/report.bin",
                query=[("response-content-type", "text/plain\r\nSet-Cookie: x=1")])
    assert (r.status, r.error_code()) == (400, "InvalidArgument"), r.body
    assert "set-cookie" not in r.headers


def test_list_buckets_pages_by_prefix(env):
    srv, s3, bucket = env
    prefix = unique_bucket_name("pg")
    names = sorted(f"{prefix}-{i:02d}" for i in range(7))
    for n in names:
        s3.create_bucket(Bucket=n)
    seen, token, pages = [], None, 0
    while True:
        kw = {"MaxBuckets": 3, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        page = s3.list_buckets(**kw)
        pages += 1
        seen += [b["Name"] for b in page["Buckets"]]
        assert page.get("Prefix") == prefix
        token = page.get("ContinuationToken")
        if not token:
            break
    assert seen == names and pages == 3
    everything = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert set(names) <= set(everything) and bucket in everything
    for bad in (("max-buckets", "0"), ("max-buckets", "10001"), ("max-buckets", "x"),
                ("continuation-token", "%%%")):
        r = request(srv, "GET", "/", query=[bad])
        assert (r.status, r.error_code()) == (400, "InvalidArgument"), (bad, r.body)


@pytest.mark.parametrize("method,target,query,name", [
    ("PUT", "bucket", "encryption", "PutBucketEncryption"),
    ("GET", "bucket", "accelerate", "GetBucketAccelerateConfiguration"),
    ("GET", "bucket", "object-lock", "GetObjectLockConfiguration"),
    ("DELETE", "bucket", "website", "DeleteBucketWebsite"),
    ("GET", "object", "legal-hold", "GetObjectLegalHold"),
    ("PUT", "object", "retention", "PutObjectRetention"),
])
def test_not_implemented_names_the_operation(env, method, target, query, name):
    srv, s3, bucket = env
    path = f"/{bucket}" + ("/report.bin" if target == "object" else "")
    r = request(srv, method, path, query=[(query, "")], body=b"<x/>" if method == "PUT" else b"")
    assert (r.status, r.error_code()) == (501, "NotImplemented"), r.body
    assert f"{name} is not implemented".encode() in r.body, r.body


def test_versions_other_than_null_are_refused(env):
    """In a bucket never versioned the one version of an object is "null".
    A version id percore could not have given is refused, and one that
    names no version deletes nothing, so that deleting an old version can
    never delete the current object (docs/s3.md, "Versioning")."""
    srv, s3, bucket = env
    s3.put_object(Bucket=bucket, Key="v.bin", Body=b"keep me")
    for method in ("GET", "HEAD", "DELETE"):
        r = request(srv, method, f"/{bucket}/v.bin", query=[("versionId", "3HL4kqtJlcpXroDTD")])
        assert r.status == 400, (method, r.body)
        if method != "HEAD":
            assert r.error_code() == "InvalidArgument", r.body
    assert s3.get_object(Bucket=bucket, Key="v.bin")["Body"].read() == b"keep me"
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "v.bin", "VersionId": "3HL4kqtJlcpXroDTD"}]})
    assert [e["Code"] for e in out.get("Errors", [])] == ["InvalidArgument"], out
    # Well formed, naming nothing: deletes nothing, reads nothing.
    s3.delete_object(Bucket=bucket, Key="v.bin", VersionId="0123456789abcdef")
    r = request(srv, "GET", f"/{bucket}/v.bin", query=[("versionId", "0123456789abcdef")])
    assert (r.status, r.error_code()) == (404, "NoSuchVersion"), r.body
    assert s3.get_object(Bucket=bucket, Key="v.bin")["Body"].read() == b"keep me"
    assert s3.get_object(Bucket=bucket, Key="v.bin", VersionId="null")["Body"].read() == b"keep me"
    s3.delete_object(Bucket=bucket, Key="v.bin", VersionId="null")
    with pytest.raises(Exception) as e:
        s3.head_object(Bucket=bucket, Key="v.bin")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def _unsigned_payload(srv, method, path, query, headers, body):
    """A SigV4 request whose body is not covered (UNSIGNED-PAYLOAD)."""
    from urllib.parse import quote
    from conftest import ACCESS_KEY, SECRET_KEY
    from s3wire import Signer, send

    hdrs = {"host": f"127.0.0.1:{srv.s3_port}", "content-length": str(len(body)), **headers}
    signed, _ = Signer(ACCESS_KEY, SECRET_KEY).sign(method, path, hdrs, "UNSIGNED-PAYLOAD",
                                                    query=query)
    target = path + "?" + "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                                   for k, v in query)
    return send("127.0.0.1", srv.s3_port, method, target, signed, body)


def test_delete_objects_body_must_be_covered(env):
    """DeleteObjects names what is deleted in its body: with an unsigned
    payload it needs Content-MD5 or an x-amz-checksum-* header (as S3
    requires), and either is verified."""
    import base64
    import hashlib
    import zlib

    srv, s3, bucket = env
    for k in ("d1", "d2", "d3"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    body = (b'<Delete><Object><Key>d1</Key></Object></Delete>')
    q = [("delete", "")]
    r = _unsigned_payload(srv, "POST", f"/{bucket}", q, {}, body)
    assert r.status == 400 and b"Content-MD5" in r.body, r.body
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    r = _unsigned_payload(srv, "POST", f"/{bucket}", q, {"content-md5": md5},
                          body.replace(b"d1", b"d2"))
    assert r.status == 400 and b"BadDigest" in r.body, r.body
    crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    r = _unsigned_payload(srv, "POST", f"/{bucket}", q, {"x-amz-checksum-crc32": crc},
                          body.replace(b"d1", b"d3"))
    assert r.status == 400 and b"BadDigest" in r.body, r.body
    names = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {"d1", "d2", "d3"} <= names              # nothing was deleted so far
    r = _unsigned_payload(srv, "POST", f"/{bucket}", q, {"content-md5": md5}, body)
    assert r.status == 200, r.body
    r = _unsigned_payload(srv, "POST", f"/{bucket}", q, {"x-amz-checksum-crc32": crc}, body)
    assert r.status == 200, r.body
    names = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "d1" not in names and {"d2", "d3"} <= names


def test_presigned_delete_objects_needs_a_signed_digest(env):
    """A presigned DeleteObjects URL (UNSIGNED-PAYLOAD, Content-MD5 not
    signed): whoever holds it cannot pick the keys by sending another body
    with a matching Content-MD5."""
    import base64
    import hashlib
    import urllib.request

    srv, s3, bucket = env
    s3.put_object(Bucket=bucket, Key="victim", Body=b"v")
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    presign = AWSRequest(method="POST", url=f"http://127.0.0.1:{srv.s3_port}/{bucket}?delete=")
    S3SigV4QueryAuth(Credentials("percore", "percore-secret"), "s3", "us-east-1",
                     expires=300).add_auth(presign)
    url = presign.url
    body = b"<Delete><Object><Key>victim</Key></Object></Delete>"
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()})
    try:
        urllib.request.urlopen(req, timeout=30)
        status = 200
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    assert status == 400 and b"Content-MD5" in text
    assert s3.get_object(Bucket=bucket, Key="victim")["Body"].read() == b"v"


def test_complete_with_an_object_checksum_header(env):
    """x-amz-checksum-* on CompleteMultipartUpload is the object's checksum,
    not the XML body's: it must not be checked against the body."""
    import base64
    import zlib

    srv, s3, bucket = env
    up = s3.create_multipart_upload(Bucket=bucket, Key="mpu-ck")
    part = b"p" * 1000
    etag = s3.upload_part(Bucket=bucket, Key="mpu-ck", UploadId=up["UploadId"], PartNumber=1,
                          Body=part)["ETag"]
    crc = base64.b64encode(zlib.crc32(part).to_bytes(4, "big")).decode()
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mpu-ck", UploadId=up["UploadId"], ChecksumCRC32=crc,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=bucket, Key="mpu-ck")["Body"].read() == part


def test_acls_of_the_single_owner(env):
    """Get*Acl answer the owner's FULL_CONTROL; Put*Acl accept what grants
    no more (private) and refuse wider ACLs with NotImplemented instead of
    ignoring them."""
    from botocore.exceptions import ClientError

    srv, s3, bucket = env
    for acl in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="report.bin")):
        assert acl["Owner"]["ID"] == "percore"
        assert [(g["Grantee"]["ID"], g["Grantee"]["Type"], g["Permission"]) for g in acl["Grants"]] \
            == [("percore", "CanonicalUser", "FULL_CONTROL")]
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    s3.put_object_acl(Bucket=bucket, Key="report.bin", ACL="private")
    s3.put_object_acl(Bucket=bucket, Key="report.bin", ACL="bucket-owner-full-control")
    for call in (lambda: s3.put_object_acl(Bucket=bucket, Key="report.bin", ACL="public-read"),
                 lambda: s3.put_bucket_acl(Bucket=bucket, ACL="public-read-write"),
                 lambda: s3.put_object_acl(Bucket=bucket, Key="report.bin",
                                           GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')):
        with pytest.raises(ClientError) as ei:
            call()
        assert ei.value.response["Error"]["Code"] == "NotImplemented"
    with pytest.raises(ClientError) as ei:
        s3.get_object_acl(Bucket=bucket, Key="no-such-key")
    assert ei.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as ei:
        s3.get_bucket_acl(Bucket=unique_bucket_name("gone"))
    assert ei.value.response["Error"]["Code"] == "NoSuchBucket"
    assert s3.get_object(Bucket=bucket, Key="report.bin")["Body"].read() == b"0123456789"
