"""Additional checksums, conditional PUTs and multi-range GETs, against
servers with 1, 2 and 4 shards. Checksum values are computed here in pure
Python, independently of the server's implementation."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

import s3wire
from conftest import ACCESS_KEY, SECRET_KEY
from test_s3_basic import etag, s3_error

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _reflected_crc(poly: int, width: int):
    mask = (1 << width) - 1
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)

    def crc(data: bytes) -> int:
        c = mask
        for b in data:
            c = table[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ mask
    return crc


crc32c = _reflected_crc(0x82F63B78, 32)
crc64nvme = _reflected_crc(0x9A6C9329AC4BC9B5, 64)


def checksum_b64(alg: str, data: bytes) -> str:
    raw = {
        "crc32": lambda: (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big"),
        "crc32c": lambda: crc32c(data).to_bytes(4, "big"),
        "crc64nvme": lambda: crc64nvme(data).to_bytes(8, "big"),
        "sha1": lambda: hashlib.sha1(data).digest(),
        "sha256": lambda: hashlib.sha256(data).digest(),
    }[alg]()
    return base64.b64encode(raw).decode()


def test_reference_checksums():
    # The published check values ("123456789") of the CRCs used here.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc64nvme(b"123456789") == 0xAE8B14860A799888


def signer() -> s3wire.Signer:
    return s3wire.Signer(ACCESS_KEY, SECRET_KEY)


def put_with_header(server, bucket, key, payload, headers):
    path = s3wire.encode_key_path(bucket, key)
    hdrs = {"host": f"{server.host}:{server.s3_port}", "content-length": str(len(payload)),
            **headers}
    hdrs, _ = signer().sign("PUT", path, hdrs, s3wire.sha256_hex(payload))
    return s3wire.send(server.host, server.s3_port, "PUT", path, hdrs, payload)


def get_raw(server, bucket, key, headers):
    path = s3wire.encode_key_path(bucket, key)
    hdrs = {"host": f"{server.host}:{server.s3_port}", **headers}
    hdrs, _ = signer().sign("GET", path, hdrs, s3wire.EMPTY_SHA256)
    return s3wire.send(server.host, server.s3_port, "GET", path, hdrs)


ALGORITHMS = ["crc32", "crc32c", "crc64nvme", "sha1", "sha256"]


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_checksum_header_verified_stored_and_returned(server, s3, bucket, alg):
    payload = os.urandom(300_000)
    value = checksum_b64(alg, payload)
    r = put_with_header(server, bucket, "obj", payload, {f"x-amz-checksum-{alg}": value})
    assert r.status == 200, r.body
    # Returned in checksum mode only, for whole-object reads only.
    head = s3.head_object(Bucket=bucket, Key="obj", ChecksumMode="ENABLED")
    assert head[f"Checksum{alg.upper()}"] == value
    plain = get_raw(server, bucket, "obj", {})
    assert f"x-amz-checksum-{alg}" not in plain.headers
    full = get_raw(server, bucket, "obj", {"x-amz-checksum-mode": "ENABLED"})
    assert full.headers[f"x-amz-checksum-{alg}"] == value and full.body == payload
    ranged = get_raw(server, bucket, "obj", {"x-amz-checksum-mode": "ENABLED",
                                             "range": "bytes=0-99"})
    assert ranged.status == 206 and f"x-amz-checksum-{alg}" not in ranged.headers
    # A wrong value is refused and stores nothing.
    wrong = checksum_b64(alg, payload + b"x")
    r = put_with_header(server, bucket, "bad", payload, {f"x-amz-checksum-{alg}": wrong})
    assert r.status == 400 and r.error_code() == "BadDigest", r.body
    with s3_error("404", 404):
        s3.head_object(Bucket=bucket, Key="bad")


def test_checksum_trailer_mismatch_is_refused(server, s3, bucket):
    host, port = server.host, server.s3_port
    payload = os.urandom(100_000)
    good = s3wire.put_unsigned_trailer(host, port, signer(), bucket, "t", payload)
    assert good.status == 200, good.body
    head = s3.head_object(Bucket=bucket, Key="t", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == checksum_b64("crc32", payload)
    # Same framing, trailer value of other bytes.
    path = s3wire.encode_key_path(bucket, "t2")
    body = s3wire.unsigned_trailer_body(payload, 64 * 1024,
                                        ("x-amz-checksum-crc32", checksum_b64("crc32", b"no")))
    hdrs = {"host": f"{host}:{port}", "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(payload)),
            "x-amz-trailer": "x-amz-checksum-crc32", "content-length": str(len(body))}
    hdrs, _ = signer().sign("PUT", path, hdrs, s3wire.STREAMING_UNSIGNED_TRAILER)
    r = s3wire.send(host, port, "PUT", path, hdrs, body)
    assert r.status == 400 and r.error_code() == "BadDigest", r.body
    with s3_error("404", 404):
        s3.head_object(Bucket=bucket, Key="t2")


def test_two_checksum_headers_are_refused(server, bucket):
    payload = b"abc"
    r = put_with_header(server, bucket, "two", payload, {
        "x-amz-checksum-crc32": checksum_b64("crc32", payload),
        "x-amz-checksum-sha1": checksum_b64("sha1", payload)})
    assert r.status == 400 and r.error_code() == "InvalidRequest", r.body


def test_boto3_checksum_algorithm_round_trip(s3, bucket):
    payload = os.urandom(50_000)
    for alg in ["CRC32", "SHA1", "SHA256"]:
        s3.put_object(Bucket=bucket, Key=alg, Body=payload, ChecksumAlgorithm=alg)
        got = s3.get_object(Bucket=bucket, Key=alg, ChecksumMode="ENABLED")
        assert got["Body"].read() == payload  # botocore validates the checksum
        assert got[f"Checksum{alg}"] == checksum_b64(alg.lower(), payload)


# ---------------------------------------------------------------------------
# conditional PUT
# ---------------------------------------------------------------------------

def test_put_if_none_match_star(s3, bucket):
    s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"first"
    s3.delete_object(Bucket=bucket, Key="once")
    s3.put_object(Bucket=bucket, Key="once", Body=b"third", IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"third"


def test_put_if_match(s3, bucket):
    with s3_error("NoSuchKey", 404):
        s3.put_object(Bucket=bucket, Key="m", Body=b"x", IfMatch=etag(b"x"))
    s3.put_object(Bucket=bucket, Key="m", Body=b"v1")
    with s3_error("PreconditionFailed", 412):
        s3.put_object(Bucket=bucket, Key="m", Body=b"v2", IfMatch=etag(b"other"))
    s3.put_object(Bucket=bucket, Key="m", Body=b"v2", IfMatch=etag(b"v1"))
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == b"v2"


def test_racing_create_only_puts_have_one_winner(server, bucket):
    def attempt(i):
        c = server.client()
        try:
            c.put_object(Bucket=bucket, Key="race", Body=b"w%d" % i + os.urandom(200_000),
                         IfNoneMatch="*")
            return i
        except ClientError as e:
            # 412 once the winner is installed; 409 while it is being written.
            assert e.response["Error"]["Code"] in (
                "PreconditionFailed", "ConditionalRequestConflict"), e.response
            return None
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            winners = [w for w in pool.map(attempt, range(8)) if w is not None]
        assert len(winners) == 1, winners
        got = server.client().get_object(Bucket=bucket, Key="race")["Body"].read()
        assert got.startswith(b"w%d" % winners[0])
        server.client().delete_object(Bucket=bucket, Key="race")


# ---------------------------------------------------------------------------
# multi-range GET
# ---------------------------------------------------------------------------

def parse_byteranges(resp) -> list[tuple[str, bytes]]:
    ctype = resp.headers["content-type"]
    m = re.fullmatch(r"multipart/byteranges; boundary=(\S+)", ctype)
    assert m, ctype
    boundary = m.group(1).encode()
    body = resp.body
    assert body.endswith(b"--" + boundary + b"--\r\n")
    parts = []
    for chunk in body.split(b"--" + boundary)[1:-1]:
        assert chunk.startswith(b"\r\n")
        head, data = chunk[2:].split(b"\r\n\r\n", 1)
        assert data.endswith(b"\r\n")
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n"))
        parts.append((headers[b"Content-Range"].decode(), data[:-2]))
    return parts


def test_multi_range_get_is_multipart_byteranges(server, s3, bucket):
    payload = os.urandom(3 * 1024 * 1024 + 5)
    s3.put_object(Bucket=bucket, Key="r", Body=payload, ContentType="application/x-parquet")
    size = len(payload)
    r = get_raw(server, bucket, "r", {"range": "bytes=0-9,2097150-2097160,-4"})
    assert r.status == 206, r.body[:300]
    assert int(r.headers["content-length"]) == len(r.body)
    parts = parse_byteranges(r)
    assert parts == [
        (f"bytes 0-9/{size}", payload[0:10]),
        (f"bytes 2097150-2097160/{size}", payload[2097150:2097161]),
        (f"bytes {size - 4}-{size - 1}/{size}", payload[-4:]),
    ]
    # Ranges past the end are dropped; none satisfiable is a 416.
    r = get_raw(server, bucket, "r", {"range": f"bytes=0-0,{size + 10}-{size + 20}"})
    assert r.status == 206 and r.body == payload[:1]
    r = get_raw(server, bucket, "r", {"range": f"bytes={size}-{size + 1},{size + 5}-"})
    assert r.status == 416


# ---------------------------------------------------------------------------
# GetObjectAttributes
# ---------------------------------------------------------------------------

def test_get_object_attributes(server, s3, bucket):
    payload = os.urandom(20_000)
    r = put_with_header(server, bucket, "a", payload,
                        {"x-amz-checksum-crc32c": checksum_b64("crc32c", payload)})
    assert r.status == 200, r.body
    got = s3.get_object_attributes(Bucket=bucket, Key="a", ObjectAttributes=[
        "ETag", "Checksum", "ObjectSize", "StorageClass", "ObjectParts"])
    assert got["ETag"] == etag(payload).strip('"')
    assert got["ObjectSize"] == len(payload)
    assert got["StorageClass"] == "STANDARD"
    assert got["Checksum"]["ChecksumCRC32C"] == checksum_b64("crc32c", payload)
    assert "ObjectParts" not in got
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    p = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=1, Body=b"z" * 10)
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]})
    got = s3.get_object_attributes(Bucket=bucket, Key="mp", ObjectAttributes=["ObjectParts"])
    assert got["ObjectParts"]["TotalPartsCount"] == 1
    with s3_error("NoSuchKey", 404):
        s3.get_object_attributes(Bucket=bucket, Key="nope", ObjectAttributes=["ETag"])


# ---------------------------------------------------------------------------
# virtual-hosted-style requests
# ---------------------------------------------------------------------------

def test_virtual_hosted_style(server_factory):
    srv = server_factory(shards=2, env={"PERCORE_S3_DOMAIN": "s3.percore.test"})
    s3 = srv.client()
    s3.create_bucket(Bucket="vhost-bkt")
    s3.put_object(Bucket="vhost-bkt", Key="dir/a b.txt", Body=b"hello")

    def raw(method, host, path, body=b""):
        hdrs = {"host": host, "content-length": str(len(body))}
        hdrs, _ = signer().sign(method, path, hdrs, s3wire.sha256_hex(body))
        return s3wire.send(srv.host, srv.s3_port, method, path, hdrs, body)

    vhost = f"vhost-bkt.s3.percore.test:{srv.s3_port}"
    r = raw("GET", vhost, "/dir/a%20b.txt")
    assert r.status == 200 and r.body == b"hello", r.body
    r = raw("PUT", vhost, "/via-vhost", b"v")
    assert r.status == 200, r.body
    assert s3.get_object(Bucket="vhost-bkt", Key="via-vhost")["Body"].read() == b"v"
    r = raw("GET", vhost, "/")
    assert r.status == 200 and b"<Key>dir/a b.txt</Key>" in r.body, r.body
    # Path style keeps working on the same server, any other host name too.
    r = raw("GET", f"127.0.0.1:{srv.s3_port}", "/vhost-bkt/via-vhost")
    assert r.status == 200 and r.body == b"v"


def test_create_only_race_winner_survives_kill9(server_factory):
    """The refused writers' records are on disk too; after a crash the
    acknowledged winner must still be the object (recovery takes the highest
    sequence number, so a refused record must never carry a higher one)."""
    srv = server_factory(shards=2)
    srv.client().create_bucket(Bucket="race9")

    def attempt(i):
        try:
            srv.client().put_object(Bucket="race9", Key="lock", Body=b"writer-%d" % i,
                                    IfNoneMatch="*")
            return i
        except ClientError as e:
            assert e.response["Error"]["Code"] in (
                "PreconditionFailed", "ConditionalRequestConflict"), e.response
            return None
    with ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(attempt, range(8)) if w is not None]
    assert len(winners) == 1
    srv.kill9()
    srv.start()
    got = srv.client().get_object(Bucket="race9", Key="lock")["Body"].read()
    assert got == b"writer-%d" % winners[0]
