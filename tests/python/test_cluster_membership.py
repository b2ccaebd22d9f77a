"""Cluster membership on a real etcd (issue 18, the control plane only;
replication is not built yet): `percore cluster init/status/drain/remove`,
nodes joining with `serve --cluster`, each on its own loopback address
(127.0.0.2-4). A node killed with kill -9 is marked down once its lease
expires and up again when it returns, with its id; with one of three etcd
members dead, nodes keep their leases and the map keeps changing."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Server, free_ports, percore_bin

ETCD = shutil.which("etcd")
LEASE_TTL_S = 3
# How long a node may take to catch up and be marked synced.
SYNC_TIMEOUT_S = 60


class Etcd:
    """A real etcd cluster of `members` on 127.0.0.1, in a temporary
    directory."""

    def __init__(self, workdir: Path, members: int = 1):
        self.procs: list[subprocess.Popen | None] = []
        ports = free_ports(2 * members)
        self.clients = ports[:members]
        peers = ports[members:]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.commands = []
        for i in range(members):
            self.commands.append([
                ETCD, "--name", f"m{i}", "--data-dir", str(workdir / f"etcd{i}"),
                "--listen-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000"])
        self.logs = [open(workdir / f"etcd{i}.log", "wb") for i in range(members)]
        for i in range(members):
            self.procs.append(subprocess.Popen(self.commands[i], stdout=self.logs[i],
                                               stderr=subprocess.STDOUT))
        self.urls = ",".join(f"http://127.0.0.1:{p}" for p in self.clients)
        deadline = time.monotonic() + 30
        while True:
            try:
                out = percore("cluster", "status", "--cluster", self.urls, check=False)
            except subprocess.TimeoutExpired:
                out = None
            if out is not None and "no such cluster" in out.stderr:
                return
            assert time.monotonic() < deadline, f"etcd did not start: {out}"
            time.sleep(0.2)

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait()

    def close(self) -> None:
        for p in self.procs:
            if p and p.poll() is None:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()


def percore(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(percore_bin()), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


class Node(Server):
    """A percore node on its own loopback address, joined to a cluster."""

    def __init__(self, ip: str, name: str, zone: str, urls: str):
        super().__init__(shards=2, name=f"cluster-{name}",
                         env={"PERCORE_CLUSTER_LEASE_TTL_S": str(LEASE_TTL_S)},
                         extra_args=["--cluster", urls, "--node", name, "--zone", zone])
        self.ip = ip
        self.node_name = name

    @property
    def host(self) -> str:
        return self.ip

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.s3_port}"

    def command(self) -> list[str]:
        cmd = super().command()
        for i, a in enumerate(cmd[:-1]):
            if a in ("--s3", "--native", "--admin"):
                cmd[i + 1] = cmd[i + 1].replace("127.0.0.1:", f"{self.ip}:")
        return cmd


def status(urls: str) -> tuple[dict[str, dict[str, str]], str]:
    """Node name -> its status fields, and the summary lines."""
    out = percore("cluster", "status", "--cluster", urls).stdout
    nodes = {}
    lines = out.strip().splitlines()
    for line in lines[:-2]:
        name, state, *fields = line.split()
        nodes[name] = {"state": state, **dict(f.split("=", 1) for f in fields if "=" in f),
                       "lease": fields[-1]}
    return nodes, "\n".join(lines[-2:])


def wait_for(urls: str, name: str, state: str, timeout: float = 20, field: str = "state") -> dict:
    deadline = time.monotonic() + timeout
    while True:
        nodes, _ = status(urls)
        if name in nodes and nodes[name][field] == state:
            return nodes
        assert time.monotonic() < deadline, f"{name} never had {field} {state}: {nodes}"
        time.sleep(0.2)


def cluster_gauges(node: Node) -> dict[str, int]:
    """The percore_cluster_* samples of a node's /metrics."""
    import urllib.request
    body = urllib.request.urlopen(f"http://{node.ip}:{node.admin_port}/metrics",
                                  timeout=5).read().decode()
    return {line.split()[0]: int(float(line.split()[1])) for line in body.splitlines()
            if line.startswith("percore_cluster_")}


def wait_epoch(node: Node, at_least: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while cluster_gauges(node).get("percore_cluster_epoch", 0) < at_least:
        assert time.monotonic() < deadline, cluster_gauges(node)
        time.sleep(0.1)
    # The shards poll the control thread's channel every 50 ms.
    time.sleep(0.3)


def wait_synced(urls: str, names: list[str], timeout: float = SYNC_TIMEOUT_S) -> dict:
    """Waits until every node in `names` is `up` with `sync=yes`."""
    deadline = time.monotonic() + timeout
    while True:
        nodes, _ = status(urls)
        if all(nodes.get(n, {}).get("state") == "up" and nodes.get(n, {}).get("sync") == "yes"
               for n in names):
            return nodes
        assert time.monotonic() < deadline, (
            f"{names} not all up with sync=yes within {timeout:.0f} s: {nodes}")
        time.sleep(0.2)


def wait_ready(urls: str, nodes: list[Node]) -> int:
    """Waits until every node is up with `sync=yes` (a node that is still
    catching up is the acting primary of nothing, so owners computed
    before would be wrong), then until every node runs the map etcd holds
    then (marking a node synced moves the epoch). Returns that epoch."""
    wait_synced(urls, [n.node_name for n in nodes])
    _, summary = status(urls)
    epoch = int(re.search(r"epoch (\d+)", summary).group(1))
    for n in nodes:
        wait_epoch(n, epoch)
    return epoch


def loopback_ok(ip: str) -> bool:
    try:
        s = socket.socket()
        s.bind((ip, 0))
        s.close()
        return True
    except OSError:
        return False


@pytest.fixture
def etcd(tmp_path):
    if ETCD is None:
        pytest.skip("etcd is not installed (tools/install-test-deps.sh installs etcd-server)")
    e = Etcd(tmp_path)
    yield e
    e.close()


def test_membership_lease_drain_and_remove(etcd):
    urls = etcd.urls
    r = percore("cluster", "status", "--cluster", urls, check=False)
    assert r.returncode == 1 and "percore cluster init" in r.stderr
    percore("cluster", "init", "--cluster", urls, "--replicas", "3", "--pgs", "256")
    again = percore("cluster", "init", "--cluster", urls, "--replicas", "3", check=False)
    assert again.returncode == 1 and "exists already" in again.stderr
    bad = percore("cluster", "init", "--cluster", urls, "--name", "other", "--replicas", "9",
                  check=False)
    assert bad.returncode == 1 and "--replicas" in bad.stderr

    ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert all(loopback_ok(ip) for ip in ips)
    nodes = [Node(ip, f"n{i + 1}", f"z{i + 1}", urls) for i, ip in enumerate(ips)]
    try:
        for n in nodes:
            n.start()
        listed, summary = status(urls)
        assert sorted(listed) == ["n1", "n2", "n3"]
        for n in nodes:
            row = listed[n.node_name]
            assert row["state"] == "up" and row["lease"] == "leased"
            assert row["s3"] == f"{n.ip}:{n.s3_port}" and row["admin"] == f"{n.ip}:{n.admin_port}"
            assert row["native"].startswith(f"{n.ip}:") and row["shards"] == "2"
            # Three nodes, three replicas: every node holds every PG.
            assert row["pgs"] == "256"
        assert sum(int(r["primary"]) for r in listed.values()) == 256
        assert "replicas 3 pgs 256" in summary
        ids = {name: row["id"] for name, row in listed.items()}
        # Each node's /metrics: its lease, id, and the map as it last read it.
        deadline = time.monotonic() + 10
        while cluster_gauges(nodes[0]).get('percore_cluster_nodes{state="up"}') != 3:
            assert time.monotonic() < deadline, cluster_gauges(nodes[0])
            time.sleep(0.2)
        g = cluster_gauges(nodes[0])
        assert g["percore_cluster_leased"] == 1 and g["percore_cluster_removed"] == 0
        assert g["percore_cluster_node_id"] == int(ids["n1"])
        assert g["percore_cluster_epoch"] >= 3
        assert g['percore_cluster_nodes{state="down"}'] == 0

        # Each node serves S3 on its own address, once the nodes have caught
        # up: until then a group's primary answers 503 (retry).
        wait_ready(urls, nodes)
        s3 = nodes[0].client()
        s3.create_bucket(Bucket="cluster-bucket")
        s3.put_object(Bucket="cluster-bucket", Key="k", Body=b"on n1")
        assert s3.get_object(Bucket="cluster-bucket", Key="k")["Body"].read() == b"on n1"

        # A quiet cluster: each periodic map read finds etcd unchanged (one
        # small read) instead of reading the whole map again.
        full, same = ('percore_cluster_map_reads_total{kind="full"}',
                      'percore_cluster_map_reads_total{kind="unchanged"}')
        for _ in range(5):
            before = cluster_gauges(nodes[0])
            time.sleep(LEASE_TTL_S)
            after = cluster_gauges(nodes[0])
            if after[full] == before[full]:
                break
        assert after[full] == before[full], (before, after)
        assert after[same] - before[same] >= 2, (before, after)

        # kill -9: down once the lease expires; back up with its id.
        nodes[1].kill9()
        started = time.monotonic()
        listed = wait_for(urls, "n2", "down", timeout=LEASE_TTL_S * 4)
        assert time.monotonic() - started >= 1
        assert listed["n2"]["lease"] == "no-lease"
        assert listed["n1"]["state"] == "up" and listed["n3"]["state"] == "up"
        nodes[1].start()
        listed = wait_for(urls, "n2", "up")
        assert listed["n2"]["id"] == ids["n2"]
        # A restart right after kill -9 waits out the old process's lease,
        # then joins with the same id, never marked down.
        nodes[0].kill9()
        nodes[0].start()
        listed, _ = status(urls)
        assert listed["n1"]["state"] == "up" and listed["n1"]["id"] == ids["n1"]
        # A second process with the same name is refused.
        twin = Node("127.0.0.5", "n1", "z1", urls)
        try:
            with pytest.raises(Exception):
                twin.start(timeout=LEASE_TTL_S + 15)
            assert "another process runs as node n1" in twin.logs()
        finally:
            twin.close()
        assert status(urls)[0]["n1"]["s3"] == f"{nodes[0].ip}:{nodes[0].s3_port}"

        # Drain: no placement groups on n3; the two others hold them all.
        reads_before = cluster_gauges(nodes[0])
        percore("cluster", "drain", "n3", "--cluster", urls)
        listed, _ = status(urls)
        assert listed["n3"]["state"] == "draining" and listed["n3"]["pgs"] == "0"
        # A change is read in full.
        deadline = time.monotonic() + 10
        while cluster_gauges(nodes[0])[full] == reads_before[full]:
            assert time.monotonic() < deadline, cluster_gauges(nodes[0])
            time.sleep(0.2)
        assert listed["n1"]["pgs"] == "256" and listed["n2"]["pgs"] == "256"
        # Undrain and drain again; a stopped draining node stays draining.
        percore("cluster", "undrain", "n3", "--cluster", urls)
        assert status(urls)[0]["n3"]["pgs"] == "256"
        percore("cluster", "drain", "n3", "--cluster", urls)
        # A running node cannot be removed; a stopped one can.
        r = percore("cluster", "remove", "n3", "--cluster", urls, check=False)
        assert r.returncode == 1 and "running" in r.stderr
        nodes[2].terminate()
        listed = wait_for(urls, "n3", "no-lease", timeout=LEASE_TTL_S * 4, field="lease")
        time.sleep(LEASE_TTL_S)
        assert status(urls)[0]["n3"]["state"] == "draining"
        percore("cluster", "remove", "n3", "--cluster", urls)
        listed, _ = status(urls)
        assert sorted(listed) == ["n1", "n2"]
        r = percore("cluster", "drain", "n3", "--cluster", urls, check=False)
        assert r.returncode == 1 and "no node named n3" in r.stderr
    finally:
        for n in nodes:
            n.close()


def test_a_stopped_node_gives_up_its_lease(etcd):
    """SIGTERM: a node stops leading at once, drains, gives up its etcd
    lease once its shards have stopped, and exits. The other nodes mark it
    down at their next map read (a third of their lease) instead of once
    its lease expires (20 s here: 13.3 s or more after it stopped, renewed
    every 6.7 s), and started again at once it joins without waiting out
    its old lease."""
    urls = etcd.urls
    percore("cluster", "init", "--cluster", urls, "--replicas", "2", "--pgs", "64")
    a = Node("127.0.0.2", "a", "z1", urls)
    b = Node("127.0.0.3", "b", "z2", urls)
    b.env["PERCORE_CLUSTER_LEASE_TTL_S"] = "20"
    try:
        a.start()
        b.start()
        wait_for(urls, "b", "up")
        t = time.monotonic()
        b.terminate()
        stopped_s = time.monotonic() - t
        listed = wait_for(urls, "b", "down", timeout=30)
        down_s = time.monotonic() - t
        assert listed["b"]["lease"] == "no-lease", listed
        assert "percore: cluster lease given up" in b.logs(), b.logs()
        # Stopped and started again at once: no old lease to wait out.
        b.start()
        wait_for(urls, "b", "up")
        t = time.monotonic()
        b.terminate()
        b.start()
        restart_s = time.monotonic() - t
        print(f"\nSIGTERM with a 20 s lease: exited after {stopped_s:.1f} s, marked down "
              f"{down_s:.1f} s after the signal; stopped and ready again in {restart_s:.1f} s")
        assert down_s < 10, f"marked down {down_s:.1f} s after SIGTERM: the lease ran out instead"
        assert restart_s < 10, f"a restart took {restart_s:.1f} s: it waited out the old lease"
    finally:
        a.close()
        b.close()


def test_serve_refuses_bad_cluster_settings(etcd, tmp_path):
    """No cluster in etcd, a bad node name, --node without --cluster: each
    refused at start with what to do."""
    n = Node("127.0.0.2", "lonely", "z", etcd.urls)
    try:
        with pytest.raises(Exception) as e:
            n.start(timeout=20)
        assert "percore cluster init" in n.logs()
    finally:
        n.close()
    r = percore("serve", "--data", str(tmp_path / "d"), "--node", "x", check=False)
    assert r.returncode == 1 and "--cluster" in r.stderr
    percore("cluster", "init", "--cluster", etcd.urls, "--replicas", "1", "--pgs", "16")
    r = percore("serve", "--data", str(tmp_path / "d2"), "--cluster", etcd.urls, "--node",
                "bad/name", check=False)
    assert r.returncode == 1 and "node name" in r.stderr
    r = percore("serve", "--data", str(tmp_path / "d3"), "--cluster", etcd.urls, "--node",
                "n", "--zone", "rack a", check=False)
    assert r.returncode == 1 and "zone" in r.stderr
    r = percore("serve", "--data", str(tmp_path / "d4"), "--cluster", etcd.urls, "--node", "n",
                "--s3", "0.0.0.0:0", "--native", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                "--unpinned", "--shards", "1", check=False)
    assert r.returncode == 1 and "advertises its addresses" in r.stderr
    del e


def test_one_etcd_member_down(tmp_path):
    """Three etcd members; one killed: nodes keep their leases, a node
    still joins and the map still changes."""
    if ETCD is None:
        pytest.skip("etcd is not installed (tools/install-test-deps.sh installs etcd-server)")
    e = Etcd(tmp_path, members=3)
    nodes = []
    try:
        percore("cluster", "init", "--cluster", e.urls, "--replicas", "2", "--pgs", "64",
                "--down-out-s", "3")
        nodes = [Node("127.0.0.2", "a", "z1", e.urls), Node("127.0.0.3", "b", "z2", e.urls)]
        nodes[0].start()
        e.kill(0)
        time.sleep(LEASE_TTL_S + 1)
        nodes[1].start()
        listed, _ = status(e.urls)
        assert listed["a"]["state"] == "up" and listed["a"]["lease"] == "leased"
        assert listed["b"]["state"] == "up"
        nodes[1].kill9()
        wait_for(e.urls, "b", "down", timeout=LEASE_TTL_S * 4)
        # Out once the grace period (etcd's lease of --down-out-s) ends.
        wait_for(e.urls, "b", "out", timeout=20)
    finally:
        for n in nodes:
            n.close()
        e.close()
