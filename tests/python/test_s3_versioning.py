"""Issue 20, item 1: S3 versioning.

boto3 and the aws cli against a two-shard server: version ids on PUT,
COPY and CompleteMultipartUpload; GET/HEAD/DELETE by versionId; delete
markers; ListObjectVersions with paging; suspended buckets and null
versions; tagging, copies and DeleteObjects by version; lifecycle of
noncurrent versions. A seeded random test checks every version against a
model through kill -9 restarts, with small segments so that compaction
relocates versions under it."""

from __future__ import annotations

import hashlib
import random
import time

import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

from conftest import Server, metric, unique_bucket_name
from signed import request

MiB = 1024 * 1024
BIG = 3 * MiB + 5  # stored in extents, not inline


def error_of(call) -> tuple[str, dict]:
    with pytest.raises(ClientError) as ei:
        call()
    r = ei.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPHeaders"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    config = tmp_path_factory.mktemp("versioning") / "percore.toml"
    config.write_text(f"segment_bytes_max = {4 * MiB}\n")
    s = Server(shards=2, name="versioning",
               env={"PERCORE_LIFECYCLE_INTERVAL_S": "1", "PERCORE_LIFECYCLE_DAY_S": "1"},
               extra_args=["--config", str(config)])
    s.start()
    try:
        yield s
    finally:
        s.close()


NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def raw_versions_page(srv, bucket, **params) -> ET.Element:
    """One ListObjectVersions page as XML (boto3 splits versions and
    markers into two lists and loses their order)."""
    query = sorted(params.items())
    r = request(srv, "GET", f"/{bucket}", query=[("versions", "")] + query)
    assert r.status == 200, r.body
    return ET.fromstring(r.body)


def versions_of(srv, bucket, prefix="", max_keys=1000) -> list[tuple[str, str, bool, bool]]:
    """(key, version id, is latest, is delete marker), in listing order,
    following the pages' markers."""
    out = []
    params = {"prefix": prefix, "max-keys": str(max_keys)}
    while True:
        page = raw_versions_page(srv, bucket, **params)
        n = 0
        for e in page:
            tag = e.tag.removeprefix(NS)
            if tag in ("Version", "DeleteMarker"):
                n += 1
                out.append((e.find(NS + "Key").text, e.find(NS + "VersionId").text,
                            e.find(NS + "IsLatest").text == "true", tag == "DeleteMarker"))
        assert n <= max_keys
        if page.find(NS + "IsTruncated").text != "true":
            return out
        params["key-marker"] = page.find(NS + "NextKeyMarker").text
        vm = page.find(NS + "NextVersionIdMarker")
        if vm is not None:
            params["version-id-marker"] = vm.text
        else:
            params.pop("version-id-marker", None)


def test_versions_markers_and_reads(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("ver")
    s3.create_bucket(Bucket=bucket)
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    # Before versioning: no version ids shown, the object is the null version.
    r = s3.put_object(Bucket=bucket, Key="k", Body=b"v0")
    assert "VersionId" not in r
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"v1")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"x" * BIG)["VersionId"]
    assert v1 != v2 and "null" not in (v1, v2)
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["VersionId"] == v2 and got["Body"].read() == b"x" * BIG
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1)["Body"].read() == b"v1"
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"v0"
    head = s3.head_object(Bucket=bucket, Key="k", VersionId=v1)
    assert head["ContentLength"] == 2 and head["VersionId"] == v1
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1, Range="bytes=1-1")["Body"].read() == b"1"
    assert versions_of(srv, bucket) == [("k", v2, True, False), ("k", v1, False, False),
                                       ("k", "null", False, False)]
    # A DELETE writes a delete marker; the versions stay.
    d = s3.delete_object(Bucket=bucket, Key="k")
    assert d["DeleteMarker"] is True
    marker = d["VersionId"]
    code, headers = error_of(lambda: s3.get_object(Bucket=bucket, Key="k"))
    assert code == "NoSuchKey"
    assert headers["x-amz-delete-marker"] == "true" and headers["x-amz-version-id"] == marker
    code, headers = error_of(lambda: s3.head_object(Bucket=bucket, Key="k"))
    assert code == "404" and headers["x-amz-delete-marker"] == "true"
    code, headers = error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId=marker))
    assert code == "MethodNotAllowed" and headers["x-amz-delete-marker"] == "true"
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert versions_of(srv, bucket)[0] == ("k", marker, True, True)
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1)["Body"].read() == b"v1"
    # Removing the marker brings the object back; removing a version for
    # good leaves the one before it current.
    d = s3.delete_object(Bucket=bucket, Key="k", VersionId=marker)
    assert d["DeleteMarker"] is True and d["VersionId"] == marker
    assert s3.get_object(Bucket=bucket, Key="k")["VersionId"] == v2
    s3.delete_object(Bucket=bucket, Key="k", VersionId=v2)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v1"
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId=v2))[0] == "NoSuchVersion"
    # Ids that are not ids are refused, not ignored.
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId="nope"))[0] == "InvalidArgument"
    assert error_of(lambda: s3.delete_object(Bucket=bucket, Key="k", VersionId="x" * 16))[0] == "InvalidArgument"
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v1"
    # A bucket holding versions or markers is not empty.
    s3.delete_object(Bucket=bucket, Key="k")
    assert error_of(lambda: s3.delete_bucket(Bucket=bucket))[0] == "BucketNotEmpty"
    for _, vid, _, _ in versions_of(srv, bucket):
        s3.delete_object(Bucket=bucket, Key="k", VersionId=vid)
    assert versions_of(srv, bucket) == []
    s3.delete_bucket(Bucket=bucket)


def test_suspended_bucket_null_versions(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("susp")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"one")["VersionId"]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"
    assert s3.put_object(Bucket=bucket, Key="k", Body=b"two")["VersionId"] == "null"
    assert s3.put_object(Bucket=bucket, Key="k", Body=b"three")["VersionId"] == "null"
    # The second null version replaced the first; the real version stays.
    assert versions_of(srv, bucket) == [("k", "null", True, False), ("k", v1, False, False)]
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"three" and got["VersionId"] == "null"
    d = s3.delete_object(Bucket=bucket, Key="k")
    assert d["DeleteMarker"] is True and d["VersionId"] == "null"
    assert versions_of(srv, bucket) == [("k", "null", True, True), ("k", v1, False, False)]
    s3.delete_object(Bucket=bucket, Key="k", VersionId="null")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"
    # Enabled again: new real versions over the old ones.
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v3 = s3.put_object(Bucket=bucket, Key="k", Body=b"four")["VersionId"]
    assert [v[1] for v in versions_of(srv, bucket)] == [v3, v1]
    bad = b"<VersioningConfiguration><Status>Off</Status></VersioningConfiguration>"
    code = error_of(lambda: s3.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Off"}))[0]
    assert code == "MalformedXML", bad


def test_copy_multipart_tags_and_batch_delete(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("vermisc")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="src", Body=b"first", Tagging="a=1")["VersionId"]
    s3.put_object(Bucket=bucket, Key="src", Body=b"second")
    # Copy from a named version; the copy is a new version of its key.
    c = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src", "VersionId": v1})
    assert c["CopySourceVersionId"] == v1 and c["VersionId"] not in ("null", v1)
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"first"
    # Restoring an old version onto its own key.
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src", "VersionId": v1})
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == b"first"
    assert len(versions_of(srv, bucket, "src")) == 3
    # Tags of a named version, current or not.
    t = s3.get_object_tagging(Bucket=bucket, Key="src", VersionId=v1)
    assert t["TagSet"] == [{"Key": "a", "Value": "1"}] and t["VersionId"] == v1
    s3.put_object_tagging(Bucket=bucket, Key="src", VersionId=v1,
                          Tagging={"TagSet": [{"Key": "b", "Value": "2"}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="src", VersionId=v1)["TagSet"] == [{"Key": "b", "Value": "2"}]
    assert s3.get_object(Bucket=bucket, Key="src", VersionId=v1)["Body"].read() == b"first"
    # The rewrite kept the version's place: the newest is still current.
    assert versions_of(srv, bucket, "src")[-1][1] == v1
    # Multipart completion makes a version.
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=1, Body=b"a" * (5 * MiB))["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=2, Body=b"b" * 10)["ETag"]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    mv = done["VersionId"]
    s3.put_object(Bucket=bucket, Key="mp", Body=b"over")
    assert s3.get_object(Bucket=bucket, Key="mp", VersionId=mv)["ContentLength"] == 5 * MiB + 10
    # DeleteObjects: markers without ids, removal with them.
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "dst"}, {"Key": "mp", "VersionId": mv}, {"Key": "src", "VersionId": "bogus"}]})
    deleted = {d["Key"]: d for d in r["Deleted"]}
    assert deleted["dst"]["DeleteMarker"] is True and deleted["dst"]["DeleteMarkerVersionId"]
    assert deleted["mp"]["VersionId"] == mv
    assert [e["Key"] for e in r["Errors"]] == ["src"]
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="mp", VersionId=mv))[0] == "NoSuchVersion"
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="dst"))[0] == "NoSuchKey"


def test_list_versions_paging_and_prefixes(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("verlist")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    want = []
    for i in range(12):
        key = f"d{i % 3}/k{i:02d}"
        ids = [s3.put_object(Bucket=bucket, Key=key, Body=f"{key}-{n}".encode())["VersionId"]
               for n in range(1 + i % 4)]
        if i % 5 == 0:
            ids.append(s3.delete_object(Bucket=bucket, Key=key)["VersionId"])
        want += [(key, vid, n == 0) for n, vid in enumerate(reversed(ids))]
    want.sort(key=lambda e: e[0])  # stable: versions stay newest first
    full = s3.list_object_versions(Bucket=bucket)
    assert not full["IsTruncated"]
    # Every page size, following the markers, gives the same listing.
    for size in (1, 2, 3, 7, 50):
        assert [r[:3] for r in versions_of(srv, bucket, max_keys=size)] == want, size
    # A delimiter folds keys into common prefixes.
    page = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["d0/", "d1/", "d2/"]
    assert "Versions" not in page
    # ListObjects shows the current versions that are objects.
    # Version ids are unique within a key (two keys may share one).
    markers = {(m["Key"], m["VersionId"]) for m in full.get("DeleteMarkers", [])}
    live = {k for k, v, latest in want if latest and (k, v) not in markers}
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == live
    # A version marker without a key marker is refused.
    with pytest.raises(ClientError):
        s3.list_object_versions(Bucket=bucket, VersionIdMarker=want[0][1])


def test_aws_cli_versioning(srv, tmp_path):
    from conftest import AwsCli
    aws = AwsCli(srv.endpoint, tmp_path)
    bucket = unique_bucket_name("vercli")
    aws.s3api("create-bucket", "--bucket", bucket)
    aws.s3api("put-bucket-versioning", "--bucket", bucket,
              "--versioning-configuration", "Status=Enabled")
    assert aws.s3api("get-bucket-versioning", "--bucket", bucket)["Status"] == "Enabled"
    body = tmp_path / "body"
    ids = []
    for n in range(3):
        body.write_bytes(f"cli-{n}".encode())
        ids.append(aws.s3api("put-object", "--bucket", bucket, "--key", "f",
                             "--body", str(body))["VersionId"])
    listed = aws.s3api("list-object-versions", "--bucket", bucket)
    assert [v["VersionId"] for v in listed["Versions"]] == list(reversed(ids))
    out = tmp_path / "out"
    aws.s3api("get-object", "--bucket", bucket, "--key", "f", "--version-id", ids[0], str(out))
    assert out.read_bytes() == b"cli-0"


def test_lifecycle_noncurrent_versions(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("verlc")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for n in range(3):
        s3.put_object(Bucket=bucket, Key="ckpt/a", Body=f"a{n}".encode())
    s3.put_object(Bucket=bucket, Key="keep/b", Body=b"b0")
    s3.put_object(Bucket=bucket, Key="keep/b", Body=b"b1")
    s3.put_object(Bucket=bucket, Key="ckpt/gone", Body=b"g")
    s3.delete_object(Bucket=bucket, Key="ckpt/gone")
    kept = [s3.put_object(Bucket=bucket, Key="two/c", Body=f"c{n}".encode())["VersionId"]
            for n in range(5)]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "old", "Status": "Enabled", "Filter": {"Prefix": "ckpt/"},
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1}},
        {"ID": "markers", "Status": "Enabled", "Filter": {"Prefix": "ckpt/"},
         "Expiration": {"ExpiredObjectDeleteMarker": True}},
        {"ID": "keep-two", "Status": "Enabled", "Filter": {"Prefix": "two/"},
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1, "NewerNoncurrentVersions": 2}},
    ]})
    # A lifecycle day is a second here; passes run every second.
    deadline = time.time() + 30
    while time.time() < deadline:
        keys = [(k, latest, marker) for k, _, latest, marker in versions_of(srv, bucket)]
        if keys == [("ckpt/a", True, False), ("keep/b", True, False), ("keep/b", False, False),
                    ("two/c", True, False), ("two/c", False, False), ("two/c", False, False)]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"lifecycle left {versions_of(srv, bucket)}")
    assert s3.get_object(Bucket=bucket, Key="ckpt/a")["Body"].read() == b"a2"
    # The current version and the two newest noncurrent ones are kept.
    assert [v[1] for v in versions_of(srv, bucket, "two/")] == kept[:1:-1]
    assert metric(srv, "percore_lifecycle_expired_objects_total") >= 5


class Model:
    """Per key, its versions newest first: (version id, body md5 or None
    for a delete marker)."""

    def __init__(self):
        self.keys: dict[str, list[tuple[str, str | None]]] = {}

    def put(self, key, vid, md5):
        vs = [v for v in self.keys.get(key, []) if vid != "null" or v[0] != "null"]
        self.keys[key] = [(vid, md5)] + vs

    def remove(self, key, vid):
        self.keys[key] = [v for v in self.keys.get(key, []) if v[0] != vid]

    def listing(self):
        return [(k, vid, i == 0, md5 is None)
                for k in sorted(self.keys) for i, (vid, md5) in enumerate(self.keys[k])]


def check_model(srv, s3, bucket, model: Model, rng: random.Random):
    assert versions_of(srv, bucket) == model.listing()
    assert versions_of(srv, bucket, max_keys=rng.randint(1, 7)) == model.listing()
    for key, vs in model.keys.items():
        if not vs or vs[0][1] is None:
            code, headers = error_of(lambda: s3.get_object(Bucket=bucket, Key=key))
            assert code == "NoSuchKey"
            assert (headers.get("x-amz-delete-marker") == "true") == bool(vs)
        else:
            got = s3.get_object(Bucket=bucket, Key=key)
            assert got["VersionId"] == vs[0][0]
            assert hashlib.md5(got["Body"].read()).hexdigest() == vs[0][1]
        for vid, md5 in rng.sample(vs, min(2, len(vs))):
            if md5 is None:
                assert error_of(lambda: s3.get_object(Bucket=bucket, Key=key, VersionId=vid))[0] == "MethodNotAllowed"
            else:
                body = s3.get_object(Bucket=bucket, Key=key, VersionId=vid)["Body"].read()
                assert hashlib.md5(body).hexdigest() == md5


def test_versions_against_a_model_through_restarts(srv):
    rng = random.Random(2020)
    s3 = srv.client()
    bucket = unique_bucket_name("vermodel")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    mode = "Enabled"
    model = Model()
    keys = [f"m/{i:02d}" for i in range(10)]
    compacted = 0  # segments compacted under the test (counters restart with the server)
    for step in range(700):
        key = rng.choice(keys)
        x = rng.random()
        if x < 0.45:
            body = rng.randbytes(rng.choice([0, 100, 40_000, 200_000, 900_000]))
            vid = s3.put_object(Bucket=bucket, Key=key, Body=body)["VersionId"]
            assert (vid == "null") == (mode == "Suspended")
            model.put(key, vid, hashlib.md5(body).hexdigest())
        elif x < 0.6:
            d = s3.delete_object(Bucket=bucket, Key=key)
            assert d["DeleteMarker"] is True
            model.put(key, d["VersionId"], None)
        elif x < 0.85 and model.keys.get(key):
            vid = rng.choice(model.keys[key])[0]
            s3.delete_object(Bucket=bucket, Key=key, VersionId=vid)
            model.remove(key, vid)
        elif x < 0.88:
            mode = "Suspended" if mode == "Enabled" else "Enabled"
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": mode})
        if step % 100 == 99:
            check_model(srv, s3, bucket, model, rng)
        if step % 250 == 249:
            # Let the compactor (every second) relocate versions first.
            deadline = time.time() + 5
            while time.time() < deadline and metric(srv, "percore_compaction_segments_total") == 0:
                time.sleep(0.2)
            compacted += metric(srv, "percore_compaction_segments_total")
            srv.kill9()
            srv.restart()
            s3 = srv.client()
            check_model(srv, s3, bucket, model, rng)
    check_model(srv, s3, bucket, model, rng)
    compacted += metric(srv, "percore_compaction_segments_total")
    print(f"versions model: {sum(map(len, model.keys.values()))} versions, "
          f"{compacted:.0f} segments compacted")
    assert compacted > 0, "no compaction ran: the versions were never relocated"



def test_suspended_only_bucket_marks_deletes(srv):
    s3 = srv.client()
    bucket = unique_bucket_name("suspnew")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    assert s3.put_object(Bucket=bucket, Key="k", Body=b"x")["VersionId"] == "null"
    d = s3.delete_object(Bucket=bucket, Key="k")
    assert d["DeleteMarker"] is True and d["VersionId"] == "null"
    code, headers = error_of(lambda: s3.get_object(Bucket=bucket, Key="k"))
    assert code == "NoSuchKey"
    assert headers["x-amz-delete-marker"] == "true" and headers["x-amz-version-id"] == "null"
    assert versions_of(srv, bucket) == [("k", "null", True, True)]


def test_listing_past_many_delete_markers(srv):
    """Each shard passes over at most 10,000 keys whose current version is
    a delete marker per page (then hands back a cursor): a listing still
    reaches the live keys after 21,000 of them."""
    s3 = srv.client()
    bucket = unique_bucket_name("markers")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key="a-live", Body=b"1")
    for batch in range(21):
        r = s3.delete_objects(Bucket=bucket, Delete={"Quiet": True, "Objects": [
            {"Key": f"m/{batch:02d}/{i:04d}"} for i in range(1000)]})
        assert not r.get("Errors")
    s3.put_object(Bucket=bucket, Key="z-live", Body=b"2")
    s3.put_object(Bucket=bucket, Key="m/99/live", Body=b"3")
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["a-live", "m/99/live", "z-live"]
    assert not listed["IsTruncated"]
    # With a delimiter the markers sit inside the common prefix "m/": a
    # page never stops within it (it would list "m/" again after it).
    folded = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in folded["Contents"]] == ["a-live", "z-live"]
    assert [p["Prefix"] for p in folded["CommonPrefixes"]] == ["m/"]
    v1 = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=1)
    assert [o["Key"] for o in v1["Contents"]] == ["a-live"] and v1["IsTruncated"]
    page = s3.list_objects_v2(Bucket=bucket, StartAfter="m/99/live", MaxKeys=1)
    assert [o["Key"] for o in page["Contents"]] == ["z-live"]
