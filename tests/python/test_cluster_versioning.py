"""S3 versioning on a replicated cluster (issue 18): R = 3, three nodes on
127.0.0.2-4 in zones z1-z3 (every node holds every key), real etcd.

Each version of a key is copied to the key's replicas as a key of its own
(its index key `\\0v/KEY\\0ID` in the digests); a version id is the
version's replication stamp, so every replica holds a version under the
id its primary answered, and a node that takes over a group lists, reads
and orders the versions as the old primary did.

* `test_versions_survive_the_primary`: versions, delete markers, versions
  removed by id, a suspended bucket's null version and its re-enabled
  writes, through every door (boto3); every door lists the same versions
  (paged), every version reads back by id, and the replicas' digests
  agree. n2 killed with kill -9: the survivors list and read every version
  as before, and new versions of n2's keys come after the old ones; n2
  returns (its stores having taken far fewer records meanwhile), catches
  up (versions included), its door lists the same, and the versions it
  writes once it leads again are the newest.
"""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from conftest import unique_bucket_name
from test_cluster_membership import LEASE_TTL_S, wait_for  # noqa: F401
from test_cluster_replication import (  # noqa: F401  (etcd, cluster: fixtures)
    REPAIR_S,
    SYNC_TIMEOUT_S,
    cluster,
    compare_digests,
    digest,
    etcd,
    settle,
    wait_synced,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEYS = [f"v/{i:02d}" for i in range(12)]


def body(key: str, n: int) -> bytes:
    return f"{key} version {n} ".encode() * (n + 3)


def listed(client, bucket: str, page: int = 7, prefix: str = "") -> dict[str, dict[str, list]]:
    """Every key's versions as ListObjectVersions pages them (`page` a
    page), in the order the server lists them: key -> {"versions": [(id,
    latest, ETag)], "markers": [(id, latest)]}, each newest first. Checks
    that no version is listed twice."""
    out: dict[str, dict[str, list]] = {}
    kw: dict = {}
    seen = []
    for _ in range(500):
        r = client.list_object_versions(Bucket=bucket, MaxKeys=page, Prefix=prefix, **kw)
        for v in r.get("Versions", []):
            seen.append((v["Key"], v["VersionId"]))
            out.setdefault(v["Key"], {"versions": [], "markers": []})["versions"].append(
                (v["VersionId"], v["IsLatest"], v["ETag"].strip('"')))
        for m in r.get("DeleteMarkers", []):
            seen.append((m["Key"], m["VersionId"]))
            out.setdefault(m["Key"], {"versions": [], "markers": []})["markers"].append(
                (m["VersionId"], m["IsLatest"]))
        if not r["IsTruncated"]:
            break
        kw = {"KeyMarker": r["NextKeyMarker"]}
        if r.get("NextVersionIdMarker"):
            kw["VersionIdMarker"] = r["NextVersionIdMarker"]
    else:
        raise AssertionError("the listing did not end")
    assert len(seen) == len(set(seen)), f"a version was listed twice: {seen}"
    return out


def expected(model: dict[str, list]) -> dict[str, dict[str, list]]:
    """The model as `listed` shows it (newest first, as the model is)."""
    out = {}
    for key, vs in model.items():
        if not vs:
            continue
        out[key] = {
            "versions": [(vid, i == 0, etag) for i, (vid, etag, _) in enumerate(vs)
                         if etag is not None],
            "markers": [(vid, i == 0) for i, (vid, etag, _) in enumerate(vs) if etag is None],
        }
    return out


def retried(call, tries: int = 20):
    """`call`, again after a 503 (groups changing hands after a failure)."""
    for attempt in range(tries):
        try:
            return call()
        except ClientError as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] != 503 or attempt == tries - 1:
                raise
            time.sleep(0.5)


def check_doors(doors, bucket: str, model: dict[str, list], when: str) -> None:
    want = expected(model)
    for node in doors:
        client = node.client()
        got = listed(client, bucket)
        assert got == want, f"{when}: {node.node_name}'s door lists other versions:\n{got}\nwant\n{want}"
        for key, vs in model.items():
            for vid, etag, data in vs:
                if etag is None:
                    continue
                r = client.get_object(Bucket=bucket, Key=key, VersionId=vid)
                assert r["Body"].read() == data, f"{when}: {node.node_name}: {key} {vid}"
            if vs and vs[0][1] is not None:
                r = client.get_object(Bucket=bucket, Key=key)
                assert r["Body"].read() == vs[0][2], f"{when}: {node.node_name}: {key} current"
                assert r.get("VersionId") == vs[0][0]
            elif vs:
                with pytest.raises(ClientError) as e:
                    client.get_object(Bucket=bucket, Key=key)
                assert e.value.response["Error"]["Code"] == "NoSuchKey", (when, key)


def agree(nodes, bucket: str, when: str) -> None:
    """Every node's digest holds the same live versions (index keys)."""
    deadline = time.monotonic() + REPAIR_S
    while True:
        digests = {n.node_name: {k: v for k, v in digest(n).items() if k[0] == bucket}
                   for n in nodes}
        problems = compare_digests(digests)
        versions = {name: sum(1 for (_, k) in d if k.startswith("\0v/")) for name, d in digests.items()}
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems, f"{when}: the replicas disagree:\n" + "\n".join(problems[:20])
    assert all(n > 0 for n in versions.values()), f"{when}: no version copied: {versions}"


def test_versions_survive_the_primary(cluster):
    n1, n2, n3 = cluster.nodes
    doors = [n1, n2, n3]
    bucket = unique_bucket_name("versioned")
    n1.client().create_bucket(Bucket=bucket)
    n2.client().put_bucket_versioning(Bucket=bucket,
                                      VersioningConfiguration={"Status": "Enabled"})
    # key -> [(version id, ETag or None for a marker, bytes)], newest first.
    model: dict[str, list] = {k: [] for k in KEYS}

    def put(door, key: str, n: int):
        """A PUT of version `n` of `key`; after a 503 it is sent again,
        and versions the failed tries left (stored on the primary, not
        acknowledged) join the model once listed (they are `n`'s bytes)."""
        data = body(key, n)
        failed = 0
        for attempt in range(20):
            try:
                r = door.client().put_object(Bucket=bucket, Key=key, Body=data)
                break
            except ClientError as e:
                if e.response["ResponseMetadata"]["HTTPStatusCode"] != 503 or attempt == 19:
                    raise
                failed += 1
                time.sleep(0.5)
        if failed:
            # The newest versions above the model's newest are this PUT's.
            known = {vid for vid, _, _ in model[key]}
            got = listed(door.client(), bucket, prefix=key).get(key, {"versions": []})
            for vid, _, etag in reversed(got["versions"]):
                if vid not in known and vid != r["VersionId"]:
                    model[key].insert(0, (vid, etag, data))
        model[key].insert(0, (r["VersionId"], r["ETag"].strip('"'), data))

    step = 0
    for n in range(3):
        for i, key in enumerate(KEYS):
            put(doors[(i + n) % 3], key, n)
            step += 1
    # Delete markers (the current version hidden) ...
    for i, key in enumerate(KEYS[:3]):
        r = doors[i % 3].client().delete_object(Bucket=bucket, Key=key)
        assert r["DeleteMarker"] is True
        model[key].insert(0, (r["VersionId"], None, b""))
    # ... versions removed for good (the middle one, and one key's marker).
    for i, key in enumerate(KEYS[3:6]):
        vid = model[key][1][0]
        doors[(i + 1) % 3].client().delete_object(Bucket=bucket, Key=key, VersionId=vid)
        model[key] = [v for v in model[key] if v[0] != vid]
    marker = model[KEYS[0]][0][0]
    n3.client().delete_object(Bucket=bucket, Key=KEYS[0], VersionId=marker)
    model[KEYS[0]].pop(0)
    # Suspended: a PUT writes the null version (newest); enabled again: a
    # real version after it.
    n1.client().put_bucket_versioning(Bucket=bucket,
                                      VersioningConfiguration={"Status": "Suspended"})
    time.sleep(LEASE_TTL_S / 3 + 0.5)   # the catalog change reaches every node
    for key in KEYS[6:9]:
        data = body(key, 9)
        r = n2.client().put_object(Bucket=bucket, Key=key, Body=data)
        assert r.get("VersionId", "null") == "null", r.get("VersionId")
        model[key].insert(0, ("null", r["ETag"].strip('"'), data))
    n1.client().put_bucket_versioning(Bucket=bucket,
                                      VersioningConfiguration={"Status": "Enabled"})
    time.sleep(LEASE_TTL_S / 3 + 0.5)
    put(n3, KEYS[8], 10)

    # A DELETE naming a version that never was (here the largest id, whose
    # tombstone would lift every later id of the key) changes nothing and
    # copies nothing.
    for vid in ("0000000000000000", "0000000000000001"):
        n1.client().delete_object(Bucket=bucket, Key=KEYS[9], VersionId=vid)
    check_doors(doors, bucket, model, "all up")
    agree(doors, bucket, "all up")
    for n in doors:
        held = [k for (b, k) in digest(n) if b == bucket and k.startswith(f"\0v/{KEYS[9]}\0")]
        assert len(held) == len(model[KEYS[9]]), (n.node_name, held)

    # n2 dies: the groups it led go to the survivors, which hold every
    # version under its id.
    n2.kill9()
    wait_for(cluster.urls, "n2", "down", timeout=LEASE_TTL_S * 4)
    settle(cluster, [n1, n3])
    check_doors([n1, n3], bucket, model, "n2 down")
    # Many overwrites while n2 is down: the survivors' stores take many
    # more records than n2's catch-up will (it copies final states only),
    # so a version id drawn from a store's own seq would be lower on n2
    # than the ids the survivors gave meanwhile.
    scratch = unique_bucket_name("churn")
    n1.client().create_bucket(Bucket=scratch)
    churn = n1.client()
    for rnd in range(8):
        for i in range(40):
            retried(lambda: churn.put_object(Bucket=scratch, Key=f"c/{i:02d}", Body=b"x" * rnd))

    # New versions of every key come after the old ones (ids are stamps,
    # increasing across primaries).
    for i, key in enumerate(KEYS):
        put([n1, n3][i % 2], key, 20)
    check_doors([n1, n3], bucket, model, "n2 down, new versions")
    # n2 returns on its data, catches up (versions too), and agrees.
    n2.start(timeout=SYNC_TIMEOUT_S)
    wait_synced(cluster.urls, ["n1", "n2", "n3"])
    settle(cluster, doors)
    agree(doors, bucket, "n2 back")
    check_doors(doors, bucket, model, "n2 back")
    # n2 leads its groups again: its new versions are the newest.
    for i, key in enumerate(KEYS):
        put(doors[i % 3], key, 30)
    check_doors(doors, bucket, model, "n2 back, new versions")
    agree(doors, bucket, "n2 back, new versions")
