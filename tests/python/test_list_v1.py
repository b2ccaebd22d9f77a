"""ListObjects V1 paging by marker (IsTruncated, NextMarker with a
delimiter, the last key without), ListObjectsV2 start-after (alone and
with a continuation token) and fetch-owner (an Owner only when asked for).

Two shards: a listing is a merge of every shard's keys, and paging must
neither lose nor repeat an entry across the merge."""

from __future__ import annotations

import pytest

from conftest import Server, unique_bucket_name
from signed import request

FLAT = [f"f{i:02d}" for i in range(7)]
NESTED = [f"p{j}/o{i}" for j in range(4) for i in range(3)]
KEYS = sorted(FLAT + NESTED)
PREFIXES = [f"p{j}/" for j in range(4)]


@pytest.fixture(scope="module")
def env():
    srv = Server(shards=2, name="list-v1")
    try:
        srv.start()
        s3 = srv.client()
        bucket = unique_bucket_name("list")
        s3.create_bucket(Bucket=bucket)
        for k in KEYS:
            s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
        yield srv, s3, bucket
    finally:
        srv.close()


def test_v1_marker_paging_without_delimiter(env):
    srv, s3, bucket = env
    seen, marker, pages = [], "", 0
    while True:
        page = s3.list_objects(Bucket=bucket, MaxKeys=5, Marker=marker)
        pages += 1
        keys = [o["Key"] for o in page.get("Contents", [])]
        assert page["Marker"] == marker
        assert len(keys) <= 5 and keys == sorted(keys)
        assert all(k > marker for k in keys)
        # No delimiter: no NextMarker; the client continues from the last key.
        assert "NextMarker" not in page, page
        seen += keys
        if not page["IsTruncated"]:
            break
        assert len(keys) == 5
        marker = keys[-1]
    assert seen == KEYS
    assert pages == -(-len(KEYS) // 5)


def test_v1_next_marker_with_delimiter(env):
    srv, s3, bucket = env
    contents, prefixes, marker, truncated_pages = [], [], "", 0
    for _ in range(20):
        page = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=3, Marker=marker)
        keys = [o["Key"] for o in page.get("Contents", [])]
        pfx = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert 0 < len(keys) + len(pfx) <= 3
        contents += keys
        prefixes += pfx
        if not page["IsTruncated"]:
            assert "NextMarker" not in page
            break
        truncated_pages += 1
        # NextMarker is the last entry of the page, key or common prefix.
        assert page["NextMarker"] == max(keys + pfx), page
        marker = page["NextMarker"]
    else:
        pytest.fail("paging did not end")
    assert contents == FLAT
    assert prefixes == PREFIXES
    assert truncated_pages == (len(FLAT) + len(PREFIXES) - 1) // 3


def test_v1_marker_and_raw_xml(env):
    srv, s3, bucket = env
    page = s3.list_objects(Bucket=bucket, Marker="f03")
    assert [o["Key"] for o in page["Contents"]] == [k for k in KEYS if k > "f03"]
    assert page["IsTruncated"] is False
    # A marker past every key: an empty, complete page.
    page = s3.list_objects(Bucket=bucket, Marker="zzz")
    assert "Contents" not in page and page["IsTruncated"] is False
    # Prefix and marker together; a marker that is a common prefix skips it.
    page = s3.list_objects(Bucket=bucket, Prefix="p1/", Marker="p1/o0")
    assert [o["Key"] for o in page["Contents"]] == ["p1/o1", "p1/o2"]
    page = s3.list_objects(Bucket=bucket, Delimiter="/", Marker="p1/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["p2/", "p3/"]
    r = request(srv, "GET", f"/{bucket}", query=[("max-keys", "2"), ("marker", "f00")])
    assert r.status == 200, r.body
    assert b"<Marker>f00</Marker>" in r.body
    assert b"<IsTruncated>true</IsTruncated>" in r.body
    assert b"<Key>f01</Key>" in r.body and b"<Key>f02</Key>" in r.body
    assert b"<Key>f03</Key>" not in r.body and b"NextMarker" not in r.body
    assert b"<MaxKeys>2</MaxKeys>" in r.body


def test_v2_start_after(env):
    srv, s3, bucket = env
    page = s3.list_objects_v2(Bucket=bucket, StartAfter="f03")
    assert [o["Key"] for o in page["Contents"]] == [k for k in KEYS if k > "f03"]
    assert page["StartAfter"] == "f03" and page["KeyCount"] == len(KEYS) - 4
    # A start-after between keys, and one past the end.
    page = s3.list_objects_v2(Bucket=bucket, StartAfter="p1/o0x")
    assert page["Contents"][0]["Key"] == "p1/o1"
    page = s3.list_objects_v2(Bucket=bucket, StartAfter="zzz")
    assert page["KeyCount"] == 0 and "Contents" not in page and not page["IsTruncated"]
    # Paging with start-after: the token takes over from the second page.
    seen, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, StartAfter="f05", MaxKeys=4, **kw)
        assert page.get("StartAfter") == "f05"
        seen += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert seen == [k for k in KEYS if k > "f05"]
    # With a delimiter: after "p0/" the p0/ prefix is not repeated.
    page = s3.list_objects_v2(Bucket=bucket, Delimiter="/", StartAfter="p0/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == PREFIXES[1:]
    assert "Contents" not in page


def test_v2_fetch_owner(env):
    srv, s3, bucket = env
    plain = s3.list_objects_v2(Bucket=bucket, Prefix="f0")
    assert plain["Contents"] and all("Owner" not in o for o in plain["Contents"])
    owned = s3.list_objects_v2(Bucket=bucket, Prefix="f0", FetchOwner=True)
    assert len(owned["Contents"]) == len(plain["Contents"])
    for o in owned["Contents"]:
        assert o["Owner"]["ID"], o
    r = request(srv, "GET", f"/{bucket}", query=[("list-type", "2"), ("prefix", "f0")])
    assert r.status == 200 and b"<Owner>" not in r.body
    r = request(srv, "GET", f"/{bucket}", query=[("list-type", "2"), ("prefix", "f0"),
                                                ("fetch-owner", "false")])
    assert r.status == 200 and b"<Owner>" not in r.body
    r = request(srv, "GET", f"/{bucket}", query=[("list-type", "2"), ("prefix", "f0"),
                                                ("fetch-owner", "true")])
    assert r.status == 200 and r.body.count(b"<Owner><ID>") == len(plain["Contents"]), r.body
