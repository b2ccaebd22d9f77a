"""What must survive a restart (graceful and SIGKILL) and a compaction:

* a deleted bucket stays deleted (HEAD 404, not listed, PUT NoSuchBucket),
  and a deleted object stays deleted;
* an object's metadata: Content-Type, user metadata, stored headers
  (Cache-Control, Content-Disposition, Content-Encoding), the ETag (also a
  multipart one) and the stored checksum, byte for byte, after its segment
  was compacted and after a restart.

Small segments (4 MiB) so that deleting filler objects leaves a sealed
segment mostly garbage and the compactor rewrites it (seen in
percore_compaction_segments_total and in the segment files)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from botocore.exceptions import ClientError

from conftest import Server, unique_bucket_name

MiB = 1 << 20


def metric_value(srv, name: str) -> float:
    import re
    import urllib.request
    body = urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/metrics",
                                  timeout=5).read().decode()
    values = [float(m.group(2)) for m in
              (re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line) for line in body.splitlines())
              if m]
    assert values, f"metric {name} not exported"
    return sum(values)


def status(call) -> int:
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_deleted_bucket_stays_deleted_after_a_restart(server_factory, stop):
    srv = server_factory(shards=2)
    s3 = srv.client()
    gone, kept = unique_bucket_name("gone"), unique_bucket_name("kept")
    s3.create_bucket(Bucket=gone)
    s3.create_bucket(Bucket=kept)
    s3.put_object(Bucket=gone, Key="a", Body=b"a")
    s3.put_object(Bucket=kept, Key="a", Body=b"kept")
    s3.put_object(Bucket=kept, Key="deleted", Body=b"deleted")
    s3.delete_object(Bucket=gone, Key="a")
    s3.delete_object(Bucket=kept, Key="deleted")
    s3.delete_bucket(Bucket=gone)
    assert status(lambda: s3.head_bucket(Bucket=gone)) == 404
    if stop == "sigterm":
        srv.terminate()
    else:
        srv.kill9()
    for round_ in range(2):  # and once more: the state after recovery is durable too
        srv.start()
        s3 = srv.client()
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert gone not in names and kept in names, (round_, names)
        assert status(lambda: s3.head_bucket(Bucket=gone)) == 404
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=gone, Key="b", Body=b"b")
        assert e.value.response["Error"]["Code"] == "NoSuchBucket"
        assert s3.get_object(Bucket=kept, Key="a")["Body"].read() == b"kept"
        assert status(lambda: s3.head_object(Bucket=kept, Key="deleted")) == 404
        srv.kill9() if round_ == 0 else None
    # The name can be used again, empty.
    s3.create_bucket(Bucket=gone)
    assert s3.list_objects_v2(Bucket=gone)["KeyCount"] == 0


def describe(s3, bucket: str, key: str) -> dict:
    h = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return {
        "etag": h["ETag"],
        "type": h["ContentType"],
        "meta": h["Metadata"],
        "cache": h.get("CacheControl"),
        "disposition": h.get("ContentDisposition"),
        "encoding": h.get("ContentEncoding"),
        "sha256": h.get("ChecksumSHA256"),
        "crc32": h.get("ChecksumCRC32"),
        "size": h["ContentLength"],
        "md5": hashlib.md5(body).hexdigest(),
    }


def test_metadata_and_checksums_survive_compaction_and_restart(server_factory, tmp_path):
    conf = tmp_path / "percore.toml"
    conf.write_text("segment_bytes_max = 4194304\n")
    srv = server_factory(shards=1, extra_args=["--config", str(conf)])
    s3 = srv.client()
    bucket = unique_bucket_name("meta")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="typed", Body=os.urandom(5000),
                  ContentType="application/x-percore-test",
                  Metadata={"owner": "team-a", "Mixed-Case": "Value with spaces"},
                  CacheControl="max-age=60", ContentDisposition='attachment; filename="t.bin"',
                  ContentEncoding="identity", ChecksumAlgorithm="SHA256")
    s3.put_object(Bucket=bucket, Key="crc", Body=os.urandom(70000), ChecksumAlgorithm="CRC32",
                  Metadata={"n": "1"})
    up = s3.create_multipart_upload(Bucket=bucket, Key="multi", ContentType="text/x-multi",
                                    Metadata={"parts": "2"})["UploadId"]
    parts = []
    for n, size in [(1, 5 * MiB), (2, 1000)]:
        r = s3.upload_part(Bucket=bucket, Key="multi", UploadId=up, PartNumber=n,
                           Body=os.urandom(size))
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key="multi", UploadId=up,
                                 MultipartUpload={"Parts": parts})
    # Filler that seals segments, then goes: the first segments become
    # mostly garbage.
    for i in range(6):
        s3.put_object(Bucket=bucket, Key=f"filler-{i}", Body=os.urandom(MiB))
    before = {k: describe(s3, bucket, k) for k in ("typed", "crc", "multi")}
    assert before["typed"]["sha256"] and before["crc"]["crc32"], before
    assert before["multi"]["etag"].endswith('-2"'), before["multi"]
    assert before["typed"]["meta"] == {"owner": "team-a", "mixed-case": "Value with spaces"}
    segs_before = set(p.name for p in (srv.data_dir / "shard-000").glob("seg-*.pcs"))
    compacted = metric_value(srv, "percore_compaction_segments_total")
    for i in range(6):
        s3.delete_object(Bucket=bucket, Key=f"filler-{i}")
    deadline = time.monotonic() + 30
    while metric_value(srv, "percore_compaction_segments_total") <= compacted:
        assert time.monotonic() < deadline, "no compaction within 30 s"
        time.sleep(0.2)
    segs_after = set(p.name for p in (srv.data_dir / "shard-000").glob("seg-*.pcs"))
    assert segs_before - segs_after, (segs_before, segs_after)  # a segment was rewritten away
    for k in before:
        assert describe(s3, bucket, k) == before[k], k
    srv.terminate()
    srv.start()
    s3 = srv.client()
    for k in before:
        assert describe(s3, bucket, k) == before[k], k
    for i in range(6):
        assert status(lambda: s3.head_object(Bucket=bucket, Key=f"filler-{i}")) == 404
    srv.kill9()
    srv.start()
    s3 = srv.client()
    for k in before:
        assert describe(s3, bucket, k) == before[k], k
