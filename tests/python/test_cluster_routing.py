"""Native clients on a cluster (issue 18, Must have 3): the map reaches
every node's shards; a node serves the keys whose placement group it is
the primary of and answers WrongNode for the others; the client (Rust,
through the Python package and the CLI) fetches the map from any node,
sends each key to its primary's owner shard, merges listings across
nodes, and fetches the map again when a node answers WrongNode. A data
directory is bound to its cluster. Real etcd, three nodes on
127.0.0.2-4. No replication yet: each key is stored on its primary only,
which the test checks node by node through S3 (which serves a node's
own data)."""

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
from conftest import SECRET_KEY, Server
from test_cluster_membership import (  # noqa: F401  (etcd is a fixture)
    LEASE_TTL_S,
    Node,
    cluster_gauges,
    etcd,
    loopback_ok,
    percore as percore_cli,
    status,
)


def native_endpoint(node: Node) -> str:
    m = re.search(rf"native endpoint: {re.escape(node.ip)}:(\d+)", node.logs(20000))
    assert m, node.logs()
    return f"{node.ip}:{m.group(1)}"


def node_header(method: str, target: str, principal: str = "root",
                secret: str = SECRET_KEY, node: int = 0) -> str:
    """`x-percore-node` as a cluster node signs it (docs/cluster.md)."""
    ms = int(time.time() * 1000)
    msg = f"percore-node-v1\n{node}\n{ms}\n{method}\n{target}\n{principal}".encode()
    tag = hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()
    return f"v1 {node} {ms} {tag} {principal}"


def internal(node: Node, method: str, target: str, body: bytes = b"",
             header: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(node.ip, node.s3_port, timeout=10)
    try:
        conn.request(method, target, body=body, headers={
            "x-percore-node": header if header is not None else node_header(method, target)})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def keys_on(node: Node, bucket: str) -> set[str]:
    """The keys a node stores itself (its internal listing; its S3
    listings merge every node's)."""
    status, body = internal(node, "GET", f"/_percore/list?bucket={bucket}&prefix=&from="
                                         "&delimiter=&max=10000")
    assert status == 200, body
    answer = json.loads(body)
    assert not answer["truncated"]
    return {item[1] for item in answer["items"] if item[0] == "o"}


def wait_epoch(node: Node, at_least: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while cluster_gauges(node).get("percore_cluster_epoch", 0) < at_least:
        assert time.monotonic() < deadline, cluster_gauges(node)
        time.sleep(0.1)
    # The shards poll the control thread's channel every 50 ms.
    time.sleep(0.3)


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
        c = percore.Client(native_endpoint(nodes[0]))
        # The first node to join may have read an older map: wait until
        # every node's map lists all three.
        _, summary = status(urls)
        epoch = int(re.search(r"epoch (\d+)", summary).group(1))
        for n in nodes:
            wait_epoch(n, epoch)
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
        # Each key is stored on its primary only.
        for name, node in by_name.items():
            assert keys_on(node, "routed") == {k for k, o in owners.items() if o == name}
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

        # Deletes go to the primary too.
        assert c.delete("routed", "k/0003") is True
        with pytest.raises(percore.NoSuchKey):
            c.get("routed", "k/0003")
        assert "k/0003" not in keys_on(by_name[owners["k/0003"]], "routed")

        # The map changes (n3 drains: its placement groups move to n1 and
        # n2). The client's map is now stale: n3 answers WrongNode for a
        # key it no longer owns, the client fetches the map and goes to
        # the new primary.
        old_epoch = c.cluster_epoch
        stale = percore.Client(native_endpoint(nodes[0]))
        names = [f"after/{i}" for i in range(600)]
        fresh = {k: os.urandom(100) for k in names if c.owner_node("routed", k) == "n3"}
        fresh = dict(list(fresh.items())[:20])
        assert len(fresh) == 20
        unmoved = [k for k, o in owners.items() if o != "n3" and k != "k/0003"][:10]
        percore_cli("cluster", "drain", "n3", "--cluster", urls)
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
        for name in ("n1", "n2"):
            stored = keys_on(by_name[name], "routed")
            assert {k for k in fresh if c.owner_node("routed", k) == name} <= stored
        assert not set(fresh) & keys_on(by_name["n3"], "routed")
        # A batch on a stale map: the groups a node refuses are regrouped
        # by the map fetched after the WrongNode.
        assert stale.cluster_epoch == old_epoch
        got = stale.get_batch("routed", list(fresh) + unmoved)
        assert got == [fresh[k] for k in fresh] + [data[k] for k in unmoved]
        assert stale.map_refreshes >= 1 and stale.cluster_epoch >= epoch
        assert c.misrouted == 0 and stale.misrouted == 0
        # A draining node still answers listings of what it stores (no
        # backfill moves it yet; docs/cluster.md).
        assert set(data) - {"k/0003"} <= {e.key for e in c.list("routed", "k/")}
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
