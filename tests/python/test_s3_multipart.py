"""Multipart uploads, CopyObject, UploadPartCopy, DeleteObjects and
ListObjectVersions through boto3 against servers with 1, 2 and 4 shards."""

import hashlib
import os
import re

import pytest

from test_s3_basic import MiB, etag, md5, s3_error, spread_keys, status_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PART = 5 * MiB


def multipart_etag(parts: list[bytes]) -> str:
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def upload(s3, bucket, key, parts: list[bytes], **create_args):
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, **create_args)
    uid = up["UploadId"]
    assert re.fullmatch(r"[0-9a-f]{32}", uid), uid
    done = []
    for i, body in enumerate(parts, start=1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i, Body=body)
        assert r["ETag"] == etag(body)
        done.append({"PartNumber": i, "ETag": r["ETag"]})
    return uid, done


def test_multipart_round_trip_with_metadata(s3, bucket):
    parts = [os.urandom(PART), os.urandom(PART + 4321), b"tail bytes"]
    uid, done = upload(s3, bucket, "dir/big.bin", parts, ContentType="text/csv",
                       Metadata={"origin": "unit"}, CacheControl="no-cache")
    # The upload is listed, its object is not (yet).
    ups = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("dir/big.bin", uid)]
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    with s3_error("404", 404):
        s3.head_object(Bucket=bucket, Key="dir/big.bin")
    listed = s3.list_parts(Bucket=bucket, Key="dir/big.bin", UploadId=uid)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (i + 1, len(b), etag(b)) for i, b in enumerate(parts)]
    r = s3.complete_multipart_upload(Bucket=bucket, Key="dir/big.bin", UploadId=uid,
                                     MultipartUpload={"Parts": done})
    assert r["ETag"] == multipart_etag(parts)
    whole = b"".join(parts)
    got = s3.get_object(Bucket=bucket, Key="dir/big.bin")
    body = got["Body"].read()
    assert md5(body) == md5(whole)
    assert got["ETag"] == multipart_etag(parts)
    assert got["ContentType"] == "text/csv"
    assert got["Metadata"] == {"origin": "unit"}
    assert got["CacheControl"] == "no-cache"
    # Ranges across the part boundaries.
    for a, b in [(PART - 10, PART + 10), (2 * PART + 4321 - 3, len(whole) - 1), (0, 0)]:
        rng = s3.get_object(Bucket=bucket, Key="dir/big.bin", Range=f"bytes={a}-{b}")
        assert rng["Body"].read() == whole[a:b + 1]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with s3_error("NoSuchUpload", 404):
        s3.list_parts(Bucket=bucket, Key="dir/big.bin", UploadId=uid)
    keys = [c["Key"] for c in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["dir/big.bin"]


def test_complete_validation(s3, bucket):
    small = [b"a" * 1000, b"b" * 1000]
    uid, done = upload(s3, bucket, "k", small)
    with s3_error("EntityTooSmall", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": done})
    with s3_error("InvalidPartOrder", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": done[::-1]})
    with s3_error("InvalidPart", 400):
        s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag(b"other")}]})
    with s3_error("InvalidPart", 400):
        s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 7, "ETag": done[0]["ETag"]}]})
    with s3_error("NoSuchUpload", 404):
        s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId="0" * 32, MultipartUpload={"Parts": done[:1]})
    with s3_error("NoSuchUpload", 404):
        s3.upload_part(Bucket=bucket, Key="k", UploadId="not-an-id", PartNumber=1, Body=b"x")
    with s3_error("InvalidArgument", 400):
        s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=10001, Body=b"x")
    # None of that ended the upload: a single (last) small part completes.
    r = s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": done[:1]})
    assert r["ETag"] == multipart_etag(small[:1])
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == small[0]


def test_part_reupload_replaces_and_parts_paginate(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="p")
    uid = up["UploadId"]
    for n in range(1, 8):
        s3.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=n, Body=b"old%d" % n)
    s3.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=3, Body=b"new3")
    seen, marker = [], 0
    while True:
        page = s3.list_parts(Bucket=bucket, Key="p", UploadId=uid, MaxParts=3,
                             PartNumberMarker=marker)
        seen += [(p["PartNumber"], p["ETag"]) for p in page["Parts"]]
        if not page["IsTruncated"]:
            break
        marker = page["NextPartNumberMarker"]
    assert [n for n, _ in seen] == list(range(1, 8))
    assert dict(seen)[3] == etag(b"new3")
    s3.abort_multipart_upload(Bucket=bucket, Key="p", UploadId=uid)
    with s3_error("NoSuchUpload", 404):
        s3.abort_multipart_upload(Bucket=bucket, Key="p", UploadId=uid)
    with s3_error("NoSuchUpload", 404):
        s3.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=1, Body=b"late")
    with s3_error("404", 404):
        s3.head_object(Bucket=bucket, Key="p")


def test_list_multipart_uploads_across_shards(s3, bucket):
    keys = spread_keys(12, prefix="up/")
    ids = {}
    for k in keys:
        ids[k] = s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]
    extra = s3.create_multipart_upload(Bucket=bucket, Key=keys[0])["UploadId"]
    s3.create_multipart_upload(Bucket=bucket, Key="other/x")
    expect = sorted([(k, v) for k, v in ids.items()] + [(keys[0], extra)])
    got, km, im = [], None, None
    while True:
        args = dict(Bucket=bucket, Prefix="up/", MaxUploads=5)
        if km is not None:
            args.update(KeyMarker=km, UploadIdMarker=im)
        page = s3.list_multipart_uploads(**args)
        got += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        if not page["IsTruncated"]:
            break
        km, im = page["NextKeyMarker"], page["NextUploadIdMarker"]
    assert got == expect
    page = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["other/", "up/"]
    assert page.get("Uploads", []) == []
    # An object keeps the bucket from being deleted (uploads alone do not:
    # test_delete_bucket_discards_its_multipart_uploads).
    s3.put_object(Bucket=bucket, Key="an-object", Body=b"x")
    with s3_error("BucketNotEmpty", 409):
        s3.delete_bucket(Bucket=bucket)
    assert len(s3.list_multipart_uploads(Bucket=bucket)["Uploads"]) == len(expect) + 1


def test_upload_part_copy_with_ranges(s3, bucket):
    src = os.urandom(7 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    r1 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bucket, "Key": "src"},
                             CopySourceRange=f"bytes=0-{PART - 1}")
    r2 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "src"},
                             CopySourceRange=f"bytes=100-{100 + 999}")
    assert r1["CopyPartResult"]["ETag"] == etag(src[:PART])
    assert r2["CopyPartResult"]["ETag"] == etag(src[100:1100])
    with s3_error("InvalidRange", 416):
        s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=3,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange=f"bytes=0-{len(src)}")
    s3.complete_multipart_upload(
        Bucket=bucket, Key="dst", UploadId=uid,
        MultipartUpload={"Parts": [
            {"PartNumber": 1, "ETag": r1["CopyPartResult"]["ETag"]},
            {"PartNumber": 2, "ETag": r2["CopyPartResult"]["ETag"]}]})
    got = s3.get_object(Bucket=bucket, Key="dst")["Body"].read()
    assert md5(got) == md5(src[:PART] + src[100:1100])


def test_copy_object_metadata_and_conditions(s3, bucket):
    body = os.urandom(3 * MiB + 17)
    s3.put_object(Bucket=bucket, Key="a", Body=body, ContentType="image/png",
                  Metadata={"m": "1"})
    r = s3.copy_object(Bucket=bucket, Key="b/c", CopySource={"Bucket": bucket, "Key": "a"})
    assert r["CopyObjectResult"]["ETag"] == etag(body)
    got = s3.get_object(Bucket=bucket, Key="b/c")
    assert got["Body"].read() == body
    assert got["ContentType"] == "image/png" and got["Metadata"] == {"m": "1"}
    s3.copy_object(Bucket=bucket, Key="d", CopySource=f"{bucket}/a",
                   MetadataDirective="REPLACE", ContentType="text/plain",
                   Metadata={"n": "2"})
    head = s3.head_object(Bucket=bucket, Key="d")
    assert head["ContentType"] == "text/plain" and head["Metadata"] == {"n": "2"}
    # To itself: only with REPLACE.
    with s3_error("InvalidRequest", 400):
        s3.copy_object(Bucket=bucket, Key="a", CopySource={"Bucket": bucket, "Key": "a"})
    s3.copy_object(Bucket=bucket, Key="a", CopySource={"Bucket": bucket, "Key": "a"},
                   MetadataDirective="REPLACE", Metadata={"m": "3"})
    assert s3.head_object(Bucket=bucket, Key="a")["Metadata"] == {"m": "3"}
    with s3_error("PreconditionFailed", 412):
        s3.copy_object(Bucket=bucket, Key="e", CopySource={"Bucket": bucket, "Key": "a"},
                       CopySourceIfMatch='"0123"')
    with s3_error("PreconditionFailed", 412):
        s3.copy_object(Bucket=bucket, Key="e", CopySource={"Bucket": bucket, "Key": "a"},
                       CopySourceIfNoneMatch=etag(body))
    s3.copy_object(Bucket=bucket, Key="e", CopySource={"Bucket": bucket, "Key": "a"},
                   CopySourceIfMatch=etag(body))
    with s3_error("NoSuchKey", 404):
        s3.copy_object(Bucket=bucket, Key="f", CopySource={"Bucket": bucket, "Key": "nope"})
    with s3_error("NoSuchBucket", 404):
        s3.copy_object(Bucket=bucket, Key="f", CopySource={"Bucket": "no-such-bkt", "Key": "a"})


def test_copy_of_a_multipart_object(s3, bucket):
    parts = [os.urandom(PART), os.urandom(1000)]
    uid, done = upload(s3, bucket, "mp", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid,
                                 MultipartUpload={"Parts": done})
    r = s3.copy_object(Bucket=bucket, Key="mp-copy", CopySource={"Bucket": bucket, "Key": "mp"})
    whole = b"".join(parts)
    assert r["CopyObjectResult"]["ETag"] == etag(whole)
    assert md5(s3.get_object(Bucket=bucket, Key="mp-copy")["Body"].read()) == md5(whole)


def test_get_and_head_by_part_number(s3, bucket, server):
    """GET/HEAD `partNumber` of a multipart object: that part's bytes, as a
    206 with its Content-Range and `x-amz-mp-parts-count`; an object not
    uploaded in parts is its own part 1; a copy is not in parts."""
    from signed import request
    parts = [os.urandom(PART), os.urandom(PART), os.urandom(1234)]
    uid, done = upload(s3, bucket, "parts.bin", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="parts.bin", UploadId=uid,
                                 MultipartUpload={"Parts": done})
    offset = 0
    for n, body in enumerate(parts, start=1):
        got = s3.get_object(Bucket=bucket, Key="parts.bin", PartNumber=n)
        assert status_of(got) == 206 and got["PartsCount"] == 3
        assert got["ContentRange"] == f"bytes {offset}-{offset + len(body) - 1}/{PART * 2 + 1234}"
        assert md5(got["Body"].read()) == md5(body)
        head = s3.head_object(Bucket=bucket, Key="parts.bin", PartNumber=n)
        assert head["ContentLength"] == len(body) and head["PartsCount"] == 3
        offset += len(body)
    # percore keeps its part sizes to itself.
    assert not any(h.startswith("x-percore") for h in
                   s3.head_object(Bucket=bucket, Key="parts.bin")["ResponseMetadata"]["HTTPHeaders"])
    with s3_error("InvalidPartNumber", 416):
        s3.get_object(Bucket=bucket, Key="parts.bin", PartNumber=4)
    for bad in ("0", "10001", "x"):
        r = request(server, "GET", f"/{bucket}/parts.bin", query=[("partNumber", bad)])
        assert (r.status, r.error_code()) == (400, "InvalidArgument"), (bad, r.body)
    r = request(server, "GET", f"/{bucket}/parts.bin", headers={"range": "bytes=0-1"},
                query=[("partNumber", "1")])
    assert (r.status, r.error_code()) == (400, "InvalidRequest"), r.body
    # One PUT: part 1 is the whole object.
    s3.put_object(Bucket=bucket, Key="one.bin", Body=b"single")
    got = s3.get_object(Bucket=bucket, Key="one.bin", PartNumber=1)
    assert got["Body"].read() == b"single" and "PartsCount" not in got
    with s3_error("InvalidPartNumber", 416):
        s3.get_object(Bucket=bucket, Key="one.bin", PartNumber=2)
    # A copy is one object: its parts are not the source's.
    s3.copy_object(Bucket=bucket, Key="copy.bin", CopySource={"Bucket": bucket, "Key": "parts.bin"})
    with s3_error("InvalidPartNumber", 416):
        s3.get_object(Bucket=bucket, Key="copy.bin", PartNumber=2)


def test_delete_objects_batch_and_quiet(s3, bucket):
    keys = spread_keys(40, prefix="del/")
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    r = s3.delete_objects(Bucket=bucket, Delete={
        "Objects": [{"Key": k} for k in keys[:30]] + [{"Key": "never-existed"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == sorted(keys[:30] + ["never-existed"])
    assert r.get("Errors", []) == []
    r = s3.delete_objects(Bucket=bucket, Delete={
        "Objects": [{"Key": k} for k in keys[30:]], "Quiet": True})
    assert r.get("Deleted", []) == [] and r.get("Errors", []) == []
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    with s3_error("MalformedXML", 400):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"k{i}"} for i in range(1001)]})


def test_list_object_versions_unversioned(s3, bucket):
    keys = spread_keys(9, prefix="v/")
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    got, km = [], None
    while True:
        args = dict(Bucket=bucket, MaxKeys=4)
        if km:
            args.update(KeyMarker=km, VersionIdMarker="null")
        page = s3.list_object_versions(**args)
        for v in page.get("Versions", []):
            assert v["VersionId"] == "null" and v["IsLatest"] is True
            got.append(v["Key"])
        if not page["IsTruncated"]:
            break
        km = page["NextKeyMarker"]
    assert got == sorted(keys)
    # Never versioned: GetBucketVersioning answers with no Status.
    v = s3.get_bucket_versioning(Bucket=bucket)
    assert status_of(v) == 200 and "Status" not in v


def test_multipart_survives_restart(server_factory, shards):
    srv = server_factory(shards=shards)
    s3 = srv.client()
    s3.create_bucket(Bucket="mp-restart")
    parts = [os.urandom(PART), os.urandom(2 * MiB)]
    uid, done = upload(s3, "mp-restart", "obj", parts)
    # An upload left in progress and one completed, across a restart.
    pending_uid, _ = upload(s3, "mp-restart", "pending", [b"p1"])
    s3.complete_multipart_upload(Bucket="mp-restart", Key="obj", UploadId=uid,
                                 MultipartUpload={"Parts": done})
    srv.kill9()
    srv.restart()
    s3 = srv.client()
    assert md5(s3.get_object(Bucket="mp-restart", Key="obj")["Body"].read()) == \
        md5(b"".join(parts))
    ups = s3.list_multipart_uploads(Bucket="mp-restart")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("pending", pending_uid)]
    parts_listed = s3.list_parts(Bucket="mp-restart", Key="pending", UploadId=pending_uid)["Parts"]
    assert [p["ETag"] for p in parts_listed] == [etag(b"p1")]
    s3.abort_multipart_upload(Bucket="mp-restart", Key="pending", UploadId=pending_uid)
    srv.restart()
    s3 = srv.client()
    assert s3.list_multipart_uploads(Bucket="mp-restart").get("Uploads", []) == []


def test_list_uploads_with_delimiter_never_hides_uploads(s3, bucket):
    """A shard that fills its page must not let a folded prefix hide what
    sorts after it (a page ends at the least key a full shard reached)."""
    for i in range(5):
        s3.create_multipart_upload(Bucket=bucket, Key=f"logs/{i}")
    z = s3.create_multipart_upload(Bucket=bucket, Key="z.bin")["UploadId"]
    seen_uploads, seen_prefixes, km, im = [], [], None, None
    for _ in range(20):
        args = dict(Bucket=bucket, Delimiter="/", MaxUploads=2)
        if km is not None:
            args.update(KeyMarker=km, UploadIdMarker=im or "")
        page = s3.list_multipart_uploads(**args)
        seen_uploads += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        seen_prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if not page["IsTruncated"]:
            break
        km, im = page["NextKeyMarker"], page.get("NextUploadIdMarker")
    assert seen_uploads == [("z.bin", z)]
    assert seen_prefixes == ["logs/"]


# ---------------------------------------------------------------------------
# Issue 15: DeleteBucket with uploads in progress, retried completions
# ---------------------------------------------------------------------------

def test_delete_bucket_discards_its_multipart_uploads(server_factory, shards):
    """S3 deletes a bucket whose only contents are unfinished uploads, and
    the uploads go with it: a bucket created again under that name has
    none, before and after restarts."""
    srv = server_factory(shards=shards)
    s3 = srv.client()
    name = "mpu-gone"
    s3.create_bucket(Bucket=name)
    ups = {}
    for k in spread_keys(8, prefix="u/"):  # on every shard
        ups[k] = upload(s3, name, k, [b"part of " + k.encode()])
    s3.put_object(Bucket=name, Key="obj", Body=b"x")
    with s3_error("BucketNotEmpty", 409):
        s3.delete_bucket(Bucket=name)
    assert len(s3.list_multipart_uploads(Bucket=name)["Uploads"]) == len(ups)
    s3.delete_object(Bucket=name, Key="obj")
    assert status_of(s3.delete_bucket(Bucket=name)) == 204
    with s3_error("404", 404):
        s3.head_bucket(Bucket=name)
    with s3_error("NoSuchBucket", 404):
        s3.list_multipart_uploads(Bucket=name)
    s3.create_bucket(Bucket=name)

    def nothing_left(s3):
        assert s3.list_multipart_uploads(Bucket=name).get("Uploads", []) == []
        for k, (uid, done) in ups.items():
            with s3_error("NoSuchUpload", 404):
                s3.upload_part(Bucket=name, Key=k, UploadId=uid, PartNumber=2, Body=b"late")
            with s3_error("NoSuchUpload", 404):
                s3.list_parts(Bucket=name, Key=k, UploadId=uid)
            with s3_error("NoSuchUpload", 404):
                s3.complete_multipart_upload(Bucket=name, Key=k, UploadId=uid,
                                             MultipartUpload={"Parts": done})
        assert s3.list_objects_v2(Bucket=name)["KeyCount"] == 0

    nothing_left(s3)
    srv.kill9()
    srv.restart()
    nothing_left(srv.client())
    srv.restart()
    nothing_left(srv.client())


def test_retried_complete_multipart_upload_answers_the_same_etag(s3, bucket):
    """SDKs retry CompleteMultipartUpload after a timeout: the retry of a
    completed upload answers 200 with the same ETag while the key still
    holds what it wrote; another part list, or a key written since, is
    NoSuchUpload. Abort, ListParts and UploadPart of a completed upload are
    NoSuchUpload and leave the object alone (as S3)."""
    parts = [os.urandom(PART), b"tail bytes"]
    uid, done = upload(s3, bucket, "r/obj", parts)
    first = s3.complete_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid,
                                         MultipartUpload={"Parts": done})
    assert first["ETag"] == multipart_etag(parts)
    again = s3.complete_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid,
                                         MultipartUpload={"Parts": done})
    assert status_of(again) == 200 and again["ETag"] == first["ETag"]
    with s3_error("NoSuchUpload", 404):
        s3.complete_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid,
                                     MultipartUpload={"Parts": done[1:]})
    with s3_error("NoSuchUpload", 404):
        s3.abort_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid)
    with s3_error("NoSuchUpload", 404):
        s3.list_parts(Bucket=bucket, Key="r/obj", UploadId=uid)
    with s3_error("NoSuchUpload", 404):
        s3.upload_part(Bucket=bucket, Key="r/obj", UploadId=uid, PartNumber=3, Body=b"late")
    got = s3.get_object(Bucket=bucket, Key="r/obj")
    assert got["ETag"] == first["ETag"]
    assert md5(got["Body"].read()) == md5(b"".join(parts))
    again = s3.complete_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid,
                                         MultipartUpload={"Parts": done})
    assert again["ETag"] == first["ETag"]
    # Overwritten: the completion is over.
    s3.put_object(Bucket=bucket, Key="r/obj", Body=b"newer")
    with s3_error("NoSuchUpload", 404):
        s3.complete_multipart_upload(Bucket=bucket, Key="r/obj", UploadId=uid,
                                     MultipartUpload={"Parts": done})
    assert s3.get_object(Bucket=bucket, Key="r/obj")["Body"].read() == b"newer"


def test_retried_complete_multipart_upload_after_restart(server_factory, shards):
    """A retry that arrives after a crash and restart still gets the ETag."""
    srv = server_factory(shards=shards)
    s3 = srv.client()
    s3.create_bucket(Bucket="mp-retry")
    keys = spread_keys(4, prefix="k/")
    done_by_key = {}
    for k in keys:
        uid, done = upload(s3, "mp-retry", k, [os.urandom(1000)])
        r = s3.complete_multipart_upload(Bucket="mp-retry", Key=k, UploadId=uid,
                                         MultipartUpload={"Parts": done})
        done_by_key[k] = (uid, done, r["ETag"])
    srv.kill9()
    srv.restart()
    s3 = srv.client()
    for k, (uid, done, tag) in done_by_key.items():
        r = s3.complete_multipart_upload(Bucket="mp-retry", Key=k, UploadId=uid,
                                         MultipartUpload={"Parts": done})
        assert r["ETag"] == tag
        with s3_error("NoSuchUpload", 404):
            s3.complete_multipart_upload(
                Bucket="mp-retry", Key=k, UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag(b"other")}]})
