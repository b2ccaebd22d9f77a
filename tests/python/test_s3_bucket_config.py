"""Issue 20, items 4-6: object and bucket tagging, CORS and lifecycle.

boto3 and the aws cli drive the S3 calls; CORS preflights are raw,
unsigned `OPTIONS` requests (as a browser sends them). Everything that is
stored is checked again after a kill -9, and the two-shard server checks
that a configuration reaches every shard before its Put is answered."""

from __future__ import annotations

import http.client
import json
import time

import pytest
from botocore.exceptions import ClientError

from conftest import Server, metric, unique_bucket_name
from signed import request

BIG = 3 * 1024 * 1024 + 17  # in extents, not inline


def code_of(call) -> str:
    with pytest.raises(ClientError) as ei:
        call()
    return ei.value.response["Error"]["Code"]


def tags_of(s3, bucket, key) -> dict:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


@pytest.fixture(scope="module")
def srv():
    s = Server(shards=2, name="bucket-config",
               env={"PERCORE_LIFECYCLE_INTERVAL_S": "1", "PERCORE_LIFECYCLE_DAY_S": "1"})
    s.start()
    try:
        yield s
    finally:
        s.close()


def test_object_tags_on_put_get_and_rewrite(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("tags")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="small", Body=b"hello", Tagging="team=vision&stage=raw%20data")
    s3.put_object(Bucket=bucket, Key="big", Body=b"x" * BIG, Tagging="team=audio")
    s3.put_object(Bucket=bucket, Key="none", Body=b"plain")
    assert tags_of(s3, bucket, "small") == {"team": "vision", "stage": "raw data"}
    assert tags_of(s3, bucket, "big") == {"team": "audio"}
    assert tags_of(s3, bucket, "none") == {}
    got = s3.get_object(Bucket=bucket, Key="small")
    assert got["TagCount"] == 2 and got["Body"].read() == b"hello"
    assert "x-amz-tagging" not in got["ResponseMetadata"]["HTTPHeaders"]
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="none")
    # A rewrite keeps the bytes, ETag and Last-Modified.
    for key, body in (("small", b"hello"), ("big", b"x" * BIG)):
        before = s3.head_object(Bucket=bucket, Key=key)
        time.sleep(1.1)
        s3.put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": [
            {"Key": "k1", "Value": "v1"}, {"Key": "k2", "Value": ""}]})
        assert tags_of(s3, bucket, key) == {"k1": "v1", "k2": ""}
        after = s3.head_object(Bucket=bucket, Key=key)
        assert after["ETag"] == before["ETag"]
        assert after["LastModified"] == before["LastModified"]
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
        s3.delete_object_tagging(Bucket=bucket, Key=key)
        assert tags_of(s3, bucket, key) == {}
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    # An overwrite without tags has none.
    s3.put_object(Bucket=bucket, Key="small", Body=b"again", Tagging="a=1")
    s3.put_object(Bucket=bucket, Key="small", Body=b"again")
    assert tags_of(s3, bucket, "small") == {}


def test_object_tags_limits_and_errors(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("taglimits")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    eleven = [{"Key": f"k{i}", "Value": "v"} for i in range(11)]
    assert code_of(lambda: s3.put_object_tagging(Bucket=bucket, Key="k",
                                                 Tagging={"TagSet": eleven})) == "BadRequest"
    assert code_of(lambda: s3.put_object(Bucket=bucket, Key="k2", Body=b"v",
                                         Tagging="&".join(f"k{i}=v" for i in range(11)))) == "BadRequest"
    for bad in ([{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}],
                [{"Key": "aws:reserved", "Value": "1"}],
                [{"Key": "x" * 129, "Value": "1"}],
                [{"Key": "k", "Value": "v" * 257}],
                [{"Key": "k", "Value": "<b>"}]):
        assert code_of(lambda: s3.put_object_tagging(Bucket=bucket, Key="k",
                                                     Tagging={"TagSet": bad})) == "InvalidTag", bad
    assert code_of(lambda: s3.put_object_tagging(Bucket=bucket, Key="missing",
                                                 Tagging={"TagSet": []})) == "NoSuchKey"
    assert code_of(lambda: s3.get_object_tagging(Bucket=bucket, Key="missing")) == "NoSuchKey"
    # Nothing was changed by the refusals; k2 was never written.
    assert tags_of(s3, bucket, "k") == {}
    assert code_of(lambda: s3.head_object(Bucket=bucket, Key="k2")) == "404"
    ten = [{"Key": f"k{i}", "Value": "v"} for i in range(10)]
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": ten})
    assert len(tags_of(s3, bucket, "k")) == 10


def test_tags_through_copy_and_multipart(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("tagcopy")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="src", Body=b"source", Tagging="origin=src")
    s3.copy_object(Bucket=bucket, Key="copied", CopySource={"Bucket": bucket, "Key": "src"})
    assert tags_of(s3, bucket, "copied") == {"origin": "src"}
    s3.copy_object(Bucket=bucket, Key="replaced", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="new=1")
    assert tags_of(s3, bucket, "replaced") == {"new": "1"}
    s3.copy_object(Bucket=bucket, Key="meta-replaced", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"m": "1"})
    assert tags_of(s3, bucket, "meta-replaced") == {"origin": "src"}
    assert code_of(lambda: s3.copy_object(
        Bucket=bucket, Key="bad", CopySource={"Bucket": bucket, "Key": "src"},
        TaggingDirective="MERGE")) in ("InvalidArgument", "InvalidRequest")
    up = s3.create_multipart_upload(Bucket=bucket, Key="mpu", Tagging="from=mpu")
    part = s3.upload_part(Bucket=bucket, Key="mpu", UploadId=up["UploadId"], PartNumber=1,
                          Body=b"p" * 1024)
    s3.complete_multipart_upload(Bucket=bucket, Key="mpu", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert tags_of(s3, bucket, "mpu") == {"from": "mpu"}
    s3.put_object_tagging(Bucket=bucket, Key="mpu", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]})
    assert s3.get_object(Bucket=bucket, Key="mpu")["Body"].read() == b"p" * 1024
    assert s3.head_object(Bucket=bucket, Key="mpu")["ETag"].endswith('-1"')


def test_bucket_tagging(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("btags")
    s3.create_bucket(Bucket=bucket)
    assert code_of(lambda: s3.get_bucket_tagging(Bucket=bucket)) == "NoSuchTagSet"
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [
        {"Key": "cost-center", "Value": "ml-42"}, {"Key": "owner", "Value": "vision team"}]})
    got = s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    assert {t["Key"]: t["Value"] for t in got} == {"cost-center": "ml-42", "owner": "vision team"}
    fifty_one = [{"Key": f"k{i}", "Value": "v"} for i in range(51)]
    assert code_of(lambda: s3.put_bucket_tagging(Bucket=bucket,
                                                 Tagging={"TagSet": fifty_one})) == "BadRequest"
    s3.delete_bucket_tagging(Bucket=bucket)
    assert code_of(lambda: s3.get_bucket_tagging(Bucket=bucket)) == "NoSuchTagSet"
    assert code_of(lambda: s3.get_bucket_tagging(Bucket=unique_bucket_name("nope"))) == "NoSuchBucket"
    assert code_of(lambda: s3.put_bucket_tagging(
        Bucket=unique_bucket_name("nope"), Tagging={"TagSet": []})) == "NoSuchBucket"


CORS = {"CORSRules": [
    {"ID": "app", "AllowedOrigins": ["https://*.example.com"], "AllowedMethods": ["GET", "PUT"],
     "AllowedHeaders": ["x-amz-*", "content-type"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 600},
    {"AllowedOrigins": ["*"], "AllowedMethods": ["GET", "HEAD"]},
]}


def preflight(srv, path, origin, method, headers=None):
    """An unsigned OPTIONS on a new connection, as a browser sends it."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.s3_port, timeout=10)
    try:
        h = {"Origin": origin, "Access-Control-Request-Method": method}
        if headers:
            h["Access-Control-Request-Headers"] = headers
        conn.request("OPTIONS", path, headers=h)
        r = conn.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        conn.close()


def test_cors_configuration_and_preflight(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("cors")
    s3.create_bucket(Bucket=bucket)
    assert code_of(lambda: s3.get_bucket_cors(Bucket=bucket)) == "NoSuchCORSConfiguration"
    status, _, body = preflight(srv, f"/{bucket}/a.txt", "https://app.example.com", "PUT")
    assert status == 403 and b"CORS is not enabled" in body
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=CORS)
    rules = s3.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert rules[0]["AllowedOrigins"] == ["https://*.example.com"]
    assert rules[0]["MaxAgeSeconds"] == 600 and rules[1]["AllowedMethods"] == ["GET", "HEAD"]
    # Every shard answers from the rules at once (new connections spread
    # over both shards' listeners).
    for _ in range(12):
        status, h, _ = preflight(srv, f"/{bucket}/a.txt", "https://app.example.com", "PUT",
                                 "X-Amz-Date, Content-Type")
        assert status == 200, h
        assert h["access-control-allow-origin"] == "https://app.example.com"
        assert h["access-control-allow-methods"] == "GET, PUT"
        assert h["access-control-allow-headers"] == "X-Amz-Date, Content-Type"
        assert h["access-control-expose-headers"] == "ETag"
        assert h["access-control-max-age"] == "600"
        assert h["access-control-allow-credentials"] == "true"
        assert "Origin" in h["vary"]
    status, h, _ = preflight(srv, f"/{bucket}", "https://other.org", "GET")
    assert status == 200 and h["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in h
    for origin, method, hdrs in (("https://other.org", "PUT", None),
                                 ("https://app.example.com", "DELETE", None),
                                 ("https://app.example.com", "PUT", "Authorization"),
                                 ("https://example.com", "PUT", None)):
        status, _, body = preflight(srv, f"/{bucket}/a", origin, method, hdrs)
        assert status == 403 and b"AccessForbidden" in body, (origin, method, hdrs)
    conn = http.client.HTTPConnection("127.0.0.1", srv.s3_port, timeout=10)
    conn.request("OPTIONS", f"/{bucket}/a", headers={"Access-Control-Request-Method": "GET"})
    assert conn.getresponse().status == 400
    conn.close()
    # A missing bucket looks like one without rules (no existence oracle).
    status, _, body = preflight(srv, f"/{unique_bucket_name('none')}/a", "https://x.org", "GET")
    assert status == 403 and b"CORS is not enabled" in body
    # Actual requests with Origin get the headers; without a match, none.
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"cors body")
    r = request(srv, "GET", f"/{bucket}/a.txt", headers={"origin": "https://app.example.com"})
    assert r.status == 200 and r.body == b"cors body"
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert r.headers["access-control-expose-headers"] == "ETag"
    r = request(srv, "DELETE", f"/{bucket}/a.txt", headers={"origin": "https://other.org"})
    assert r.status == 204 and "access-control-allow-origin" not in r.headers
    r = request(srv, "GET", f"/{bucket}/missing", headers={"origin": "https://other.org"})
    assert r.status == 404 and r.headers["access-control-allow-origin"] == "*"
    # Bad configurations are refused and change nothing.
    for bad, want in (({"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]},
                       "InvalidRequest"),
                      ({"CORSRules": [{"AllowedOrigins": ["*.*"], "AllowedMethods": ["GET"]}]},
                       "InvalidRequest")):
        assert code_of(lambda: s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=bad)) == want
    assert len(s3.get_bucket_cors(Bucket=bucket)["CORSRules"]) == 2
    s3.delete_bucket_cors(Bucket=bucket)
    for _ in range(6):
        assert preflight(srv, f"/{bucket}/a.txt", "https://app.example.com", "GET")[0] == 403


def test_configurations_survive_kill9_and_not_a_new_bucket(tmp_path):
    srv = Server(shards=2, name="config-restart")
    srv.start()
    try:
        s3 = srv.client()
        bucket, gone = unique_bucket_name("keep"), unique_bucket_name("gone")
        for b in (bucket, gone):
            s3.create_bucket(Bucket=b)
            s3.put_bucket_tagging(Bucket=b, Tagging={"TagSet": [{"Key": "b", "Value": b}]})
            s3.put_bucket_cors(Bucket=b, CORSConfiguration=CORS)
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
            {"ID": "old", "Filter": {"Prefix": "old/"}, "Status": "Enabled",
             "Expiration": {"Days": 30}}]})
        s3.put_object(Bucket=bucket, Key="obj", Body=b"x" * BIG, Tagging="t=1")
        s3.put_object_tagging(Bucket=bucket, Key="obj", Tagging={"TagSet": [{"Key": "t", "Value": "2"}]})
        s3.delete_bucket(Bucket=gone)
        srv.kill9()
        srv.start()
        s3 = srv.client()
        assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "b", "Value": bucket}]
        assert len(s3.get_bucket_cors(Bucket=bucket)["CORSRules"]) == 2
        rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
        assert rules[0]["ID"] == "old" and rules[0]["Expiration"]["Days"] == 30
        assert tags_of(s3, bucket, "obj") == {"t": "2"}
        assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"x" * BIG
        for _ in range(6):
            assert preflight(srv, f"/{bucket}/obj", "https://app.example.com", "GET")[0] == 200
        # A bucket created again under a deleted one's name starts bare.
        s3.create_bucket(Bucket=gone)
        assert code_of(lambda: s3.get_bucket_tagging(Bucket=gone)) == "NoSuchTagSet"
        assert code_of(lambda: s3.get_bucket_cors(Bucket=gone)) == "NoSuchCORSConfiguration"
        srv.kill9()
        srv.start()
        s3 = srv.client()
        assert code_of(lambda: s3.get_bucket_tagging(Bucket=gone)) == "NoSuchTagSet"
    finally:
        srv.close()


def wait_for(pred, timeout=20.0, step=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def keys_of(s3, bucket) -> set:
    out = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out |= {o["Key"] for o in page.get("Contents", [])}
    return out


def test_lifecycle_expires_and_aborts(srv):
    """Days are one second long on this server (PERCORE_LIFECYCLE_DAY_S=1)
    and the runner passes every second."""
    s3 = srv.client()
    bucket = unique_bucket_name("lifecycle")
    s3.create_bucket(Bucket=bucket)
    assert code_of(lambda: s3.get_bucket_lifecycle_configuration(Bucket=bucket)) \
        == "NoSuchLifecycleConfiguration"
    expired0 = metric(srv, "percore_lifecycle_expired_objects_total", 0)
    for i in range(40):
        s3.put_object(Bucket=bucket, Key=f"tmp/{i:03}", Body=b"t" * (i + 1))
    s3.put_object(Bucket=bucket, Key="keep/a", Body=b"k")
    s3.put_object(Bucket=bucket, Key="tagged/yes", Body=b"y", Tagging="expire=yes&x=1")
    s3.put_object(Bucket=bucket, Key="tagged/no", Body=b"n", Tagging="expire=no")
    s3.put_object(Bucket=bucket, Key="sized/small", Body=b"s")
    s3.put_object(Bucket=bucket, Key="sized/large", Body=b"L" * 5000)
    s3.put_object(Bucket=bucket, Key="disabled/a", Body=b"d")
    up = s3.create_multipart_upload(Bucket=bucket, Key="uploads/stale")["UploadId"]
    kept_up = s3.create_multipart_upload(Bucket=bucket, Key="keep/upload")["UploadId"]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "tmp", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled", "Expiration": {"Days": 2}},
        {"ID": "tagged", "Filter": {"And": {"Prefix": "tagged/", "Tags": [{"Key": "expire", "Value": "yes"}]}},
         "Status": "Enabled", "Expiration": {"Days": 1}},
        {"ID": "sized", "Filter": {"And": {"Prefix": "sized/", "ObjectSizeGreaterThan": 100}},
         "Status": "Enabled", "Expiration": {"Days": 1}},
        {"ID": "off", "Filter": {"Prefix": "disabled/"}, "Status": "Disabled",
         "Expiration": {"Date": "2020-01-01T00:00:00Z"}},
        {"ID": "uploads", "Filter": {"Prefix": "uploads/"}, "Status": "Enabled",
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}},
    ]})
    rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [r["ID"] for r in rules] == ["tmp", "tagged", "sized", "off", "uploads"]
    assert rules[1]["Filter"]["And"]["Tags"] == [{"Key": "expire", "Value": "yes"}]
    assert rules[3]["Status"] == "Disabled"
    want = {"keep/a", "tagged/no", "sized/small", "disabled/a"}
    assert wait_for(lambda: keys_of(s3, bucket) == want), sorted(keys_of(s3, bucket))
    uploads = lambda: {u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}
    assert wait_for(lambda: uploads() == {"keep/upload"}), uploads()
    assert code_of(lambda: s3.list_parts(Bucket=bucket, Key="uploads/stale", UploadId=up)) == "NoSuchUpload"
    s3.abort_multipart_upload(Bucket=bucket, Key="keep/upload", UploadId=kept_up)
    assert metric(srv, "percore_lifecycle_expired_objects_total") - expired0 == 40 + 2
    # A new object under an expiring prefix lives its days first.
    s3.put_object(Bucket=bucket, Key="tmp/new", Body=b"n")
    assert "tmp/new" in keys_of(s3, bucket)
    assert wait_for(lambda: "tmp/new" not in keys_of(s3, bucket))
    s3.delete_bucket_lifecycle(Bucket=bucket)
    assert code_of(lambda: s3.get_bucket_lifecycle_configuration(Bucket=bucket)) \
        == "NoSuchLifecycleConfiguration"
    s3.put_object(Bucket=bucket, Key="tmp/after", Body=b"a")
    # Two more passes on each shard (the runner is alive), and it stays.
    passes = metric(srv, "percore_lifecycle_passes_total")
    assert wait_for(lambda: metric(srv, "percore_lifecycle_passes_total") >= passes + 2 * srv.shards + 2)
    assert "tmp/after" in keys_of(s3, bucket)


def test_lifecycle_bad_configurations(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("lcbad")
    s3.create_bucket(Bucket=bucket)

    def put(rules):
        return code_of(lambda: s3.put_bucket_lifecycle_configuration(
            Bucket=bucket, LifecycleConfiguration={"Rules": rules}))

    assert put([{"ID": "t", "Filter": {"Prefix": ""}, "Status": "Enabled",
                 "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}]) == "NotImplemented"
    assert put([{"ID": "d", "Filter": {"Prefix": ""}, "Status": "Enabled",
                 "Expiration": {"Days": 0}}]) == "InvalidArgument"
    assert put([{"ID": "x", "Filter": {"Prefix": ""}, "Status": "Enabled",
                 "Expiration": {"Date": "2030-01-01T12:00:00Z"}}]) == "InvalidArgument"
    assert put([{"ID": "a", "Filter": {"Prefix": ""}, "Status": "Enabled", "Expiration": {"Days": 1}},
                {"ID": "a", "Filter": {"Prefix": "p"}, "Status": "Enabled", "Expiration": {"Days": 1}}]) \
        == "InvalidArgument"
    assert put([{"ID": "m", "Filter": {"Tag": {"Key": "k", "Value": "v"}}, "Status": "Enabled",
                 "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]) == "InvalidRequest"
    assert code_of(lambda: s3.get_bucket_lifecycle_configuration(Bucket=bucket)) \
        == "NoSuchLifecycleConfiguration"


def test_aws_cli_tagging_cors_lifecycle(srv, tmp_path):
    from conftest import AwsCli
    aws = AwsCli(srv.endpoint, tmp_path / "aws")
    bucket = unique_bucket_name("cli")
    aws.s3api("create-bucket", "--bucket", bucket)
    src = tmp_path / "f.bin"
    src.write_bytes(b"cli body")
    aws.s3api("put-object", "--bucket", bucket, "--key", "f", "--body", str(src),
              "--tagging", "team=cli")
    assert aws.s3api("get-object-tagging", "--bucket", bucket, "--key", "f")["TagSet"] == \
        [{"Key": "team", "Value": "cli"}]
    aws.s3api("put-object-tagging", "--bucket", bucket, "--key", "f",
              "--tagging", json.dumps({"TagSet": [{"Key": "a", "Value": "b"}]}))
    assert aws.s3api("get-object-tagging", "--bucket", bucket, "--key", "f")["TagSet"] == \
        [{"Key": "a", "Value": "b"}]
    aws.s3api("put-bucket-tagging", "--bucket", bucket,
              "--tagging", json.dumps({"TagSet": [{"Key": "env", "Value": "ci"}]}))
    assert aws.s3api("get-bucket-tagging", "--bucket", bucket)["TagSet"] == [{"Key": "env", "Value": "ci"}]
    aws.s3api("put-bucket-cors", "--bucket", bucket, "--cors-configuration", json.dumps(CORS))
    assert len(aws.s3api("get-bucket-cors", "--bucket", bucket)["CORSRules"]) == 2
    aws.s3api("put-bucket-lifecycle-configuration", "--bucket", bucket,
              "--lifecycle-configuration", json.dumps({"Rules": [
                  {"ID": "ckpt", "Filter": {"Prefix": "ckpt/"}, "Status": "Enabled",
                   "Expiration": {"Days": 7}}]}))
    got = aws.s3api("get-bucket-lifecycle-configuration", "--bucket", bucket)["Rules"]
    assert got[0]["ID"] == "ckpt" and got[0]["Expiration"]["Days"] == 7
    for what in ("bucket-tagging", "bucket-cors", "bucket-lifecycle"):
        aws.s3api(f"delete-{what}", "--bucket", bucket)
    assert "NoSuchTagSet" in aws.fail("s3api", "get-bucket-tagging", "--bucket", bucket)


def test_lifecycle_judges_the_version_it_deletes():
    """A paced pass (1 delete per second) lists its keys once per page; an
    object rewritten during the pass so that the rule no longer matches
    (here: smaller than the rule's size floor) must survive it."""
    srv = Server(shards=1, name="lifecycle-race",
                 env={"PERCORE_LIFECYCLE_INTERVAL_S": "1", "PERCORE_LIFECYCLE_ACTIONS_PER_SEC": "1"})
    srv.start()
    try:
        s3 = srv.client()
        bucket = unique_bucket_name("lcrace")
        s3.create_bucket(Bucket=bucket)
        for i in range(8):
            s3.put_object(Bucket=bucket, Key=f"big/{i}", Body=b"B" * 500)
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
            {"ID": "big", "Filter": {"And": {"Prefix": "big/", "ObjectSizeGreaterThan": 100}},
             "Status": "Enabled", "Expiration": {"Date": "2020-01-01T00:00:00Z"}}]})
        # The pass has begun once the first object is gone; rewrite the
        # last one small while it works through the others.
        assert wait_for(lambda: "big/0" not in keys_of(s3, bucket))
        s3.put_object(Bucket=bucket, Key="big/7", Body=b"small")
        assert wait_for(lambda: keys_of(s3, bucket) == {"big/7"}, timeout=30), keys_of(s3, bucket)
        passes = metric(srv, "percore_lifecycle_passes_total")
        assert wait_for(lambda: metric(srv, "percore_lifecycle_passes_total") >= passes + 2)
        assert s3.get_object(Bucket=bucket, Key="big/7")["Body"].read() == b"small"
    finally:
        srv.close()
