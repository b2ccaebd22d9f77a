"""Native clients on a cluster (issue 18, Must have 3): the map reaches
every node's shards; a node serves the keys whose placement group it is
the primary of and answers WrongNode for the others; the client (Rust,
through the Python package and the CLI) fetches the map from any node,
sends each key to its acting primary's owner shard, merges listings
across nodes, and fetches the map again when a node answers WrongNode. A
data directory is bound to its cluster. Real etcd, three nodes on
127.0.0.2-4, R = 3: every node stores every key, and a key's acting
primary (its group's first replica that is up and synced) serves it. The
tests check both node by node: what a node leads through its internal
listing (`keys_on`), what it stores through its digest (`keys_stored`)."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import re
import time

import pytest

import percore
from conftest import ACCESS_KEY, SECRET_KEY, Server
from test_cluster_membership import (  # noqa: F401  (etcd is a fixture)
    LEASE_TTL_S,
    Node,
    cluster_gauges,
    etcd,
    loopback_ok,
    percore as percore_cli,
    status,
    wait_epoch,
    wait_ready,
    wait_synced,
)

DIGEST = "/_percore/digest"


def native_endpoint(node: Node) -> str:
    m = re.search(rf"native endpoint: {re.escape(node.ip)}:(\d+)", node.logs(20000))
    assert m, node.logs()
    return f"{node.ip}:{m.group(1)}"


def node_id(node: Node) -> int:
    return cluster_gauges(node)["percore_cluster_node_id"]


def node_header(method: str, target: str, to: int, body: bytes = b"",
                secret: str = SECRET_KEY, sender: int | None = None,
                digest: str | None = None, relay: int | None = None) -> str:
    """`x-percore-node` as a cluster node signs it (docs/cluster.md): a
    second implementation of the contract (`relay`: the owner named by
    the `x-percore-relay` header the request carries)."""
    ms = int(time.time() * 1000)
    nonce = os.urandom(8).hex()
    digest = digest or hashlib.sha256(body).hexdigest()
    sender = to if sender is None else sender
    msg = f"percore-node-v2\n{sender}\n{to}\n{ms}\n{nonce}\n{method}\n{target}\n{digest}"
    if relay is not None:
        msg += f"\nrelay {relay}"
    tag = hmac.new(cluster_key(secret), msg.encode(), hashlib.sha256).hexdigest()
    return f"v2 {sender} {to} {ms} {nonce} {digest} {tag}"


def cluster_key(secret: str = SECRET_KEY) -> bytes:
    return hmac.new(secret.encode(), b"percore-cluster-key-v1", hashlib.sha256).digest()


def check_reply(header: str, status: int, covered: str, reply: str | None,
                secret: str = SECRET_KEY) -> None:
    """An answer to an internal request the requester acts on carries
    `x-percore-reply`, bound to the request's MAC (docs/cluster.md)."""
    msg = f"percore-reply-v1\n{header.rsplit(' ', 1)[1]}\n{status}\n{covered}"
    want = hmac.new(cluster_key(secret), msg.encode(), hashlib.sha256).hexdigest()
    assert reply is not None and hmac.compare_digest(reply, want), (status, covered, reply)


def internal(node: Node, method: str, target: str, body: bytes = b"",
             header: str | None = None) -> tuple[int, bytes]:
    if header is None:
        # A node started with its own keys (`secret_key`) derives its
        # cluster key from them.
        header = node_header(method, target, node_id(node), body,
                             secret=getattr(node, "secret_key", SECRET_KEY))
    conn = http.client.HTTPConnection(node.ip, node.s3_port, timeout=10)
    try:
        conn.request(method, target, body=body, headers={"x-percore-node": header})
        r = conn.getresponse()
        answer = r.read()
        # A JSON answer the requester acts on is signed over its body.
        if 200 <= r.status < 300:
            check_reply(header, r.status, hashlib.sha256(answer).hexdigest(),
                        r.getheader("x-percore-reply"),
                        secret=getattr(node, "secret_key", SECRET_KEY))
        return r.status, answer
    finally:
        conn.close()


def keys_on(node: Node, bucket: str) -> set[str]:
    """The keys a node leads: its internal listing lists the keys whose
    acting primary it is (its S3 listings merge every node's). What it
    stores is `keys_stored`."""
    status, body = internal(node, "GET", f"/_percore/list?bucket={bucket}&prefix=&from="
                                         "&delimiter=&max=10000")
    assert status == 200, body
    answer = json.loads(body)
    assert not answer["truncated"]
    return {item[1] for item in answer["items"] if item[0] == "o"}


def digest(node: Node, limit: int = 1000) -> dict[tuple[str, str], tuple[int, str | None]]:
    """A node's own stored state, (bucket, key) -> (stamp ms, ETag or None
    for a tombstone), read page by page from `POST /_percore/digest`.
    Checks the page contract on the way: at most `limit` items a page, in
    strictly increasing (bucket, key) order across pages, `next` moving on."""
    state: dict[tuple[str, str], tuple[int, str | None]] = {}
    after = None
    last = None
    pages = 0
    while True:
        body = json.dumps({"epoch": 0, "pgs": None, "after": after, "limit": limit}).encode()
        code, raw = internal(node, "POST", DIGEST, body)
        assert code == 200, f"{node.node_name}: digest answered {code}: {raw[:500]!r}"
        page = json.loads(raw)
        items, nxt = page["items"], page["next"]
        pages += 1
        assert len(items) <= limit, f"{node.node_name}: {len(items)} items on a page of {limit}"
        for item in items:
            assert isinstance(item, list) and len(item) == 4, f"bad digest item {item!r}"
            bucket, key, stamp, etag = item
            assert isinstance(stamp, int) and not isinstance(stamp, bool), f"bad stamp {item!r}"
            assert etag is None or isinstance(etag, str), f"bad etag {item!r}"
            where = (bucket, key)
            assert last is None or where > last, (
                f"{node.node_name}: digest item {where} after {last} (out of order or twice)")
            last = where
            state[where] = (stamp, etag)
        if nxt is None:
            return state
        nxt = tuple(nxt)
        assert after is None or nxt > after, f"{node.node_name}: digest next {nxt} after {after}"
        assert pages < 100_000, f"{node.node_name}: digest never ends"
        after = nxt  # json.dumps writes the tuple as [bucket, key]


def keys_stored(node: Node, bucket: str) -> set[str]:
    """The keys of `bucket` a node stores live (not as a tombstone) on its
    own disk, whether or not it leads them."""
    return {k for (b, k), (_, e) in digest(node).items() if b == bucket and e is not None}


def test_native_client_routes_by_the_map(etcd, tmp_path):  # noqa: F811
    urls = etcd.urls
    percore_cli("cluster", "init", "--cluster", urls, "--replicas", "3", "--pgs", "64")
    ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert all(loopback_ok(ip) for ip in ips)
    nodes = [Node(ip, f"n{i + 1}", f"z{i + 1}", urls) for i, ip in enumerate(ips)]
    by_name = {n.node_name: n for n in nodes}
    try:
        for n in nodes:
            n.start()
        # The first node to join may have read an older map, and a node
        # leads nothing until it has caught up: wait until every node is
        # synced and every node's map says so.
        epoch = wait_ready(urls, nodes)
        c = percore.Client(native_endpoint(nodes[0]))
        assert c.cluster_epoch is not None and c.cluster_epoch >= epoch

        c.create_bucket("routed")
        with pytest.raises(percore.BucketExists):
            c.create_bucket("routed")
        data = {f"k/{i:04d}": os.urandom(1 + (i * 7919) % 5000) for i in range(240)}
        for k, v in data.items():
            c.put("routed", k, v)
        owners = {k: c.owner_node("routed", k) for k in data}
        assert set(owners.values()) == {"n1", "n2", "n3"}, owners
        # Each node leads (lists) the keys whose acting primary it is, and
        # stores every key (R = 3 on three nodes).
        for name, node in by_name.items():
            assert keys_on(node, "routed") == {k for k, o in owners.items() if o == name}
            assert keys_stored(node, "routed") == set(data), name
        for k, v in data.items():
            assert c.get("routed", k) == v
            assert c.stat("routed", k).size == len(v)
        assert c.misrouted == 0 and c.map_refreshes == 0

        # A client that first connects to another node routes the same.
        c3 = percore.Client(native_endpoint(nodes[2]))
        assert c3.owner_node("routed", "k/0007") == owners["k/0007"]
        assert c3.get("routed", "k/0007") == data["k/0007"]

        # Listings merge the nodes' pages: every key once, in order, also
        # page by page.
        listed = [e.key for e in c.list("routed", limit=1000)]
        assert listed == sorted(data)
        paged, after = [], ""
        while True:
            page = c.list("routed", start_after=after, limit=17)
            paged += [e.key for e in page]
            if len(page) < 17:
                break
            after = page[-1].key
        assert paged == sorted(data)
        tops = [e.key for e in c.list("routed", delimiter="/")]
        assert tops == ["k/"]

        # The CLI is the same client.
        src = tmp_path / "file.bin"
        src.write_bytes(data["k/0001"] * 3)
        env_ep = native_endpoint(nodes[1])
        percore_cli("put", "--endpoint", env_ep, str(src), "routed/cli/file")
        got = percore_cli("stat", "--endpoint", env_ep, "routed/cli/file").stdout
        assert str(len(data["k/0001"]) * 3) in got
        cli_owner = c.owner_node("routed", "cli/file")
        assert "cli/file" in keys_on(by_name[cli_owner], "routed")
        for name, node in by_name.items():
            assert "cli/file" in keys_stored(node, "routed"), name
            assert ("cli/file" in keys_on(node, "routed")) == (name == cli_owner)

        # Deletes go to the acting primary too, and reach every replica.
        assert c.delete("routed", "k/0003") is True
        with pytest.raises(percore.NoSuchKey):
            c.get("routed", "k/0003")
        assert "k/0003" not in keys_on(by_name[owners["k/0003"]], "routed")
        for name, node in by_name.items():
            assert "k/0003" not in keys_stored(node, "routed"), name

        # The map changes (n3 drains: every group's replicas are n1 and n2,
        # and the groups n3 led get n1 or n2 as acting primary). The
        # client's map is now stale: n3 answers WrongNode for a key it no
        # longer leads, the client fetches the map and goes to the new
        # acting primary.
        old_epoch = c.cluster_epoch
        stale = percore.Client(native_endpoint(nodes[0]))
        names = [f"after/{i}" for i in range(600)]
        fresh = {k: os.urandom(100) for k in names if c.owner_node("routed", k) == "n3"}
        fresh = dict(list(fresh.items())[:20])
        assert len(fresh) == 20
        unmoved = [k for k, o in owners.items() if o != "n3" and k != "k/0003"][:10]
        percore_cli("cluster", "drain", "n3", "--cluster", urls)
        listed_nodes = wait_synced(urls, ["n1", "n2"])
        assert listed_nodes["n3"]["state"] == "draining", listed_nodes
        _, summary = status(urls)
        epoch = int(re.search(r"epoch (\d+)", summary).group(1))
        for n in nodes:
            wait_epoch(n, epoch)
        assert c.cluster_epoch == old_epoch
        for k, v in fresh.items():
            c.put("routed", k, v)
        assert c.map_refreshes >= 1 and c.cluster_epoch >= epoch
        for k, v in fresh.items():
            assert c.owner_node("routed", k) in ("n1", "n2")
            assert c.get("routed", k) == v
        # Fresh keys: led by n1 or n2, stored on both, not on n3 (no longer
        # a replica of any group).
        for name in ("n1", "n2"):
            led = keys_on(by_name[name], "routed")
            assert {k for k in fresh if c.owner_node("routed", k) == name} <= led
            assert set(fresh) <= keys_stored(by_name[name], "routed"), name
        # n3 has no entry for them at all, not even a tombstone.
        assert not {k for (b, k) in digest(by_name["n3"]) if b == "routed"} & set(fresh)
        # The draining node leads nothing.
        assert keys_on(by_name["n3"], "routed") == set()
        # A batch on a stale map: the groups a node refuses are regrouped
        # by the map fetched after the WrongNode.
        assert stale.cluster_epoch == old_epoch
        got = stale.get_batch("routed", list(fresh) + unmoved)
        assert got == [fresh[k] for k in fresh] + [data[k] for k in unmoved]
        assert stale.map_refreshes >= 1 and stale.cluster_epoch >= epoch
        assert c.misrouted == 0 and stale.misrouted == 0
        # The keys written before the drain were on all three replicas, so
        # n1 and n2 hold every one of them (k/0003 deleted everywhere), and
        # n3 keeps its copies on disk (nothing moves or drops data yet).
        kept = sorted(k for k in owners if k != "k/0003")
        before = set(kept) | {"cli/file"}
        assert keys_stored(by_name["n1"], "routed") == before | set(fresh)
        assert keys_stored(by_name["n2"], "routed") == before | set(fresh)
        assert keys_stored(by_name["n3"], "routed") == before
        # The keys n3 led are led by n1 or n2 now, which hold a copy: each
        # key is led by exactly one of them, still readable and listed, by
        # either door, also page by page (V1 with one key per page).
        led1, led2 = keys_on(by_name["n1"], "routed"), keys_on(by_name["n2"], "routed")
        assert not led1 & led2
        assert led1 | led2 == before | set(fresh)
        moved = [k for k in kept if owners[k] == "n3"]
        assert moved
        for k in moved:
            assert c.owner_node("routed", k) in ("n1", "n2")
        assert c.get_batch("routed", moved) == [data[k] for k in moved]
        assert [e.key for e in c.list("routed", "k/")] == kept
        paged, after = [], ""
        while True:
            page = c.list("routed", "k/", start_after=after, limit=3)
            paged += [e.key for e in page]
            if len(page) < 3:
                break
            after = page[-1].key
        assert paged == kept
        s3 = nodes[0].client()
        v1 = [o["Key"] for p in s3.get_paginator("list_objects").paginate(
            Bucket="routed", Prefix="k/", PaginationConfig={"PageSize": 1})
            for o in p.get("Contents", [])]
        assert v1 == kept
        v2 = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
            Bucket="routed", Prefix="k/", PaginationConfig={"PageSize": 2})
            for o in p.get("Contents", [])]
        assert v2 == kept
    finally:
        for n in nodes:
            n.close()


def test_data_directory_is_bound_to_its_cluster(etcd):  # noqa: F811
    urls = etcd.urls
    percore_cli("cluster", "init", "--cluster", urls, "--replicas", "1", "--pgs", "16")
    node = Node("127.0.0.2", "solo", "z1", urls)
    try:
        node.start()
        node.terminate()
        # The same data without --cluster: refused, saying why.
        single = Server(shards=2, name="bound-single")
        single.data_dir = node.data_dir
        try:
            with pytest.raises(Exception):
                single.start(timeout=20)
            assert "belongs to cluster percore" in single.logs()
        finally:
            single.close()
        # A single node's data cannot join a cluster.
        plain = Server(shards=2, name="bound-plain")
        try:
            plain.start()
            plain.terminate()
            joiner = Node("127.0.0.3", "joiner", "z2", urls)
            joiner.data_dir = plain.data_dir
            try:
                with pytest.raises(Exception):
                    joiner.start(timeout=20)
                assert "is a single node's" in joiner.logs()
            finally:
                joiner.close()
        finally:
            plain.close()
        # Another cluster's node on it: refused too.
        percore_cli("cluster", "init", "--cluster", urls, "--name", "other", "--replicas", "1")
        other = Node("127.0.0.4", "solo", "z1", urls)
        other.extra_args += ["--cluster-name", "other"]
        other.data_dir = node.data_dir
        try:
            with pytest.raises(Exception):
                other.start(timeout=20)
            assert "not to cluster other" in other.logs()
        finally:
            other.close()
        # Its own cluster: starts.
        node.start()
        assert percore.Client(native_endpoint(node)).cluster_epoch >= 1
    finally:
        node.close()


@pytest.fixture
def three_nodes(etcd):  # noqa: F811
    percore_cli("cluster", "init", "--cluster", etcd.urls, "--replicas", "3", "--pgs", "64")
    ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert all(loopback_ok(ip) for ip in ips)
    nodes = [Node(ip, f"n{i + 1}", f"z{i + 1}", etcd.urls) for i, ip in enumerate(ips)]
    try:
        for n in nodes:
            n.start()
        wait_ready(etcd.urls, nodes)
        yield nodes
    finally:
        for n in nodes:
            n.close()


def check_copies_across_nodes(nodes, s3, native, data, owners, tmp_path) -> None:
    """CopyObject, UploadPartCopy (ranges) and the aws cli copy keys whose
    source another node leads; preconditions and missing sources answer
    as on one node; the internal read's bytes end with their MAC."""
    from botocore.exceptions import ClientError

    from conftest import AwsCli

    src = "obj/010"
    others = [k for k in data if owners[k] != owners[src]]
    assert len(others) >= 5
    for i, dst in enumerate(others[:3]):
        r = s3[i].copy_object(Bucket="anynode", Key=dst, CopySource=f"anynode/{src}")
        assert r["CopyObjectResult"]["ETag"].strip('"') == hashlib.md5(data[src]).hexdigest()
        got = s3[(i + 1) % 3].get_object(Bucket="anynode", Key=dst)
        assert got["Body"].read() == data[src] and got["ContentType"] == "application/x-test"
        data[dst] = data[src]
    # Metadata replaced, a precondition that holds and one that does not.
    dst = others[3]
    etag = s3[0].head_object(Bucket="anynode", Key=src)["ETag"]
    s3[2].copy_object(Bucket="anynode", Key=dst, CopySource=f"anynode/{src}",
                      CopySourceIfMatch=etag, MetadataDirective="REPLACE",
                      ContentType="text/x-copied", Metadata={"m": "1"})
    head = s3[1].head_object(Bucket="anynode", Key=dst)
    assert head["ContentType"] == "text/x-copied" and head["Metadata"] == {"m": "1"}
    data[dst] = data[src]
    with pytest.raises(ClientError) as e:
        s3[2].copy_object(Bucket="anynode", Key=dst, CopySource=f"anynode/{src}",
                          CopySourceIfNoneMatch=etag)
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    with pytest.raises(ClientError) as e:
        s3[0].copy_object(Bucket="anynode", Key=dst, CopySource="anynode/obj/none")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    # UploadPartCopy of ranges of a multipart source another node leads.
    big_src = "mpu/big"
    big = s3[0].get_object(Bucket="anynode", Key=big_src)["Body"].read()
    dst = next(k for k in others if owners[k] != native.owner_node("anynode", big_src))
    up = s3[1].create_multipart_upload(Bucket="anynode", Key=dst)["UploadId"]
    half = len(big) // 2
    parts = []
    for n, (a, b) in enumerate([(0, half - 1), (half, len(big) - 1)], start=1):
        r = s3[n % 3].upload_part_copy(Bucket="anynode", Key=dst, UploadId=up, PartNumber=n,
                                       CopySource=f"anynode/{big_src}",
                                       CopySourceRange=f"bytes={a}-{b}")
        assert r["CopyPartResult"]["ETag"].strip('"') == hashlib.md5(big[a:b + 1]).hexdigest()
        parts.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
    s3[2].complete_multipart_upload(Bucket="anynode", Key=dst, UploadId=up,
                                    MultipartUpload={"Parts": parts})
    assert s3[0].get_object(Bucket="anynode", Key=dst)["Body"].read() == big
    data[dst] = big
    # The aws cli's server-side copy.
    dst = others[4]
    AwsCli(nodes[2].endpoint, tmp_path / "awscp").s3(
        "cp", f"s3://anynode/{src}", f"s3://anynode/{dst}")
    assert s3[1].get_object(Bucket="anynode", Key=dst)["Body"].read() == data[src]
    data[dst] = data[src]

    # A versioned source another node leads: a version by id (named in
    # the answer); a delete marker by id and a deleted current version
    # answer as on one node.
    s3[0].create_bucket(Bucket="anyver")
    s3[0].put_bucket_versioning(Bucket="anyver",
                                VersioningConfiguration={"Status": "Enabled"})
    v1 = s3[0].put_object(Bucket="anyver", Key="src", Body=b"one")["VersionId"]
    s3[1].put_object(Bucket="anyver", Key="src", Body=b"two")
    vdst = next(f"d{i}" for i in range(200)
                if native.owner_node("anyver", f"d{i}") != native.owner_node("anyver", "src"))
    r = s3[2].copy_object(Bucket="anyver", Key=vdst,
                          CopySource={"Bucket": "anyver", "Key": "src", "VersionId": v1})
    assert r["CopySourceVersionId"] == v1
    assert s3[0].get_object(Bucket="anyver", Key=vdst)["Body"].read() == b"one"
    marker = s3[0].delete_object(Bucket="anyver", Key="src")["VersionId"]
    for source, code in [({"Bucket": "anyver", "Key": "src", "VersionId": marker},
                          "MethodNotAllowed"),
                         ({"Bucket": "anyver", "Key": "src"}, "NoSuchKey")]:
        with pytest.raises(ClientError) as e:
            s3[1].copy_object(Bucket="anyver", Key=vdst, CopySource=source)
        assert e.value.response["Error"]["Code"] == code, e.value.response

    # The internal read: its bytes then HMAC(cluster key, request MAC).
    owner = next(n for n in nodes if n.node_name == owners[src])
    target = f"/_percore/object?bucket=anynode&key={src.replace('/', '%2F')}&version="
    status, body = internal(owner, "GET", target)
    assert status == 200 and json.loads(body)["size"] == len(data[src]), body
    etag = json.loads(body)["etag"]
    target += f"&etag={etag}&from=5&len=100"
    header = node_header("GET", target, node_id(owner))
    conn = http.client.HTTPConnection(owner.ip, owner.s3_port, timeout=10)
    try:
        conn.request("GET", target, headers={"x-percore-node": header})
        r = conn.getresponse()
        answer = r.read()
    finally:
        conn.close()
    assert r.status == 200 and len(answer) == 164, (r.status, answer[:300])
    assert answer[:100] == data[src][5:105]
    msg = f"percore-object-v1\n{header.rsplit(' ', 1)[1]}\n".encode() + answer[:100]
    assert answer[100:] == hmac.new(cluster_key(), msg, hashlib.sha256).hexdigest().encode()
    # Not led here: refused (the map says where the source is).
    elsewhere = next(n for n in nodes if n.node_name != owners[src])
    assert internal(elsewhere, "GET", target.split("&etag=")[0])[0] == 503


def test_multipart_uploads_list_across_nodes(three_nodes):
    """ListMultipartUploads through any node lists every node's uploads
    (each on its key's acting primary), page by page, with prefixes and
    delimiters; uploads aborted through a listing are gone from all."""
    nodes = three_nodes
    s3 = [n.client() for n in nodes]
    native = percore.Client(native_endpoint(nodes[0]))
    s3[0].create_bucket(Bucket="uploads")
    want = set()
    for i in range(30):
        key = f"{'ab'[i % 2]}/k{i:02d}"
        for _ in range(1 + i % 3 // 2):
            r = s3[i % 3].create_multipart_upload(Bucket="uploads", Key=key)
            want.add((key, r["UploadId"]))
    owners = {k: native.owner_node("uploads", k) for k, _ in want}
    assert set(owners.values()) == {"n1", "n2", "n3"}
    # Each node's own part lists the uploads of the keys it leads.
    for node in nodes:
        status, body = internal(node, "GET", "/_percore/list?uploads=1&bucket=uploads"
                                             "&prefix=&from=&umark=&max=1000")
        assert status == 200, body
        page = json.loads(body)
        assert page["frontier"] is None
        assert {(u[0], u[1]) for u in page["uploads"]} == {
            u for u in want if owners[u[0]] == node.node_name}

    def listed(c, size: int, **kw) -> tuple[list, list, int]:
        uploads, prefixes, pages = [], [], 0
        for page in c.get_paginator("list_multipart_uploads").paginate(
                Bucket="uploads", PaginationConfig={"PageSize": size}, **kw):
            uploads += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
            prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            pages += 1
            assert pages < 100
        return uploads, prefixes, pages

    for c in s3:
        for size in (1, 4, 7, 1000):
            got, prefixes, pages = listed(c, size)
            assert got == sorted(want) and not prefixes, size
            assert pages == max(1, -(-len(want) // size)), (size, pages)
        got, prefixes, _ = listed(c, 3, Prefix="a/")
        assert got == sorted(u for u in want if u[0].startswith("a/"))
        got, prefixes, _ = listed(c, 1, Delimiter="/")
        assert not got and prefixes == ["a/", "b/"]
    # Abort through one door every upload another door lists under b/.
    for key, upload in listed(s3[1], 5, Prefix="b/")[0]:
        s3[2].abort_multipart_upload(Bucket="uploads", Key=key, UploadId=upload)
    for c in s3:
        assert listed(c, 4)[0] == sorted(u for u in want if u[0].startswith("a/"))


def test_any_node_s3_door_serves_any_key(three_nodes, tmp_path):
    """boto3 and the aws cli against each node: buckets are on every node,
    every key is stored on every node (R = 3, three nodes) and led by its
    acting primary (whichever node took it), and reads, listings and batch
    deletes through any node see every key."""
    from botocore.exceptions import ClientError

    from conftest import AwsCli

    nodes = three_nodes
    by_name = {n.node_name: n for n in nodes}
    s3 = [n.client() for n in nodes]
    native = percore.Client(native_endpoint(nodes[0]))
    s3[0].create_bucket(Bucket="anynode")
    for c in s3:
        c.head_bucket(Bucket="anynode")
    with pytest.raises(ClientError) as e:
        s3[1].create_bucket(Bucket="anynode")
    assert e.value.response["Error"]["Code"] == "BucketAlreadyOwnedByYou"

    data = {f"obj/{i:03d}": os.urandom(1 + (i * 104729) % 70000) for i in range(60)}
    for i, (k, v) in enumerate(data.items()):
        s3[i % 3].put_object(Bucket="anynode", Key=k, Body=v, ContentType="application/x-test")
    owners = {k: native.owner_node("anynode", k) for k in data}
    assert set(owners.values()) == {"n1", "n2", "n3"}
    for name, node in by_name.items():
        assert keys_on(node, "anynode") == {k for k, o in owners.items() if o == name}
        assert keys_stored(node, "anynode") == set(data), name
    def kept_used() -> int:
        return sum(v for n in nodes for k, v in cluster_gauges(n).items()
                   if k.startswith("percore_cluster_kept_connections_used_total"))

    kept_before = kept_used()
    for i, (k, v) in enumerate(data.items()):
        c = s3[(i + 1) % 3]
        got = c.get_object(Bucket="anynode", Key=k)
        assert got["Body"].read() == v and got["ContentType"] == "application/x-test"
        head = s3[(i + 2) % 3].head_object(Bucket="anynode", Key=k)
        assert head["ContentLength"] == len(v)
        assert native.get("anynode", k) == v
    # Forwarded GETs and HEADs went on connections the doors kept open
    # from earlier ones (and every answer above was the right one).
    assert kept_used() - kept_before >= 20, (kept_before, kept_used())
    k = "obj/010"
    part = s3[2].get_object(Bucket="anynode", Key=k, Range="bytes=5-99")["Body"].read()
    assert part == data[k][5:100]
    with pytest.raises(ClientError) as e:
        s3[1].get_object(Bucket="anynode", Key="obj/none")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"

    # A multipart upload through one node lands on the key's acting
    # primary, which leads it, and on every replica; its parts are not
    # a multiple of 1 MiB (reads end at each part's end).
    big = os.urandom(11 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(big)
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=(5 << 20) + 4099)
    s3[1].upload_file(str(src), "anynode", "mpu/big", Config=cfg)
    owner = native.owner_node("anynode", "mpu/big")
    assert "mpu/big" in keys_on(by_name[owner], "anynode")
    for name, node in by_name.items():
        assert "mpu/big" in keys_stored(node, "anynode"), name
        assert ("mpu/big" in keys_on(node, "anynode")) == (name == owner)
    assert s3[2].get_object(Bucket="anynode", Key="mpu/big")["Body"].read() == big

    # Listings through any node merge every node's keys, page by page.
    want = sorted(list(data) + ["mpu/big"])
    for c in s3:
        got, pages = [], 0
        for page in c.get_paginator("list_objects_v2").paginate(
                Bucket="anynode", PaginationConfig={"PageSize": 7}):
            got += [o["Key"] for o in page.get("Contents", [])]
            pages += 1
        assert got == want and pages == (len(want) + 6) // 7
    v1 = []
    for page in s3[2].get_paginator("list_objects").paginate(
            Bucket="anynode", PaginationConfig={"PageSize": 9}):
        v1 += [o["Key"] for o in page.get("Contents", [])]
    assert v1 == want
    tops = s3[1].list_objects_v2(Bucket="anynode", Delimiter="/")
    assert [p["Prefix"] for p in tops["CommonPrefixes"]] == ["mpu/", "obj/"]

    # Bucket settings reach every node.
    s3[0].put_bucket_tagging(Bucket="anynode",
                             Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]})
    for c in s3:
        assert c.get_bucket_tagging(Bucket="anynode")["TagSet"] == [
            {"Key": "team", "Value": "ml"}]

    # Copies within one node's keys and across nodes (the destination's
    # primary reads the source from the source's), through any door.
    same = next(k for k in data if k != "obj/010" and owners[k] == owners["obj/010"])
    s3[0].copy_object(Bucket="anynode", Key=same, CopySource="anynode/obj/010")
    assert s3[1].get_object(Bucket="anynode", Key=same)["Body"].read() == data["obj/010"]
    data[same] = data["obj/010"]
    check_copies_across_nodes(nodes, s3, native, data, owners, tmp_path)

    # DeleteObjects through one node deletes each key on its acting
    # primary, and on every replica.
    gone = list(data)[:25]
    r = s3[1].delete_objects(Bucket="anynode",
                             Delete={"Objects": [{"Key": k} for k in gone]})
    assert sorted(d["Key"] for d in r["Deleted"]) == sorted(gone)
    assert not r.get("Errors")
    for k in gone:
        with pytest.raises(ClientError):
            s3[2].head_object(Bucket="anynode", Key=k)
        assert k not in keys_on(by_name[owners[k]], "anynode")
    for name, node in by_name.items():
        stored = keys_stored(node, "anynode")
        assert not set(gone) & stored, name
        assert stored == (set(data) - set(gone)) | {"mpu/big"}, name

    # The aws cli through two different nodes.
    tree = tmp_path / "tree"
    for i in range(12):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i}.bin").write_bytes(os.urandom(100 + i))
    AwsCli(nodes[1].endpoint, tmp_path / "aws1").s3("sync", str(tree), "s3://anynode/tree/")
    listed = AwsCli(nodes[2].endpoint, tmp_path / "aws2").s3(
        "ls", "--recursive", "s3://anynode/tree/")
    assert len([line for line in listed.splitlines() if "tree/" in line]) == 12

    # Node headers: a forged, misdirected, stale or replayed one is
    # refused, and so is one whose body hash does not match.
    me = node_id(nodes[0])
    target = "/_percore/list?bucket=anynode&max=10"
    assert internal(nodes[0], "GET", target)[0] == 200
    bad = [
        node_header("GET", target, me, secret="wrong"),
        node_header("GET", "/_percore/list?bucket=other&max=10", me),
        node_header("GET", target, node_id(nodes[1])),
        node_header("GET", target, me, body=b"x"),
        "v1 0 1 00 root",
        "v2 1 1 1 0123456789abcdef - 00",
    ]
    for h in bad:
        st, body = internal(nodes[0], "GET", target, header=h)
        assert st == 403 and b"AccessDenied" in body, (h, st, body)
    # A sender this node's map does not know yet: retry later.
    st, body = internal(nodes[0], "GET", target, header=node_header("GET", target, me, sender=999))
    assert st == 503 and b"SlowDown" in body
    once = node_header("GET", target, me)
    assert internal(nodes[0], "GET", target, header=once)[0] == 200
    st, body = internal(nodes[0], "GET", target, header=once)
    assert st == 403 and b"used already" in body
    deletes = b'[{"k": "obj/011"}]'
    h = node_header("POST", "/_percore/delete?bucket=anynode", me, body=b"[]")
    assert internal(nodes[0], "POST", "/_percore/delete?bucket=anynode", body=deletes,
                    header=h)[0] == 403
    # A forwarded S3 request ("-" body) cannot reach an internal path.
    h = node_header("GET", target, me, digest="-")
    st, body = internal(nodes[0], "GET", target, header=h)
    assert st == 403 and b"names its body" in body
    # The relay header is covered by the node MAC: added to a forward
    # signed without it, or naming another owner than signed, it is
    # refused before anything else (a relayed forward that is signed is
    # passed on: the partition tests relay through a third node).
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    obj = "/anynode/obj/001"
    for signed_relay, sent_relay in [(None, None), (None, "2"), (3, "2"), (3, None), (3, "x")]:
        signed = AWSRequest(method="GET", url=f"{nodes[0].endpoint}{obj}",
                            headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(signed)
        headers = dict(signed.headers.items())
        headers["x-percore-node"] = node_header("GET", obj, me, digest="-",
                                                sender=node_id(nodes[1]), relay=signed_relay)
        if sent_relay is not None:
            headers["x-percore-relay"] = sent_relay
        conn = http.client.HTTPConnection(nodes[0].ip, nodes[0].s3_port, timeout=10)
        try:
            conn.request("GET", obj, headers=headers)
            r = conn.getresponse()
            st, body = r.status, r.read()
        finally:
            conn.close()
        if signed_relay is None and sent_relay is None:
            # The control: signed as a forward, it is taken as one.
            assert st != 403, (st, body)
        else:
            assert st == 403 and b"Bad node header" in body, (signed_relay, sent_relay, st, body)
    # Releases: a malformed one is a bad request, an unsigned one is
    # refused, and one for the node's own epoch is answered at once.
    epoch = int(cluster_gauges(nodes[0])["percore_cluster_epoch"])
    for bad_body in [b"", b"{", b'{"epoch":"x"}', b'{"epoch":1,"more":2}']:
        st, body = internal(nodes[0], "POST", "/_percore/release", body=bad_body)
        assert st == 400 and b"bad release request" in body, (bad_body, st, body)
    release = json.dumps({"epoch": epoch}).encode()
    h = node_header("POST", "/_percore/release", me, body=release, secret="wrong")
    assert internal(nodes[0], "POST", "/_percore/release", body=release, header=h)[0] == 403
    st, body = internal(nodes[0], "POST", "/_percore/release", body=release)
    assert st == 200 and json.loads(body) == {"released": epoch}, (st, body)
    st, body = internal(nodes[0], "POST", "/_percore/release",
                        body=json.dumps({"epoch": epoch + 10_000}).encode())
    assert st == 503 and b"too far ahead" in body, (st, body)
    # A door's word that a bucket change is in the catalog: malformed
    # requests are bad requests, an unsigned one is refused, and one for a
    # revision the node applied is answered with the revision it has.
    for bad_body in [b"", b"[", b'{"rev":"x"}', b'{"rev":1,"x":1}']:
        st, body = internal(nodes[0], "POST", "/_percore/catalog", body=bad_body)
        assert st == 400 and b"bad catalog request" in body, (bad_body, st, body)
    first = b'{"rev":1}'
    h = node_header("POST", "/_percore/catalog", me, body=first, secret="wrong")
    assert internal(nodes[0], "POST", "/_percore/catalog", body=first, header=h)[0] == 403
    st, body = internal(nodes[0], "POST", "/_percore/catalog", body=first)
    assert st == 200 and json.loads(body)["applied"] > 1, (st, body)
    # Everything still there.
    left = set(data) - set(gone)
    assert {o["Key"] for o in s3[0].list_objects_v2(Bucket="anynode", Prefix="obj/")
            .get("Contents", [])} == left
    # A bucket with keys on any node is not empty; emptied, it is deleted
    # everywhere.
    with pytest.raises(ClientError) as e:
        s3[2].delete_bucket(Bucket="anynode")
    assert e.value.response["Error"]["Code"] == "BucketNotEmpty"
    rest = [o["Key"] for page in s3[0].get_paginator("list_objects_v2").paginate(
        Bucket="anynode") for o in page.get("Contents", [])]
    for i in range(0, len(rest), 1000):
        s3[0].delete_objects(Bucket="anynode", Delete={
            "Objects": [{"Key": k} for k in rest[i:i + 1000]], "Quiet": True})
    s3[2].delete_bucket(Bucket="anynode")
    for c in s3:
        with pytest.raises(ClientError) as e:
            c.head_bucket(Bucket="anynode")
        assert e.value.response["Error"]["Code"] in ("404", "NoSuchBucket")
    # The routing counters on /metrics (each node counts what it did).
    def total(name: str) -> int:
        return sum(v for n in nodes for k, v in cluster_gauges(n).items()
                   if k.split("{")[0] == name)
    assert total("percore_cluster_s3_forwarded_total") >= 40
    assert total("percore_cluster_s3_fanned_out_total") >= 3
    assert total("percore_cluster_node_requests_total") >= 40
    assert total("percore_cluster_node_refused_total") >= 5

    # One key (on every replica, led by one node): no node deletes the
    # bucket, the nodes that do not lead the key included.
    s3[0].create_bucket(Bucket="lonely")
    s3[0].put_object(Bucket="lonely", Key="only", Body=b"1")
    for name, node in by_name.items():
        assert keys_stored(node, "lonely") == {"only"}, name
    for c in s3:
        with pytest.raises(ClientError) as e:
            c.delete_bucket(Bucket="lonely")
        assert e.value.response["Error"]["Code"] == "BucketNotEmpty"
    for c in s3:
        c.head_bucket(Bucket="lonely")
    assert s3[1].get_object(Bucket="lonely", Key="only")["Body"].read() == b"1"
