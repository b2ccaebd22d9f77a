"""Client-driven tests of the first S3 slice, with boto3 and the aws cli,
against servers with 1, 2 and 4 shards (``server`` fixture parameters)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

import s3wire
from conftest import ACCESS_KEY, SECRET_KEY, AwsCli, unique_bucket_name

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MiB = 1024 * 1024
SINGLE_PUT = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def etag(b: bytes) -> str:
    return f'"{md5(b)}"'


def file_md5(path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def status_of(resp: dict) -> int:
    return resp["ResponseMetadata"]["HTTPStatusCode"]


@contextmanager
def s3_error(code: str, status: int | None = None):
    """Expect a ClientError with this S3 error code (and HTTP status)."""
    with pytest.raises(ClientError) as ei:
        yield ei
    err = ei.value.response
    got_code = err.get("Error", {}).get("Code")
    got_status = err.get("ResponseMetadata", {}).get("HTTPStatusCode")
    assert got_code == code, f"expected {code}, got {got_code} ({got_status}): {err}"
    if status is not None:
        assert got_status == status, f"expected HTTP {status}, got {got_status}: {err}"


def utf8_order(keys):
    """S3 lists keys in UTF-8 binary order."""
    return sorted(keys, key=lambda k: k.encode("utf-8"))


def list_all(s3, bucket, page_size=None, **kw):
    """ListObjectsV2 following continuation tokens by hand.

    Returns (keys, common_prefixes, contents, pages)."""
    keys, prefixes, contents, pages = [], [], [], 0
    token = None
    while True:
        args = dict(Bucket=bucket, **kw)
        if page_size is not None:
            args["MaxKeys"] = page_size
        if token:
            args["ContinuationToken"] = token
        resp = s3.list_objects_v2(**args)
        pages += 1
        page_contents = resp.get("Contents", [])
        page_prefixes = [p["Prefix"] for p in resp.get("CommonPrefixes", [])]
        if page_size is not None:
            assert len(page_contents) + len(page_prefixes) <= page_size, resp
        contents += page_contents
        keys += [c["Key"] for c in page_contents]
        prefixes += page_prefixes
        if not resp.get("IsTruncated"):
            break
        token = resp.get("NextContinuationToken")
        assert token, f"IsTruncated without NextContinuationToken: {resp}"
        assert pages < 10_000, "listing does not terminate"
    return keys, prefixes, contents, pages


def put_many(s3, bucket, objects: dict, workers: int = 8):
    def one(item):
        key, body = item
        resp = s3.put_object(Bucket=bucket, Key=key, Body=body)
        assert resp["ETag"] == etag(body), (key, resp["ETag"])
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, objects.items()))


def assert_objects(s3, bucket, objects: dict, workers: int = 8):
    def one(item):
        key, body = item
        got = s3.get_object(Bucket=bucket, Key=key)
        data = got["Body"].read()
        assert len(data) == len(body) and md5(data) == md5(body), key
        assert got["ETag"] == etag(body), key
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, objects.items()))


def spread_keys(n: int, prefix: str = "") -> list[str]:
    """Keys with well-mixed names so they hash to different shards."""
    return [f"{prefix}{hashlib.sha1(str(i).encode()).hexdigest()[:2]}/obj-{i:04d}"
            for i in range(n)]


# ---------------------------------------------------------------------------
# buckets
# ---------------------------------------------------------------------------

def test_bucket_create_head_list_delete(server, s3):
    name = unique_bucket_name("lifecycle")
    resp = s3.create_bucket(Bucket=name)
    assert status_of(resp) == 200
    assert status_of(s3.head_bucket(Bucket=name)) == 200
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    resp = s3.delete_bucket(Bucket=name)
    assert status_of(resp) == 204
    with s3_error("404", 404):
        s3.head_bucket(Bucket=name)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    with s3_error("NoSuchBucket", 404):
        s3.delete_bucket(Bucket=name)
    # The name is free again.
    s3.create_bucket(Bucket=name)
    assert status_of(s3.head_bucket(Bucket=name)) == 200


def test_create_existing_bucket_is_owned_by_you(s3, bucket):
    with s3_error("BucketAlreadyOwnedByYou", 409):
        s3.create_bucket(Bucket=bucket)
    assert status_of(s3.head_bucket(Bucket=bucket)) == 200


def test_invalid_bucket_names(s3):
    bad = ["ab", "a" * 64, "-leading-hyphen", "trailing-hyphen-", "Upper-Case",
           "under_score", "double..dot"]
    for name in bad:
        with s3_error("InvalidBucketName", 400):
            s3.create_bucket(Bucket=name)
    for name in ["abc", "a" * 63, "with.dots.ok", "0numeric-start"]:
        s3.create_bucket(Bucket=name)
        s3.delete_bucket(Bucket=name)


def test_list_buckets_contains_created(s3):
    names = {unique_bucket_name(f"lb{i}") for i in range(5)}
    for name in names:
        s3.create_bucket(Bucket=name)
    listed = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert names <= set(listed)
    assert len(listed) == len(set(listed)), "duplicate bucket names in ListBuckets"
    for b in s3.list_buckets()["Buckets"]:
        assert b.get("CreationDate") is not None


def test_missing_bucket_errors(s3):
    name = unique_bucket_name("missing")
    with s3_error("404", 404):
        s3.head_bucket(Bucket=name)
    with s3_error("NoSuchBucket", 404):
        s3.list_objects_v2(Bucket=name)
    with s3_error("NoSuchBucket", 404):
        s3.put_object(Bucket=name, Key="k", Body=b"x")
    with s3_error("NoSuchBucket", 404):
        s3.get_object(Bucket=name, Key="k")
    with s3_error("404", 404):
        s3.head_object(Bucket=name, Key="k")


def test_delete_non_empty_bucket(s3, bucket):
    s3.put_object(Bucket=bucket, Key="dir/keep", Body=b"x")
    with s3_error("BucketNotEmpty", 409):
        s3.delete_bucket(Bucket=bucket)
    assert s3.get_object(Bucket=bucket, Key="dir/keep")["Body"].read() == b"x"
    s3.delete_object(Bucket=bucket, Key="dir/keep")
    assert status_of(s3.delete_bucket(Bucket=bucket)) == 204
    with s3_error("404", 404):
        s3.head_bucket(Bucket=bucket)


# ---------------------------------------------------------------------------
# objects
# ---------------------------------------------------------------------------

def test_put_get_head_1kib(s3, bucket):
    body = os.urandom(1024)
    resp = s3.put_object(Bucket=bucket, Key="small.bin", Body=body)
    assert status_of(resp) == 200
    assert resp["ETag"] == etag(body)
    got = s3.get_object(Bucket=bucket, Key="small.bin")
    assert status_of(got) == 200
    data = got["Body"].read()
    assert md5(data) == md5(body) and data == body
    assert got["ContentLength"] == 1024
    assert got["ETag"] == etag(body)
    head = s3.head_object(Bucket=bucket, Key="small.bin")
    assert head["ContentLength"] == 1024
    assert head["ETag"] == etag(body)
    assert head.get("LastModified") is not None


def test_empty_object(s3, bucket):
    resp = s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert resp["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    got = s3.get_object(Bucket=bucket, Key="empty")
    assert got["Body"].read() == b""
    assert got["ContentLength"] == 0
    assert s3.head_object(Bucket=bucket, Key="empty")["ContentLength"] == 0
    keys, _, contents, _ = list_all(s3, bucket)
    assert keys == ["empty"] and contents[0]["Size"] == 0


def test_upload_download_12mib_single_put(s3, bucket, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(12 * MiB))
    want = file_md5(src)
    s3.upload_file(str(src), bucket, "big/12mib.bin", Config=SINGLE_PUT)
    head = s3.head_object(Bucket=bucket, Key="big/12mib.bin")
    assert head["ContentLength"] == 12 * MiB
    assert head["ETag"] == f'"{want}"', "single PUT ETag must be the body MD5"
    dst = tmp_path / "dst.bin"
    s3.download_file(bucket, "big/12mib.bin", str(dst), Config=SINGLE_PUT)
    assert file_md5(dst) == want
    body = s3.get_object(Bucket=bucket, Key="big/12mib.bin")["Body"].read()
    assert md5(body) == want


def test_parallel_ranged_download(s3, bucket, tmp_path):
    """s3transfer downloads big objects with concurrent ranged GETs."""
    data = os.urandom(6 * MiB + 12345)
    s3.put_object(Bucket=bucket, Key="ranged.bin", Body=data)
    dst = tmp_path / "ranged.bin"
    cfg = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=4)
    s3.download_file(bucket, "ranged.bin", str(dst), Config=cfg)
    assert file_md5(dst) == md5(data)


def test_multipart_upload(server, bucket, tmp_path):
    s3 = server.client(read_timeout=15)
    src = tmp_path / "mp.bin"
    src.write_bytes(os.urandom(12 * MiB))
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(src), bucket, "mp.bin", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="mp.bin")
    assert head["ContentLength"] == 12 * MiB
    assert re.fullmatch(r'"[0-9a-f]{32}-3"', head["ETag"]), head["ETag"]
    dst = tmp_path / "mp.out"
    s3.download_file(bucket, "mp.bin", str(dst), Config=SINGLE_PUT)
    assert file_md5(dst) == file_md5(src)


def test_200_keys_across_shards(s3, bucket):
    keys = spread_keys(200)
    objects = {k: (k.encode() * (1 + i % 7)) for i, k in enumerate(keys)}
    put_many(s3, bucket, objects)

    # One page (default max-keys 1000): everything, in order.
    resp = s3.list_objects_v2(Bucket=bucket)
    assert not resp.get("IsTruncated")
    listed = [c["Key"] for c in resp.get("Contents", [])]
    assert listed == utf8_order(keys)
    for c in resp["Contents"]:
        assert c["Size"] == len(objects[c["Key"]])
        assert c["ETag"] == etag(objects[c["Key"]])

    # Paged through continuation tokens: same order, no duplicates or gaps.
    for page_size in (1, 23, 199, 200):
        got, prefixes, _, pages = list_all(s3, bucket, page_size=page_size)
        assert got == utf8_order(keys), f"page size {page_size}"
        assert prefixes == []
        assert pages == -(-200 // page_size) or pages == -(-200 // page_size) + 1

    # Prefix and delimiter over the spread names.
    some = keys[17].split("/")[0] + "/"
    got, _, _, _ = list_all(s3, bucket, Prefix=some)
    assert got == utf8_order(k for k in keys if k.startswith(some))
    got, prefixes, _, _ = list_all(s3, bucket, Delimiter="/")
    assert got == []
    assert prefixes == utf8_order({k.split("/")[0] + "/" for k in keys})
    got, prefixes, _, _ = list_all(s3, bucket, page_size=7, Delimiter="/")
    assert got == [] and prefixes == utf8_order({k.split("/")[0] + "/" for k in keys})

    assert_objects(s3, bucket, objects)


def test_list_prefix_delimiter_semantics(s3, bucket):
    keys = ["a", "a/b", "a/c/d", "a/c/e", "ab", "b/x", "b/y", "c", "d/", "d/e"]
    put_many(s3, bucket, {k: k.encode() for k in keys})

    def lst(**kw):
        keys_, prefixes, _, _ = list_all(s3, bucket, **kw)
        return keys_, prefixes

    assert lst() == (utf8_order(keys), [])
    assert lst(Delimiter="/") == (["a", "ab", "c"], ["a/", "b/", "d/"])
    assert lst(Prefix="a") == (["a", "a/b", "a/c/d", "a/c/e", "ab"], [])
    assert lst(Prefix="a/", Delimiter="/") == (["a/b"], ["a/c/"])
    assert lst(Prefix="a/c/", Delimiter="/") == (["a/c/d", "a/c/e"], [])
    assert lst(Prefix="d/", Delimiter="/") == (["d/", "d/e"], [])
    assert lst(Prefix="zzz") == ([], [])
    assert lst(Prefix="a/c", Delimiter="/") == ([], ["a/c/"])
    # Rolled-up prefixes count against max-keys and paging must not repeat them.
    for page_size in (1, 2, 3):
        assert lst(Delimiter="/", page_size=page_size) == (["a", "ab", "c"], ["a/", "b/", "d/"])
    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", MaxKeys=2)
    assert resp["IsTruncated"] is True
    assert len(resp.get("Contents", [])) + len(resp.get("CommonPrefixes", [])) == 2


def test_list_empty_bucket(s3, bucket):
    resp = s3.list_objects_v2(Bucket=bucket)
    assert resp.get("Contents", []) == []
    assert not resp.get("IsTruncated")


SPECIAL_KEYS = [
    "a", "a/b", "a/b/c", "dir/", "with space", "  leading and trailing  ",
    "plus+sign", "eq=sign", "plus+and=eq&amp", "percent%20literal", "question?mark",
    "hash#tag", "semi;colon", "comma,key", "tilde~key", "star*key", "quote'key",
    "dquote\"key", "angle<key>", "back\\slash", "colon:key", "at@key", "dollar$key",
    "unicodé/ключ/日本語/🎉", "mixed/ÅÄÖ åäö", "sp ace/+plus/=eq",
]


def test_special_keys_round_trip(s3, bucket):
    objects = {k: f"body of {k!r}".encode() for k in SPECIAL_KEYS}
    put_many(s3, bucket, objects)
    assert_objects(s3, bucket, objects)
    for key, body in objects.items():
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body), key
    keys, _, _, _ = list_all(s3, bucket)
    assert keys == utf8_order(SPECIAL_KEYS)
    keys, _, _, _ = list_all(s3, bucket, page_size=5)
    assert keys == utf8_order(SPECIAL_KEYS)
    keys, _, _, _ = list_all(s3, bucket, Prefix="unicodé/")
    assert keys == ["unicodé/ключ/日本語/🎉"]
    _, prefixes, _, _ = list_all(s3, bucket, Prefix="a", Delimiter="/")
    assert prefixes == ["a/"]
    # "a" and "a/b" are independent objects.
    s3.delete_object(Bucket=bucket, Key="a")
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="a")
    assert s3.get_object(Bucket=bucket, Key="a/b")["Body"].read() == objects["a/b"]
    assert s3.get_object(Bucket=bucket, Key="a/b/c")["Body"].read() == objects["a/b/c"]


def test_key_length_limit(s3, bucket):
    longest = "k" * 1000 + "é" * 12  # 1024 bytes of UTF-8
    assert len(longest.encode()) == 1024
    s3.put_object(Bucket=bucket, Key=longest, Body=b"long")
    assert s3.get_object(Bucket=bucket, Key=longest)["Body"].read() == b"long"
    assert list_all(s3, bucket)[0] == [longest]
    too_long = "k" * 1025
    with s3_error("KeyTooLongError", 400):
        s3.put_object(Bucket=bucket, Key=too_long, Body=b"x")
    # 1025 bytes of UTF-8 in 1013 characters: the limit counts bytes.
    with s3_error("KeyTooLongError", 400):
        s3.put_object(Bucket=bucket, Key="k" * 1001 + "é" * 12, Body=b"x")
    assert list_all(s3, bucket)[0] == [longest]


def test_range_requests(s3, bucket):
    data = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    cases = [
        ("bytes=0-9", 0, 9),        # first bytes
        ("bytes=0-0", 0, 0),
        ("bytes=100-199", 100, 199),  # middle
        ("bytes=990-", 990, 999),   # open-ended
        ("bytes=-25", 975, 999),    # suffix
        ("bytes=999-999", 999, 999),
        ("bytes=0-999", 0, 999),
        ("bytes=500-5000", 500, 999),  # end past the size is clamped
        ("bytes=-5000", 0, 999),    # suffix longer than the object
    ]
    for rng, first, last in cases:
        got = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert status_of(got) == 206, rng
        assert got["ContentRange"] == f"bytes {first}-{last}/1000", rng
        assert got["ContentLength"] == last - first + 1, rng
        assert got["Body"].read() == data[first:last + 1], rng
    for rng in ("bytes=1000-", "bytes=5000-6000", "bytes=1000-1000"):
        with s3_error("InvalidRange", 416):
            s3.get_object(Bucket=bucket, Key="r", Range=rng)
    # No Range: the whole object, 200.
    got = s3.get_object(Bucket=bucket, Key="r")
    assert status_of(got) == 200 and got["Body"].read() == data


def test_range_on_large_object(s3, bucket):
    data = os.urandom(5 * MiB + 3)
    s3.put_object(Bucket=bucket, Key="big", Body=data)
    for first, last in ((0, MiB - 1), (MiB - 5, 3 * MiB + 7), (5 * MiB - 10, 5 * MiB + 2)):
        got = s3.get_object(Bucket=bucket, Key="big", Range=f"bytes={first}-{last}")
        assert got["ContentRange"] == f"bytes {first}-{last}/{len(data)}"
        assert got["Body"].read() == data[first:last + 1]


def test_metadata_and_content_type(s3, bucket):
    meta = {"color": "blue", "owner-id": "42", "note": "hello world"}
    ctype = "application/x-percore-test; charset=utf-8"
    s3.put_object(Bucket=bucket, Key="meta", Body=b"m", Metadata=meta, ContentType=ctype)
    head = s3.head_object(Bucket=bucket, Key="meta")
    assert head["Metadata"] == meta
    assert head["ContentType"] == ctype
    got = s3.get_object(Bucket=bucket, Key="meta")
    assert got["Metadata"] == meta
    assert got["ContentType"] == ctype
    ranged = s3.get_object(Bucket=bucket, Key="meta", Range="bytes=0-0")
    assert ranged["Metadata"] == meta and ranged["ContentType"] == ctype
    # An overwrite replaces the metadata as a whole.
    s3.put_object(Bucket=bucket, Key="meta", Body=b"n", Metadata={"shape": "round"},
                  ContentType="text/plain")
    head = s3.head_object(Bucket=bucket, Key="meta")
    assert head["Metadata"] == {"shape": "round"}
    assert head["ContentType"] == "text/plain"


def test_overwrite_returns_new_bytes(s3, bucket):
    versions = [os.urandom(1024), os.urandom(300), os.urandom(2 * MiB), b"", os.urandom(77)]
    for body in versions:
        resp = s3.put_object(Bucket=bucket, Key="ow", Body=body)
        assert resp["ETag"] == etag(body)
        got = s3.get_object(Bucket=bucket, Key="ow")
        assert got["Body"].read() == body
        assert got["ETag"] == etag(body)
        assert s3.head_object(Bucket=bucket, Key="ow")["ContentLength"] == len(body)
        _, _, contents, _ = list_all(s3, bucket)
        assert [(c["Key"], c["Size"]) for c in contents] == [("ow", len(body))]


def test_concurrent_overwrites_of_one_key(server, bucket):
    s3 = server.client()
    bodies = [f"writer {i} ".encode() * (1000 + 37 * i) for i in range(8)]

    def writer(i):
        for _ in range(6):
            s3.put_object(Bucket=bucket, Key="hot", Body=bodies[i])
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(8)))
    got = s3.get_object(Bucket=bucket, Key="hot")
    data = got["Body"].read()
    assert data in bodies, "object is a mix of concurrent writes"
    assert got["ETag"] == etag(data)


def test_delete_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="gone", Body=b"bye")
    s3.put_object(Bucket=bucket, Key="stays", Body=b"hi")
    resp = s3.delete_object(Bucket=bucket, Key="gone")
    assert status_of(resp) == 204
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="gone")
    with s3_error("404", 404):
        s3.head_object(Bucket=bucket, Key="gone")
    assert list_all(s3, bucket)[0] == ["stays"]
    # Deleting a missing key is not an error.
    assert status_of(s3.delete_object(Bucket=bucket, Key="gone")) == 204
    assert status_of(s3.delete_object(Bucket=bucket, Key="never-existed")) == 204
    # And the key can be written again.
    s3.put_object(Bucket=bucket, Key="gone", Body=b"back")
    assert s3.get_object(Bucket=bucket, Key="gone")["Body"].read() == b"back"


def test_missing_key(s3, bucket):
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="nope")
    with s3_error("404", 404):  # HEAD has no body: bare 404
        s3.head_object(Bucket=bucket, Key="nope")
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="nope", Range="bytes=0-1")


# ---------------------------------------------------------------------------
# authentication
# ---------------------------------------------------------------------------

def test_wrong_secret_is_signature_mismatch(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="secret", Body=b"data")
    bad = server.client(secret_key=SECRET_KEY + "-wrong")
    with s3_error("SignatureDoesNotMatch", 403):
        bad.list_buckets()
    with s3_error("SignatureDoesNotMatch", 403):
        bad.get_object(Bucket=bucket, Key="secret")
    with s3_error("SignatureDoesNotMatch", 403):
        bad.put_object(Bucket=bucket, Key="intruder", Body=b"x")
    with s3_error("SignatureDoesNotMatch", 403):
        bad.delete_object(Bucket=bucket, Key="secret")
    with s3_error("403", 403):
        bad.head_object(Bucket=bucket, Key="secret")
    assert list_all(s3, bucket)[0] == ["secret"]
    assert s3.get_object(Bucket=bucket, Key="secret")["Body"].read() == b"data"


def test_unknown_access_key(server, s3, bucket):
    bad = server.client(access_key="AKIDUNKNOWN000000000", secret_key=SECRET_KEY)
    with s3_error("InvalidAccessKeyId", 403):
        bad.list_buckets()
    with s3_error("InvalidAccessKeyId", 403):
        bad.put_object(Bucket=bucket, Key="intruder", Body=b"x")
    with s3_error("InvalidAccessKeyId", 403):
        bad.create_bucket(Bucket=unique_bucket_name("intruder"))
    assert list_all(s3, bucket)[0] == []


def test_tampered_signed_payload_is_rejected(server, s3, bucket):
    """A body that does not match its signed x-amz-content-sha256 is not stored."""
    signer = s3wire.Signer(ACCESS_KEY, SECRET_KEY)
    path = s3wire.encode_key_path(bucket, "tampered")
    body = b"the real body"
    headers = {"host": f"{server.host}:{server.s3_port}", "content-length": str(len(body))}
    hdrs, _ = signer.sign("PUT", path, headers, s3wire.sha256_hex(b"another body!"))
    resp = s3wire.send(server.host, server.s3_port, "PUT", path, hdrs, body)
    assert resp.status == 400, (resp.status, resp.body[:300])
    assert resp.error_code() == "XAmzContentSHA256Mismatch", resp.body[:300]
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket=bucket, Key="tampered")


# ---------------------------------------------------------------------------
# aws cli
# ---------------------------------------------------------------------------

def test_cli_s3api_operations(aws, s3, tmp_path):
    name = unique_bucket_name("cli-s3api")
    aws.s3api("create-bucket", "--bucket", name)
    aws.s3api("head-bucket", "--bucket", name)
    assert name in [b["Name"] for b in aws.s3api("list-buckets")["Buckets"]]

    src = tmp_path / "one.bin"
    src.write_bytes(os.urandom(1024))
    put = aws.s3api("put-object", "--bucket", name, "--key", "dir/one.bin", "--body", src,
                    "--content-type", "application/x-test", "--metadata", "color=blue,size=one")
    assert put["ETag"] == f'"{file_md5(src)}"'
    head = aws.s3api("head-object", "--bucket", name, "--key", "dir/one.bin")
    assert head["ContentLength"] == 1024
    assert head["ContentType"] == "application/x-test"
    assert head["Metadata"] == {"color": "blue", "size": "one"}
    assert head["ETag"] == f'"{file_md5(src)}"'

    out = tmp_path / "one.out"
    got = aws.s3api("get-object", "--bucket", name, "--key", "dir/one.bin", out)
    assert got["ContentLength"] == 1024 and file_md5(out) == file_md5(src)
    part = tmp_path / "part.out"
    got = aws.s3api("get-object", "--bucket", name, "--key", "dir/one.bin",
                    "--range", "bytes=10-19", part)
    assert got["ContentRange"] == "bytes 10-19/1024"
    assert part.read_bytes() == src.read_bytes()[10:20]

    # Continuation through the cli's own paginator (page size 7 over 30 keys).
    keys = [f"many/{i:02d}" for i in range(30)]
    put_many(s3, name, {k: k.encode() for k in keys})
    listed = aws.s3api("list-objects-v2", "--bucket", name, "--prefix", "many/",
                       "--page-size", "7")
    assert [c["Key"] for c in listed["Contents"]] == keys
    listed = aws.s3api("list-objects-v2", "--bucket", name, "--delimiter", "/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["dir/", "many/"]
    assert not listed.get("Contents")

    aws.s3api("delete-object", "--bucket", name, "--key", "dir/one.bin")
    err = aws.fail("s3api", "head-object", "--bucket", name, "--key", "dir/one.bin")
    assert "404" in err or "Not Found" in err, err
    for k in keys:
        s3.delete_object(Bucket=name, Key=k)
    aws.s3api("delete-bucket", "--bucket", name)
    err = aws.fail("s3api", "head-bucket", "--bucket", name)
    assert "404" in err or "Not Found" in err, err


def test_cli_errors(server, aws, s3, tmp_path):
    name = unique_bucket_name("cli-errors")
    aws.s3api("create-bucket", "--bucket", name)
    assert "BucketAlreadyOwnedByYou" in aws.fail("s3api", "create-bucket", "--bucket", name)
    assert "NoSuchKey" in aws.fail("s3api", "get-object", "--bucket", name, "--key", "nope",
                                   tmp_path / "nope")
    s3.put_object(Bucket=name, Key="x", Body=b"x")
    assert "BucketNotEmpty" in aws.fail("s3api", "delete-bucket", "--bucket", name)
    missing = unique_bucket_name("cli-missing")
    assert "NoSuchBucket" in aws.fail("s3api", "list-objects-v2", "--bucket", missing)
    wrong = AwsCli(server.endpoint, tmp_path / "wrong", secret_key=SECRET_KEY + "x")
    assert "SignatureDoesNotMatch" in wrong.fail("s3api", "list-buckets")
    unknown = AwsCli(server.endpoint, tmp_path / "unknown", access_key="AKIDNOSUCHKEY0000000")
    assert "InvalidAccessKeyId" in unknown.fail("s3api", "list-buckets")


def _ls_entries(out: str):
    """Parse `aws s3 ls` output into ({name: size}, [prefixes])."""
    files, prefixes = {}, []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s*PRE (.+)$", line)
        if m:
            prefixes.append(m.group(1))
            continue
        m = re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+(\d+) (.+)$", line)
        assert m, f"unexpected `aws s3 ls` line: {line!r}"
        files[m.group(2)] = int(m.group(1))
    return files, prefixes


def test_cli_high_level_cp_ls_rm(aws, s3, tmp_path):
    name = unique_bucket_name("cli-s3")
    aws.s3("mb", f"s3://{name}")
    assert name in aws.s3("ls")

    small = tmp_path / "small.txt"
    small.write_bytes(b"hello percore\n" * 100)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * MiB))  # below the 64MB threshold: one PUT
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    tree_files = {"a.txt": b"a" * 10, "b.txt": b"b" * 20, "sub/c.txt": b"c" * 30,
                  "sub/d e.txt": b"d" * 40}
    for rel, body in tree_files.items():
        (tree / rel).write_bytes(body)

    aws.s3("cp", small, f"s3://{name}/docs/small.txt")
    aws.s3("cp", big, f"s3://{name}/blobs/big.bin")
    aws.s3("cp", "--recursive", tree, f"s3://{name}/tree/")

    head = s3.head_object(Bucket=name, Key="blobs/big.bin")
    assert head["ContentLength"] == 12 * MiB and head["ETag"] == f'"{file_md5(big)}"'

    files, prefixes = _ls_entries(aws.s3("ls", f"s3://{name}/"))
    assert files == {} and sorted(prefixes) == ["blobs/", "docs/", "tree/"]
    files, prefixes = _ls_entries(aws.s3("ls", f"s3://{name}/tree/"))
    assert files == {"a.txt": 10, "b.txt": 20} and prefixes == ["sub/"]
    files, _ = _ls_entries(aws.s3("ls", "--recursive", f"s3://{name}"))
    expected = {"docs/small.txt": small.stat().st_size, "blobs/big.bin": 12 * MiB,
                **{f"tree/{rel}": len(body) for rel, body in tree_files.items()}}
    assert files == expected

    down = tmp_path / "down"
    aws.s3("cp", f"s3://{name}/blobs/big.bin", down / "big.bin")
    assert file_md5(down / "big.bin") == file_md5(big)
    aws.s3("cp", "--recursive", f"s3://{name}/tree/", down / "tree")
    for rel, body in tree_files.items():
        assert (down / "tree" / rel).read_bytes() == body

    aws.s3("rm", f"s3://{name}/docs/small.txt")
    aws.s3("rm", "--recursive", f"s3://{name}/tree/")
    files, _ = _ls_entries(aws.s3("ls", "--recursive", f"s3://{name}"))
    assert files == {"blobs/big.bin": 12 * MiB}
    assert "BucketNotEmpty" in aws.fail("s3", "rb", f"s3://{name}")
    aws.s3("rm", f"s3://{name}/blobs/big.bin")
    aws.s3("rb", f"s3://{name}")
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


# ---------------------------------------------------------------------------
# process lifecycle (each test runs its own server)
# ---------------------------------------------------------------------------

def _populate(s3, bucket):
    objects = {k: os.urandom(100 + 37 * i) for i, k in enumerate(spread_keys(60, "p/"))}
    objects["big/3mib"] = os.urandom(3 * MiB)
    objects["unicodé key+="] = b"u"
    put_many(s3, bucket, objects)
    deleted = list(objects)[::6]
    for k in deleted:
        s3.delete_object(Bucket=bucket, Key=k)
        del objects[k]
    return objects, deleted


def _verify(s3, bucket, objects, deleted):
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert_objects(s3, bucket, objects)
    for k in deleted:
        with s3_error("NoSuchKey", 404):
            s3.get_object(Bucket=bucket, Key=k)
    keys, _, contents, _ = list_all(s3, bucket)
    assert keys == utf8_order(objects)
    assert all(c["Size"] == len(objects[c["Key"]]) for c in contents)


def test_sigterm_exits_zero_and_data_survives_restart(server_factory, shards):
    srv = server_factory(shards=shards)
    s3 = srv.client()
    bucket = unique_bucket_name("sigterm")
    s3.create_bucket(Bucket=bucket)
    objects, deleted = _populate(s3, bucket)
    srv.terminate()  # asserts exit code 0
    srv.start()
    s3 = srv.client()
    _verify(s3, bucket, objects, deleted)
    # SIGINT is a graceful stop too.
    srv.signal(signal.SIGINT)
    assert srv.wait() == 0, srv.logs()
    srv.start()
    _verify(srv.client(), bucket, objects, deleted)
    srv.terminate()


def test_sigkill_then_restart_keeps_acknowledged_writes(server_factory, shards):
    srv = server_factory(shards=shards)
    s3 = srv.client()
    bucket = unique_bucket_name("sigkill")
    s3.create_bucket(Bucket=bucket)
    objects, deleted = _populate(s3, bucket)
    srv.kill9()
    srv.start()
    _verify(srv.client(), bucket, objects, deleted)
    srv.terminate()


def _ready_status(srv) -> tuple[int, bytes]:
    """GET /health/ready on the admin port (a cluster node's on its own
    address): (status, body)."""
    import urllib.error
    import urllib.request
    ip = getattr(srv, "ip", "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://{ip}:{srv.admin_port}/health/ready",
                                    timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_sigterm_finishes_in_flight_put(server_factory, shards):
    """SIGTERM while a PUT body is still arriving: the server is seen
    draining (/health/ready 503 "draining", new connections refused) while
    the PUT is in flight, the PUT completes, then exit 0."""
    import http.client

    srv = server_factory(shards=shards)
    s3 = srv.client()
    bucket = unique_bucket_name("inflight")
    s3.create_bucket(Bucket=bucket)
    payload = os.urandom(2 * MiB)
    signer = s3wire.Signer(ACCESS_KEY, SECRET_KEY)
    path = s3wire.encode_key_path(bucket, "in-flight")
    hdrs, _ = signer.sign("PUT", path, {"host": f"{srv.host}:{srv.s3_port}",
                                        "content-length": str(len(payload))},
                          s3wire.UNSIGNED_PAYLOAD)
    conn = http.client.HTTPConnection(srv.host, srv.s3_port, timeout=30)
    try:
        conn.putrequest("PUT", path, skip_host=True, skip_accept_encoding=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(payload[:MiB])
        time.sleep(0.3)
        assert _ready_status(srv)[0] == 200
        srv.signal(signal.SIGTERM)
        # Draining, observed: the server waits for the PUT (up to 30 s),
        # so this window stays open until the rest of the body is sent.
        deadline = time.monotonic() + 10
        while (ready := _ready_status(srv))[0] != 503:
            assert time.monotonic() < deadline, f"/health/ready still {ready} after SIGTERM"
            time.sleep(0.02)
        assert ready[1].startswith(b"draining"), ready
        assert srv.alive(), "the server exited with a PUT in flight"
        # ... and soon takes no new connection while it drains: every shard
        # closes its own listener when it sees the drain, a few ms apart
        # under load (the admin shard may report draining first).
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection((srv.host, srv.s3_port), timeout=5).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "still accepting 5 s into the drain"
            time.sleep(0.02)
        try:
            conn.send(payload[MiB:])
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise AssertionError(f"the in-flight PUT was cut off by SIGTERM: {e!r}") from e
        assert resp.status == 200, (resp.status, body[:500])
        assert resp.getheader("ETag") == etag(payload)
    finally:
        conn.close()
    assert srv.wait() == 0, srv.logs()
    srv.start()
    got = srv.client().get_object(Bucket=bucket, Key="in-flight")["Body"].read()
    assert md5(got) == md5(payload)
    srv.terminate()


def test_credentials_from_environment(server_factory):
    srv = server_factory(shards=1, env={"PERCORE_ACCESS_KEY": "AKIDCUSTOM1234567890",
                                        "PERCORE_SECRET_KEY": "custom-secret-abc/+="})
    good = srv.client(access_key="AKIDCUSTOM1234567890", secret_key="custom-secret-abc/+=")
    bucket = unique_bucket_name("custom-creds")
    good.create_bucket(Bucket=bucket)
    good.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert good.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    with s3_error("InvalidAccessKeyId", 403):
        srv.client().list_buckets()  # the default key is not configured now
    with s3_error("SignatureDoesNotMatch", 403):
        srv.client(access_key="AKIDCUSTOM1234567890", secret_key=SECRET_KEY).list_buckets()
    srv.terminate()
