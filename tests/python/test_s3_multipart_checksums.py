"""Checksums of multipart uploads (x-amz-checksum-algorithm and
x-amz-checksum-type on CreateMultipartUpload; COMPOSITE and FULL_OBJECT
objects) through boto3 and signed raw requests, against servers with 1, 2
and 4 shards. Expected values are computed here, in Python, from the bytes
(`test_s3_features.checksum_b64`), never taken from the server."""

from __future__ import annotations

import base64
import functools
import hashlib
import random
import xml.etree.ElementTree as ET

import pytest

import s3wire
from signed import request
from test_s3_basic import MiB, s3_error
from test_s3_features import checksum_b64

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
PART = 5 * MiB


@functools.cache
def block(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@functools.cache
def b64_of(alg: str, seed: int, size: int) -> str:
    """Checksum of `block(seed, size)` (cached: the pure-Python CRCs take
    about a second per 5 MiB)."""
    return checksum_b64(alg, block(seed, size))


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def raw(value: str) -> bytes:
    return base64.b64decode(value)


def composite(alg: str, part_values: list[str]) -> str:
    joined = b"".join(raw(v) for v in part_values)
    return f"{checksum_b64(alg, joined)}-{len(part_values)}"


def key_path(bucket, key):
    return s3wire.encode_key_path(bucket, key)


def upload_part_raw(srv, bucket, key, uid, number, body, headers=None):
    return request(srv, "PUT", key_path(bucket, key), headers=headers or {}, body=body,
                   query=[("partNumber", str(number)), ("uploadId", uid)])


def error_code(body: bytes) -> str | None:
    node = ET.fromstring(body).find("Code")
    return node.text if node is not None else None



# Every algorithm with every type S3 allows for it.
COMBINATIONS = [
    ("crc32", "COMPOSITE"), ("crc32", "FULL_OBJECT"),
    ("crc32c", "COMPOSITE"), ("crc32c", "FULL_OBJECT"),
    ("crc64nvme", "FULL_OBJECT"),
    ("sha1", "COMPOSITE"), ("sha256", "COMPOSITE"),
]


@pytest.mark.parametrize("alg,kind", COMBINATIONS, ids=[f"{a}-{k}" for a, k in COMBINATIONS])
def test_multipart_object_checksum(server, s3, bucket, alg, kind):
    """Three parts: one sent without a checksum (the server sums it with
    the upload's algorithm), one with its checksum header, a short last
    one through boto3 with its value. The completed object's checksum is
    the combination S3 defines, in the completion's answer, on HEAD and GET
    in checksum mode, in GetObjectAttributes; ListParts and
    ListMultipartUploads show the choice and the parts' checksums."""
    key = f"ck/{alg}-{kind}"
    blocks = [(1, PART), (2, PART + 77), (3, 1000)]
    values = [b64_of(alg, seed, size) for seed, size in blocks]
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=alg.upper(),
                                    ChecksumType=kind)
    assert up["ChecksumAlgorithm"] == alg.upper() and up["ChecksumType"] == kind
    uid = up["UploadId"]
    header = f"x-amz-checksum-{alg}"
    r = upload_part_raw(server, bucket, key, uid, 1, block(*blocks[0]))
    assert r.status == 200, r.body
    assert r.headers[header] == values[0]
    r = upload_part_raw(server, bucket, key, uid, 2, block(*blocks[1]), {header: values[1]})
    assert r.status == 200, r.body
    assert r.headers[header] == values[1]
    member = f"Checksum{alg.upper()}"
    r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3,
                       Body=block(*blocks[2]), **{member: values[2]})
    assert r[member] == values[2]

    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert listed["ChecksumAlgorithm"] == alg.upper() and listed["ChecksumType"] == kind
    assert [p[member] for p in listed["Parts"]] == values
    uploads = [u for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=key)["Uploads"]
               if u["UploadId"] == uid]
    assert [(u["ChecksumAlgorithm"], u["ChecksumType"]) for u in uploads] == [(alg.upper(), kind)]

    whole = b"".join(block(*b) for b in blocks)
    if kind == "COMPOSITE":
        want = composite(alg, values)
    else:
        want = _full_crc(alg, tuple(blocks))
    parts = [{"PartNumber": i + 1, "ETag": f'"{md5_hex(block(*b))}"', member: v}
             for i, (b, v) in enumerate(zip(blocks, values))]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts},
        ChecksumType=kind, MpuObjectSize=len(whole),
        **({member: want} if kind == "FULL_OBJECT" else {}))
    assert done[member] == want and done["ChecksumType"] == kind

    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head[member] == want and head["ChecksumType"] == kind
    got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert got[member] == want and got["Body"].read() == whole
    attrs = s3.get_object_attributes(Bucket=bucket, Key=key, ObjectAttributes=["Checksum"])
    # GetObjectAttributes gives a COMPOSITE value without its -N, as S3.
    assert attrs["Checksum"][member] == want.split("-")[0]
    assert attrs["Checksum"]["ChecksumType"] == kind


@functools.cache
def _full_crc(alg: str, blocks: tuple) -> str:
    """The whole object's CRC, from its bytes (cached: shard counts share
    it)."""
    return checksum_b64(alg, b"".join(block(*b) for b in blocks))


def test_multipart_checksum_errors(server, s3, bucket):
    """Bad choices and mismatches are refused with S3's codes, and the
    upload can still be completed with the right values."""
    with s3_error("InvalidRequest", 400):
        s3.create_multipart_upload(Bucket=bucket, Key="e", ChecksumAlgorithm="SHA256",
                                   ChecksumType="FULL_OBJECT")
    with s3_error("InvalidRequest", 400):
        s3.create_multipart_upload(Bucket=bucket, Key="e", ChecksumAlgorithm="CRC64NVME",
                                   ChecksumType="COMPOSITE")
    for headers in ({"x-amz-checksum-type": "COMPOSITE"},
                    {"x-amz-checksum-algorithm": "MD5"},
                    {"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-type": "PARTIAL"}):
        r = request(server, "POST", key_path(bucket, "e"), headers=headers,
                    query=[("uploads", "")])
        assert (r.status, error_code(r.body)) == (400, "InvalidRequest"), headers
    # CRC64NVME defaults to FULL_OBJECT, the others to COMPOSITE.
    assert s3.create_multipart_upload(Bucket=bucket, Key="d",
                                      ChecksumAlgorithm="CRC64NVME")["ChecksumType"] == \
        "FULL_OBJECT"
    up = s3.create_multipart_upload(Bucket=bucket, Key="e", ChecksumAlgorithm="CRC32")
    assert up["ChecksumType"] == "COMPOSITE"
    uid = up["UploadId"]
    first, last = block(10, PART), block(11, 3000)
    # A wrong checksum, of the upload's algorithm or another one.
    for alg in ("crc32", "sha256"):
        r = upload_part_raw(server, bucket, "e", uid, 1, first,
                            {f"x-amz-checksum-{alg}": checksum_b64(alg, last)})
        assert (r.status, error_code(r.body)) == (400, "BadDigest")
    # Another algorithm's checksum (SDKs add CRC32 unless told otherwise)
    # is verified, and the upload's is summed too.
    r = upload_part_raw(server, bucket, "e", uid, 1, first,
                        {"x-amz-checksum-sha256": checksum_b64("sha256", first)})
    assert r.status == 200, r.body
    assert r.headers["x-amz-checksum-sha256"] == checksum_b64("sha256", first)
    assert r.headers["x-amz-checksum-crc32"] == checksum_b64("crc32", first)
    assert upload_part_raw(server, bucket, "e", uid, 2, last).status == 200
    values = [checksum_b64("crc32", first), checksum_b64("crc32", last)]
    etags = [f'"{md5_hex(first)}"', f'"{md5_hex(last)}"']

    def complete(part_values=values, **kw):
        parts = [{"PartNumber": i + 1, "ETag": e, **({"ChecksumCRC32": v} if v else {})}
                 for i, (e, v) in enumerate(zip(etags, part_values))]
        return s3.complete_multipart_upload(Bucket=bucket, Key="e", UploadId=uid,
                                            MultipartUpload={"Parts": parts}, **kw)

    with s3_error("InvalidPart", 400):
        complete([values[0], values[0]])
    with s3_error("BadDigest", 400):
        complete(ChecksumCRC32=checksum_b64("crc32", b"nothing"))
    with s3_error("InvalidRequest", 400):
        complete(ChecksumType="FULL_OBJECT")
    with s3_error("InvalidRequest", 400):
        complete(MpuObjectSize=len(first) + len(last) + 1)
    with s3_error("InvalidRequest", 400):
        complete(ChecksumSHA256=checksum_b64("sha256", first + last))
    # Part 1 carries SHA256 too: a wrong one listed is InvalidPart.
    parts = [{"PartNumber": 1, "ETag": etags[0], "ChecksumCRC32": values[0],
              "ChecksumSHA256": checksum_b64("sha256", last)},
             {"PartNumber": 2, "ETag": etags[1]}]
    with s3_error("InvalidPart", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="e", UploadId=uid,
                                     MultipartUpload={"Parts": parts})
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="e")["Uploads"]
    # A part may list every checksum it carries (as Java's SDK copies
    # them), another may list none, and the COMPOSITE value may come with
    # or without its -N.
    want = composite("crc32", values)
    parts[0]["ChecksumSHA256"] = checksum_b64("sha256", first)
    done = s3.complete_multipart_upload(Bucket=bucket, Key="e", UploadId=uid,
                                        MultipartUpload={"Parts": parts},
                                        ChecksumCRC32=want.split("-")[0])
    assert done["ChecksumCRC32"] == want
    # A retried completion answers the same, checksum included.
    again = complete()
    assert again["ChecksumCRC32"] == want and again["ETag"] == done["ETag"]

    # An upload created without an algorithm: a completion naming the
    # object's checksum is verified and kept when every part carries one of
    # that algorithm (SDKs send CRC32 with each part), else taken unchecked
    # and not kept. A type without a checksum, or one that does not go with
    # the algorithm, is InvalidRequest.
    for name, body, header in (("plain", b"abc", {"x-amz-checksum-crc32": checksum_b64("crc32", b"abc")}),
                               ("bare", b"def", {})):
        uid = s3.create_multipart_upload(Bucket=bucket, Key=name)["UploadId"]
        r = upload_part_raw(server, bucket, name, uid, 1, body, header)
        assert r.status == 200, r.body
        parts = {"Parts": [{"PartNumber": 1, "ETag": r.headers["etag"]}]}
        for bad, code in (({"ChecksumCRC32": checksum_b64("crc32", b"xyz")},
                           "BadDigest" if header else None),
                          ({"ChecksumType": "FULL_OBJECT"}, "InvalidRequest"),
                          ({"ChecksumSHA256": checksum_b64("sha256", body),
                            "ChecksumType": "FULL_OBJECT"}, "InvalidRequest")):
            if code is None:
                continue
            with s3_error(code, 400):
                s3.complete_multipart_upload(Bucket=bucket, Key=name, UploadId=uid,
                                             MultipartUpload=parts, **bad)
        done = s3.complete_multipart_upload(Bucket=bucket, Key=name, UploadId=uid,
                                            MultipartUpload=parts,
                                            ChecksumCRC32=checksum_b64("crc32", body))
        head = s3.head_object(Bucket=bucket, Key=name, ChecksumMode="ENABLED")
        if header:
            assert done["ChecksumCRC32"] == checksum_b64("crc32", body)
            assert head["ChecksumCRC32"] == checksum_b64("crc32", body)
            assert head["ChecksumType"] == "FULL_OBJECT"
        else:
            assert "ChecksumCRC32" not in done and "ChecksumCRC32" not in head


def test_copies_and_checksums(server, s3, bucket):
    """UploadPartCopy sums the copied range with the upload's algorithm; a
    copy of a COMPOSITE object drops that checksum (the copy has no parts);
    CopyObject with x-amz-checksum-algorithm sums the copy anew."""
    src = block(20, PART + 5000)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="cp", ChecksumAlgorithm="CRC32C",
                                     ChecksumType="FULL_OBJECT")["UploadId"]
    first = s3.upload_part_copy(Bucket=bucket, Key="cp", UploadId=uid, PartNumber=1,
                                CopySource={"Bucket": bucket, "Key": "src"},
                                CopySourceRange=f"bytes=0-{PART - 1}")["CopyPartResult"]
    assert first["ChecksumCRC32C"] == checksum_b64("crc32c", src[:PART])
    second = s3.upload_part_copy(Bucket=bucket, Key="cp", UploadId=uid, PartNumber=2,
                                 CopySource={"Bucket": bucket, "Key": "src"},
                                 CopySourceRange=f"bytes={PART}-{len(src) - 1}")["CopyPartResult"]
    assert second["ChecksumCRC32C"] == checksum_b64("crc32c", src[PART:])
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="cp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first["ETag"]},
                                   {"PartNumber": 2, "ETag": second["ETag"]}]})
    assert done["ChecksumCRC32C"] == checksum_b64("crc32c", src)
    assert done["ChecksumType"] == "FULL_OBJECT"

    uid = s3.create_multipart_upload(Bucket=bucket, Key="comp",
                                     ChecksumAlgorithm="SHA256")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="comp", UploadId=uid, PartNumber=1,
                          Body=b"composite")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="comp", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.head_object(Bucket=bucket, Key="comp",
                          ChecksumMode="ENABLED")["ChecksumSHA256"].endswith("-1")
    s3.copy_object(Bucket=bucket, Key="comp-copy", CopySource={"Bucket": bucket, "Key": "comp"})
    head = s3.head_object(Bucket=bucket, Key="comp-copy", ChecksumMode="ENABLED")
    assert "ChecksumSHA256" not in head
    r = s3.copy_object(Bucket=bucket, Key="comp-summed", ChecksumAlgorithm="CRC32",
                       CopySource={"Bucket": bucket, "Key": "comp"})
    assert r["CopyObjectResult"]["ChecksumCRC32"] == checksum_b64("crc32", b"composite")
    head = s3.head_object(Bucket=bucket, Key="comp-summed", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == checksum_b64("crc32", b"composite")
    assert head["ChecksumType"] == "FULL_OBJECT" and "ChecksumSHA256" not in head


def test_boto3_upload_file_checksums(s3, bucket, tmp_path):
    """boto3's managed upload (what most training code calls) in parts:
    whatever checksum it asks for is computed right, and the download
    (which validates a FULL_OBJECT checksum) succeeds."""
    from boto3.s3.transfer import TransferConfig
    data = block(30, 2 * PART + 123)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
    s3.upload_file(str(path), bucket, "managed", Config=config)
    head = s3.head_object(Bucket=bucket, Key="managed", ChecksumMode="ENABLED")
    assert head["ETag"].endswith('-3"')
    for alg in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256"):
        value = head.get(f"Checksum{alg.upper()}")
        if value is None:
            continue
        if head["ChecksumType"] == "COMPOSITE":
            pieces = [data[i:i + PART] for i in range(0, len(data), PART)]
            assert value == composite(alg, [checksum_b64(alg, p) for p in pieces])
        else:
            assert value == checksum_b64(alg, data)
    out = tmp_path / "back.bin"
    s3.download_file(bucket, "managed", str(out))
    assert out.read_bytes() == data


def test_upload_checksum_survives_restart(server_factory):
    """The upload's choice is durable: parts uploaded after a kill -9 are
    summed with it, and the completion combines them."""
    srv = server_factory(shards=2)
    s3 = srv.client()
    s3.create_bucket(Bucket="ck-restart")
    uid = s3.create_multipart_upload(Bucket="ck-restart", Key="k", ChecksumAlgorithm="CRC32",
                                     ChecksumType="FULL_OBJECT")["UploadId"]
    first = block(40, PART)
    e1 = s3.upload_part(Bucket="ck-restart", Key="k", UploadId=uid, PartNumber=1,
                        Body=first)["ETag"]
    srv.kill9()
    srv.restart()
    s3 = srv.client()
    last = b"after the restart"
    r = upload_part_raw(srv, "ck-restart", "k", uid, 2, last)
    assert r.status == 200 and r.headers["x-amz-checksum-crc32"] == checksum_b64("crc32", last)
    done = s3.complete_multipart_upload(
        Bucket="ck-restart", Key="k", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1},
                                   {"PartNumber": 2, "ETag": r.headers["etag"]}]})
    assert done["ChecksumCRC32"] == checksum_b64("crc32", first + last)
    assert done["ChecksumType"] == "FULL_OBJECT"


def test_completion_of_ten_thousand_parts_with_checksums_parses(server, s3, bucket):
    """A CompleteMultipartUpload body listing 10,000 parts, each with the
    checksums SDKs copy from UploadPart (about 3 MB) is read and judged:
    here InvalidPart (the parts were never uploaded), not a size error."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key="many",
                                     ChecksumAlgorithm="SHA256")["UploadId"]
    value = checksum_b64("sha256", b"x")
    parts = [{"PartNumber": n, "ETag": f'"{md5_hex(str(n).encode())}"',
              "ChecksumSHA256": value, "ChecksumCRC32": "AAAAAA=="}
             for n in range(1, 10_001)]
    with s3_error("InvalidPart", 400):
        s3.complete_multipart_upload(Bucket=bucket, Key="many", UploadId=uid,
                                     MultipartUpload={"Parts": parts})
    s3.abort_multipart_upload(Bucket=bucket, Key="many", UploadId=uid)
