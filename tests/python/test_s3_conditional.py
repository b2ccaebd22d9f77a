"""Conditional GET and HEAD (RFC 7232 as S3 applies it): If-Match,
If-None-Match, If-Modified-Since and If-Unmodified-Since, each alone (304,
412 and pass-through), their precedence when combined, and with Range.

One shard: the conditions are evaluated on the object's metadata and do
not depend on the shard count."""

from __future__ import annotations

import email.utils
import hashlib

import pytest

from conftest import unique_bucket_name
from signed import one_shard_server, request

BODY = b"conditional body " * 64
ETAG = '"' + hashlib.md5(BODY).hexdigest() + '"'
OTHER = '"' + "0" * 32 + '"'
DAY = 86400


@pytest.fixture(scope="module")
def obj():
    srv = one_shard_server("conditional")
    try:
        bucket = unique_bucket_name("cond")
        s3 = srv.client()
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="k", Body=BODY)
        head = request(srv, "HEAD", f"/{bucket}/k")
        assert head.status == 200 and head.headers["etag"] == ETAG, head.headers
        lm = email.utils.parsedate_to_datetime(head.headers["last-modified"]).timestamp()
        yield srv, f"/{bucket}/k", int(lm)
    finally:
        srv.close()


def date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def check(obj, method: str, headers: dict, want: int, rng: str | None = None):
    srv, path, _ = obj
    if rng:
        headers = {**headers, "range": rng}
    r = request(srv, method, path, headers)
    assert r.status == want, (method, headers, r.status, r.body[:300])
    if want == 304:
        # A 304 carries the validators and no body.
        assert r.body == b""
        assert r.headers.get("etag") == ETAG
        assert "last-modified" in r.headers
    elif want == 412:
        if method == "GET":
            assert r.error_code() == "PreconditionFailed", r.body
        else:
            assert r.body == b""
    elif want == 200:
        assert r.headers.get("etag") == ETAG
        assert r.body == (BODY if method == "GET" else b"")
        if method == "HEAD":
            assert int(r.headers["content-length"]) == len(BODY)
    return r


METHODS = ["GET", "HEAD"]


@pytest.mark.parametrize("method", METHODS)
def test_if_match(obj, method):
    check(obj, method, {"if-match": ETAG}, 200)
    check(obj, method, {"if-match": "*"}, 200)
    check(obj, method, {"if-match": f"{OTHER}, {ETAG}"}, 200)
    check(obj, method, {"if-match": OTHER}, 412)
    check(obj, method, {"if-match": ETAG.strip('"')[:-1]}, 412)


@pytest.mark.parametrize("method", METHODS)
def test_if_none_match(obj, method):
    check(obj, method, {"if-none-match": ETAG}, 304)
    check(obj, method, {"if-none-match": "*"}, 304)
    check(obj, method, {"if-none-match": f"{OTHER}, {ETAG}"}, 304)
    check(obj, method, {"if-none-match": OTHER}, 200)


@pytest.mark.parametrize("method", METHODS)
def test_if_modified_since(obj, method):
    lm = obj[2]
    check(obj, method, {"if-modified-since": date(lm + DAY)}, 304)
    # Same second as Last-Modified: not modified since then.
    check(obj, method, {"if-modified-since": date(lm)}, 304)
    check(obj, method, {"if-modified-since": date(lm - DAY)}, 200)
    check(obj, method, {"if-modified-since": date(lm - 1)}, 200)
    # An unparseable date is ignored (RFC 7232 3.3).
    check(obj, method, {"if-modified-since": "not a date"}, 200)


@pytest.mark.parametrize("method", METHODS)
def test_if_unmodified_since(obj, method):
    lm = obj[2]
    check(obj, method, {"if-unmodified-since": date(lm - DAY)}, 412)
    check(obj, method, {"if-unmodified-since": date(lm - 1)}, 412)
    check(obj, method, {"if-unmodified-since": date(lm)}, 200)
    check(obj, method, {"if-unmodified-since": date(lm + DAY)}, 200)


@pytest.mark.parametrize("method", METHODS)
def test_precedence(obj, method):
    lm = obj[2]
    # If-Match true wins over a false If-Unmodified-Since (S3 and RFC 7232 6).
    check(obj, method, {"if-match": ETAG, "if-unmodified-since": date(lm - DAY)}, 200)
    # If-Match false fails even with a true If-Unmodified-Since.
    check(obj, method, {"if-match": OTHER, "if-unmodified-since": date(lm + DAY)}, 412)
    # If-None-Match false (the ETag matches) + If-Modified-Since true: 304.
    check(obj, method, {"if-none-match": ETAG, "if-modified-since": date(lm - DAY)}, 304)
    # If-None-Match true: If-Modified-Since is not evaluated (RFC 7232 3.3).
    check(obj, method, {"if-none-match": OTHER, "if-modified-since": date(lm + DAY)}, 200)
    # 412 is decided before 304.
    check(obj, method, {"if-match": OTHER, "if-none-match": ETAG}, 412)
    check(obj, method, {"if-unmodified-since": date(lm - DAY),
                        "if-modified-since": date(lm + DAY)}, 412)
    # Both true: the object.
    check(obj, method, {"if-match": ETAG, "if-none-match": OTHER,
                        "if-modified-since": date(lm - DAY),
                        "if-unmodified-since": date(lm + DAY)}, 200)


def test_conditions_come_before_range(obj):
    lm = obj[2]
    check(obj, "GET", {"if-none-match": ETAG}, 304, rng="bytes=0-9")
    check(obj, "GET", {"if-match": OTHER}, 412, rng="bytes=0-9")
    check(obj, "GET", {"if-unmodified-since": date(lm - DAY)}, 412, rng="bytes=5000000-")
    r = check(obj, "GET", {"if-match": ETAG}, 206, rng="bytes=0-9")
    assert r.body == BODY[:10]
    assert r.headers["content-range"] == f"bytes 0-9/{len(BODY)}"
    r = check(obj, "GET", {"if-modified-since": date(lm - DAY)}, 206, rng="bytes=-5")
    assert r.body == BODY[-5:]


def test_boto3_sees_304_and_412(obj):
    from botocore.exceptions import ClientError
    srv, path, lm = obj
    bucket = path.split("/")[1]
    s3 = srv.client()
    for kw, code in [({"IfNoneMatch": ETAG}, "304"), ({"IfMatch": OTHER}, "412"),
                     ({"IfModifiedSince": lm + DAY}, "304"),
                     ({"IfUnmodifiedSince": lm - DAY}, "412")]:
        for op in (s3.get_object, s3.head_object):
            with pytest.raises(ClientError) as e:
                op(Bucket=bucket, Key="k", **kw)
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == int(code), kw
    got = s3.get_object(Bucket=bucket, Key="k", IfMatch=ETAG, IfModifiedSince=lm - DAY)
    assert got["Body"].read() == BODY
