"""Replication on a cluster (issue 18): R = 3 replicas per placement group,
three nodes on 127.0.0.2-4 in zones z1-z3 (so every node holds every key),
real etcd, leases of LEASE_TTL_S seconds.

The contract checked here:

* A PUT, DELETE or CompleteMultipartUpload through any node's S3 door is
  applied on the key's acting primary (its group's first replica that is
  `up` and synced) and pushed to the other replicas. It is acknowledged
  (2xx) only once every up replica, and at least a majority (2 of 3),
  applied it; otherwise the client gets 503 (retryable). An acknowledged
  write is therefore never lost while one node fails.
* `percore cluster status` shows `sync=yes|no` per node. A node that
  (re)joins starts with `sync=no`, pulls the state of every group it holds
  from the groups' acting primaries (newer objects fetched, keys the
  primary does not have deleted locally, tombstones kept), then says
  `sync=yes`.
* `POST /_percore/digest` (node-authenticated like `/_percore/list`, JSON
  body `{"epoch":0,"pgs":null,"after":null,"limit":1000}`) answers a page of
  the node's OWN stored state: `{"items": [[bucket, key, stamp,
  etag_or_null]], "next": [bucket, key] | null}`, in (bucket, key) order,
  stamp = the version's modification time in ms, etag null for a
  tombstone. `digest()` (in test_cluster_routing) pages through it.
* A node killed with kill -9 is marked `down` when its lease expires; the
  acting primary of its groups moves to the next synced up replica, and
  writes through the survivors resume within about LEASE_TTL_S plus a few
  seconds. Reads through the survivors keep working.

Tests:

* `test_replicas_hold_every_write` (no failure): PUTs through every door, a
  multipart upload and DELETEs; every node's digest holds exactly the
  same live keys with the same stamp and ETag, and no deleted key is live
  anywhere.
* `test_kill9_under_mixed_load_loses_nothing`: three threads of PUT / GET /
  DELETE through nodes 1 and 3; node 2 killed with kill -9 under the load.
  Measures how long writes stop, checks that no acknowledged write is lost
  and no read is wrong (during the load, after it through both survivors,
  in listings), then restarts node 2, waits for `sync=yes` and checks that
  the three replicas agree (digests) and that node 2's door serves the
  acknowledged state.
* `test_add_a_fourth_node_under_load`: the same load; a fourth node (zone
  z4, new data directory) joins under it, catches up its share of the
  groups (with 4 nodes and R = 3, about 3/4 of them) from their acting
  primaries, turns `sync=yes` and leads its groups. Measures how long that
  takes and the longest time without an acknowledged write; checks every
  read during the load, then every key through all four doors, listings,
  that the data moved (n4 stores live copies of exactly the keys whose
  groups it is a replica of), that each key's replicas agree, and that its
  acting primary holds the acknowledged state. The placement of a key is
  computed here from the documented contract (docs/cluster.md, "Placement
  contract"), checked against the pinned vectors and against the native
  client's `owner_node`.
* `test_placement_vectors` (no cluster): that computation reproduces the
  contract's pinned vectors.

The load is seeded (PERCORE_REPL_SEED, printed); the cluster's timing is
not, so the numbers printed vary from run to run, the verdicts must not.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import pytest
from botocore.exceptions import ClientError

import percore

from conftest import ServerFactory, unique_bucket_name
from test_cluster_membership import (  # noqa: F401  (etcd is a fixture)
    LEASE_TTL_S,
    SYNC_TIMEOUT_S,
    Node,
    cluster_gauges,
    etcd,
    loopback_ok,
    percore as percore_cli,
    status,
    wait_for,
)
from test_cluster_routing import (  # noqa: F401  (digest and wait_synced: shared)
    DIGEST,
    check_reply,
    digest,
    internal,
    keys_on,
    keys_stored,
    native_endpoint,
    node_header,
    node_id,
    wait_epoch,
    wait_synced,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SEED = int(os.environ.get("PERCORE_REPL_SEED", "18"))
# How long the replicas may take to agree after a node returns (repair).
REPAIR_S = 15
KiB, MiB = 1024, 1024 * 1024

# The kill -9 test's load.
THREADS = 3
POOL_KEYS = 80            # k/000 .. k/079, split between the threads
PRELOAD_KEYS = 60         # k/000 .. k/059 exist before the load starts
MIN_SIZE, MAX_SIZE = 100, 64 * KiB
PUT_SHARE, GET_SHARE = 0.45, 0.35   # the rest are DELETEs
PAUSE_S = 0.005           # between a thread's operations (2-core machines)
KILL_AFTER_S = 2.0        # into the load
LOAD_S = LEASE_TTL_S * 4 + 6
RESUME_LIMIT_S = LEASE_TTL_S + 10   # writes must resume this soon after the kill
# A map change reaches a node's shards up to a third of the lease (+50 ms)
# after it is written, and the survivors poll independently: for that long
# after writes resumed through one door, a GET through the other may still
# be routed by the old map. GETs must not fail after that.
MAP_LAG_S = LEASE_TTL_S / 3 + 0.5
PGS, REPLICAS = 64, 3     # cluster init --pgs 64 --replicas 3
# The event of a load waits at most this much longer than its start time
# for a first acknowledged write (a loaded machine's first requests).
FIRST_WRITE_WAIT_S = 8

# The add-a-node test's load (the same threads, keys and mix as above).
ADD_AFTER_S = 2.0         # n4 starts this far into the load
ADD_LOAD_S = 12           # the load runs at least this long ...
# ... and at least this long after n4 is synced: longer than the stall its
# taking over groups causes now (about 8 s, below), so that the load's last
# seconds show whether writes flow again under the new leaders.
AFTER_SYNC_S = 10
FLOWING_S = 2             # the load's last seconds must see ...
FLOWING_WRITES = 20       # ... at least this many writes acknowledged
# A node added takes the groups where it now scores among the top R: with
# 4 nodes in 4 zones and R = 3, about 3/4 of them (less than 40% of the
# keys would mean it did not fill its groups).
ADD_SHARE_MIN = 0.40
# The longest time without an acknowledged write that an added node may
# cause. A write waits for every up replica, the catching-up n4 included,
# and for its map: the join and the `sync=yes` mark are two map changes,
# each reaching the nodes' shards up to a third of the lease (+50 ms) after
# it is written, the nodes polling independently; meanwhile copies sent
# under the older map are refused (409) or held back by the fence (the
# primary waits for a newer map and copies again), and a catch-up pass that
# saw the map change runs again. Measured: about 8 s, from n4's `sync=yes`:
# a write its old primary took under the older map has its copies refused
# by replicas that run the new one (n4 leads the group now), and waits out
# its whole replication wait (REPLICATE_WAIT, 8 s, in
# server/src/cluster/replicate.rs; it waits for a map newer than the new
# one) before it is answered 503; each load thread has such a write, so
# all writes stop. Four leases (12 s) bounds that with a margin and still
# fails a join that stops writes for longer than any lease-driven step.
WRITE_GAP_LIMIT_S = LEASE_TTL_S * 4

# ---------------------------------------------------------------------------
# the expected state of a key
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Blob:
    """An object's content, by digest (the bytes are not kept)."""
    sha256: str
    md5: str
    size: int

    @staticmethod
    def of(data: bytes) -> "Blob":
        return Blob(hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest(), len(data))


def describe(state) -> str:
    return "absent" if state is None else f"{state.size} B sha256 {state.sha256[:12]}"


def describe_all(states) -> str:
    return " or ".join(sorted(describe(s) for s in states))


def fetch(client, bucket: str, key: str):
    """What a door serves for `key`: a Blob of its bytes, or None for 404
    NoSuchKey. Anything else raises."""
    try:
        resp = client.get_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchKey":
            return None
        raise
    return Blob.of(resp["Body"].read())


def http_status(e: ClientError) -> int:
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def answer_of(e: Exception) -> str:
    if isinstance(e, ClientError):
        return f"{http_status(e)} {e.response.get('Error', {}).get('Code')}"
    return f"no answer: {type(e).__name__}: {e}"


def load_client(node: Node):
    """A boto3 client for the load: one attempt per request (boto3 would
    retry a 503 by itself and hide the outage), short timeouts. botocore's
    `retries.max_attempts` counts the retries after the first attempt
    (conftest's default of 1 is one retry: it reports RetryAttempts=1), so
    0 here."""
    return node.client(max_attempts=0, connect_timeout=2, read_timeout=10)


# ---------------------------------------------------------------------------
# cluster helpers
# ---------------------------------------------------------------------------

class Cluster(ServerFactory):
    """Three nodes n1-n3 on 127.0.0.2-4, zones z1-z3 (and any added later).
    A ServerFactory, so that conftest's failure hook attaches every node's
    log to a failed test's report."""

    def __init__(self, urls: str, seed: int):
        super().__init__("cluster-replication")
        self.urls = urls
        self.seed = seed   # the placement seed `cluster init` chose
        for i in range(3):
            self.add_node(f"127.0.0.{i + 2}", f"n{i + 1}", f"z{i + 1}")

    def add_node(self, ip: str, name: str, zone: str) -> Node:
        """A node (not started) with a new data directory; closed, and its
        log attached to a failure, with the others."""
        assert loopback_ok(ip), f"cannot bind {ip}"
        node = Node(ip, name, zone, self.urls)
        self.servers.append(node)
        return node

    @property
    def nodes(self) -> list[Node]:
        return self.servers


def settle(cluster: Cluster, nodes: list[Node]) -> None:
    """Waits until `nodes` run the map etcd holds now (its epoch), and for
    one more map poll (a third of the lease), in case a node's sync state
    reaches the shards without moving the epoch."""
    _, summary = status(cluster.urls)
    epoch = int(re.search(r"epoch (\d+)", summary).group(1))
    for n in nodes:
        wait_epoch(n, epoch)
    time.sleep(LEASE_TTL_S / 3)


@pytest.fixture
def cluster(etcd):  # noqa: F811
    """`cluster init --replicas 3 --pgs 64` and three nodes, all up and
    synced, each running the latest map."""
    yield from started(etcd, REPLICAS)


@pytest.fixture
def cluster_r1(etcd):  # noqa: F811
    """`cluster` with `--replicas 1`."""
    yield from started(etcd, 1)


def started(etcd, replicas: int):  # noqa: F811
    out = percore_cli("cluster", "init", "--cluster", etcd.urls, "--replicas", str(replicas),
                      "--pgs", str(PGS)).stdout
    seed = re.search(r"seed (0x[0-9a-f]+)", out)
    assert seed, out
    c = Cluster(etcd.urls, int(seed.group(1), 16))
    try:
        for n in c.nodes:
            n.start()
        wait_synced(c.urls, ["n1", "n2", "n3"])
        settle(c, c.nodes)
        yield c
    finally:
        c.close()


def group_gauges(node: Node) -> dict[str, int]:
    """`percore_cluster_groups{kind=...}` of a node's /metrics, by kind."""
    return {k.split('"')[1]: v for k, v in cluster_gauges(node).items()
            if k.startswith("percore_cluster_groups{")}


def labelled(node: Node, name: str) -> list[tuple[dict[str, str], int]]:
    """The samples of metric `name` on a node's /metrics: (labels, value)."""
    out = []
    for series, value in cluster_gauges(node).items():
        head, _, labels = series.partition("{")
        if head != name:
            continue
        out.append((dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)), value))
    return out


def group_replicas(nodes: list[Node]) -> dict[int, dict[str, int]]:
    """`percore_cluster_group_replicas` of every node, by group: each group
    is shown by the one node that leads it (a second is a failure)."""
    groups: dict[int, dict[str, int]] = {}
    owner: dict[int, str] = {}
    for node in nodes:
        for labels, v in labelled(node, "percore_cluster_group_replicas"):
            pg = int(labels["pg"])
            assert owner.setdefault(pg, node.node_name) == node.node_name, (
                f"group {pg} shown by {owner[pg]} and {node.node_name}")
            groups.setdefault(pg, {})[labels["kind"]] = v
    return groups


def node_health(node: Node) -> dict[str, dict[str, object]]:
    """Per node as `node`'s /metrics shows it: its state, sync and groups."""
    out: dict[str, dict[str, object]] = {}
    for labels, v in labelled(node, "percore_cluster_node_state"):
        if v == 1:
            assert "state" not in out.setdefault(labels["node"], {}), labels
            out[labels["node"]]["state"] = labels["state"]
    for labels, v in labelled(node, "percore_cluster_node_synced"):
        out.setdefault(labels["node"], {})["synced"] = v
    for labels, v in labelled(node, "percore_cluster_node_groups"):
        out.setdefault(labels["node"], {})[labels["role"]] = v
    return out


def replica_lag(node: Node) -> dict[str, tuple[int, float]]:
    """Per other node, as `node` saw it as a primary: the writes it
    acknowledged without that node's copy and the oldest one's age in
    seconds (`percore_cluster_replica_missed_writes`, `_lag_seconds`)."""
    import urllib.request
    body = urllib.request.urlopen(f"http://{node.ip}:{node.admin_port}/metrics",
                                  timeout=5).read().decode()
    writes: dict[str, int] = {}
    lag: dict[str, float] = {}
    for line in body.splitlines():
        m = re.fullmatch(r'percore_cluster_replica_(missed_writes|lag_seconds)'
                         r'\{node="([^"]*)"\} (\S+)', line)
        if m:
            if m[1] == "missed_writes":
                writes[m[2]] = int(m[3])
            else:
                lag[m[2]] = float(m[3])
    assert sorted(writes) == sorted(lag), body
    return {n: (writes[n], lag[n]) for n in writes}


def etag_md5(etag: str | None) -> str | None:
    return None if etag is None else etag.strip('"')


def compare_digests(digests: dict[str, dict], uncertain: set = frozenset()) -> list[str]:
    """The replicas agree: a key live (ETag not None) on any node is live
    on every node with the same (stamp, ETag); a key deleted on a node
    (tombstone) is live on none. Absent and tombstone are both 'not live'.
    `uncertain` ((bucket, key) pairs whose last write failed) only labels
    the messages: replicas must agree on those too."""
    problems = []
    everywhere = sorted(set().union(*digests.values()))
    for where in everywhere:
        seen = {name: d.get(where) for name, d in digests.items()}
        live = {name: s for name, s in seen.items() if s is not None and s[1] is not None}
        if not live:
            continue
        note = " (its last write failed)" if where in uncertain else ""
        dead = sorted(name for name in seen if name not in live)
        if dead:
            problems.append(f"{where}{note}: live on {sorted(live)}, not on {dead}: {seen}")
        elif len(set(live.values())) != 1:
            problems.append(f"{where}{note}: replicas disagree: {seen}")
    return problems


def digest_vs_model(digests: dict[str, dict], bucket: str, possible: dict) -> list[str]:
    """Each node's stored state of `bucket` is one the key may be in: live
    with the ETag of a possible content, or not live when the key may be
    absent. Keys outside the model must not be live."""
    problems = []
    for name, d in digests.items():
        for (b, key), (_, etag) in d.items():
            if b == bucket and key not in possible and etag is not None:
                problems.append(f"{name}: {key} is live but was never written")
        for key, states in possible.items():
            entry = d.get((bucket, key))
            stored = etag_md5(entry[1]) if entry else None
            allowed = {s.md5 if s is not None else None for s in states}
            if stored not in allowed:
                problems.append(f"{name}: stores {key} as "
                                f"{'absent/deleted' if stored is None else 'ETag ' + stored}; "
                                f"expected {describe_all(states)}")
    return problems


def check_reads(client, bucket: str, possible: dict, door: str) -> list[str]:
    """GETs every key of the model through one door."""
    problems = []
    for key in sorted(possible):
        try:
            got = fetch(client, bucket, key)
        except Exception as e:  # noqa: BLE001 - report, check the other keys
            problems.append(f"GET {key} via {door} failed: {answer_of(e)}")
            continue
        if got not in possible[key]:
            problems.append(f"GET {key} via {door}: {describe(got)}, expected "
                            f"{describe_all(possible[key])}")
    return problems


def check_listing(client, bucket: str, possible: dict, door: str) -> list[str]:
    """ListObjectsV2 (pages of 25) lists every key that must be present,
    none that must be absent, each once, in order, with its size."""
    listed = []
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 25}):
        listed += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    keys = [k for k, _ in listed]
    problems = []
    if keys != sorted(set(keys)):
        problems.append(f"listing via {door} is out of order or lists a key twice: {keys}")
    must = {k for k, s in possible.items() if None not in s}
    may = {k for k, s in possible.items() if s != {None}}
    if must - set(keys):
        problems.append(f"listing via {door} misses {sorted(must - set(keys))}")
    if set(keys) - may:
        problems.append(f"listing via {door} has absent keys {sorted(set(keys) - may)}")
    for key, size in listed:
        states = possible.get(key, set())
        if len(states) == 1 and None not in states and next(iter(states)).size != size:
            problems.append(f"listing via {door}: {key} has size {size}, expected "
                            f"{describe_all(states)}")
    return problems


# ---------------------------------------------------------------------------
# placement: which nodes hold a key (docs/cluster.md, "Placement contract"),
# computed here to check where the data is; a second implementation of the
# contract, checked against its pinned vectors below and against the native
# client's owner_node in the test that uses it
# ---------------------------------------------------------------------------

M64 = (1 << 64) - 1
# The first 128 bytes of XXH3's default secret (kSecret), all that inputs
# of up to 128 bytes use. XXH3 with a seed uses it as it is for inputs of
# up to 240 bytes.
XXH3_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364")


def _le64(b: bytes, at: int) -> int:
    return int.from_bytes(b[at:at + 8], "little")


def _mul_fold(a: int, b: int) -> int:
    p = a * b
    return (p ^ (p >> 64)) & M64


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & M64
    return h ^ (h >> 32)


def xxh3_64(data: bytes, seed: int) -> int:
    """XXH3-64 with a seed, for inputs of 9 to 128 bytes (the reference
    algorithm's 9-16 and 17-128 byte paths): enough for a score's 10 bytes
    and an object hash of a short bucket and key."""
    n, s = len(data), XXH3_SECRET
    if 9 <= n <= 16:
        lo = _le64(data, 0) ^ (((_le64(s, 24) ^ _le64(s, 32)) + seed) & M64)
        hi = _le64(data, n - 8) ^ (((_le64(s, 40) ^ _le64(s, 48)) - seed) & M64)
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _mul_fold(lo, hi)) & M64)
    assert 17 <= n <= 128, f"xxh3_64 here covers inputs of 9 to 128 bytes, not {n}"

    def mix16(at: int, secret_at: int) -> int:
        return _mul_fold(_le64(data, at) ^ ((_le64(s, secret_at) + seed) & M64),
                         _le64(data, at + 8) ^ ((_le64(s, secret_at + 8) - seed) & M64))

    acc = n * 0x9E3779B185EBCA87
    if n > 32:
        if n > 64:
            if n > 96:
                acc += mix16(48, 96) + mix16(n - 64, 112)
            acc += mix16(32, 64) + mix16(n - 48, 80)
        acc += mix16(16, 32) + mix16(n - 32, 48)
    acc += mix16(0, 0) + mix16(n - 16, 16)
    return _avalanche(acc & M64)


def pg_of(seed: int, pgs: int, bucket: str, key: str) -> int:
    b = bucket.encode()
    h = xxh3_64(len(b).to_bytes(2, "little") + b + key.encode(), seed)
    return (h * pgs) >> 64


def score(seed: int, pg: int, node: int) -> int:
    return xxh3_64(b"pg" + pg.to_bytes(4, "little") + node.to_bytes(4, "little"), seed)


def replicas_of(seed: int, pg: int, r: int, nodes: list[tuple[int, str, str]]) -> list[int]:
    """The ids of `pg`'s replicas, primary first, over `nodes` ((id, zone,
    state)): eligible nodes (up or down) by score, highest first (ties: lower
    id), one per zone, then a second walk for what is missing."""
    ranked = sorted(((score(seed, pg, i), i, z) for i, z, st in nodes if st in ("up", "down")),
                    key=lambda t: (-t[0], t[1]))
    chosen: list[int] = []
    zones: set[str] = set()
    for _, i, zone in ranked:
        if len(chosen) < r and zone not in zones:
            zones.add(zone)
            chosen.append(i)
    for _, i, _ in ranked:
        if len(chosen) < r and i not in chosen:
            chosen.append(i)
    return chosen


def test_placement_vectors():
    """The pinned vectors of docs/cluster.md (no cluster needed)."""
    s = 0x706572636F726531
    assert xxh3_64(b"\x06\x00bucketkey", s) == 0x5DCD05CFACFD11CE
    assert pg_of(s, 4096, "bucket", "key") == 1500
    assert pg_of(s, 1000, "bucket", "key") == 366
    assert score(s, 7, 3) == 0x2335CEA84C8EB50D
    assert replicas_of(s, 1500, 3, [(i, "abc"[i % 3], "up") for i in range(1, 7)]) == [1, 3, 2]
    two = [(i, "ab"[i % 2], "up") for i in range(1, 7)]
    assert replicas_of(s, 42, 3, two) == [5, 6, 1]
    two[0:3] = [(1, "b", "draining"), (2, "a", "out"), (3, "b", "down")]
    assert replicas_of(s, 42, 3, two) == [5, 6, 3]


def placement(cluster: Cluster, bucket: str, keys: list[str],
              r: int = REPLICAS) -> dict[str, list[str]]:
    """Each key's replicas (node names, primary first) under the map etcd
    holds now."""
    listed, _ = status(cluster.urls)
    nodes = [(int(row["id"]), row["zone"], row["state"]) for row in listed.values()]
    names = {int(row["id"]): name for name, row in listed.items()}
    return {k: [names[i] for i in replicas_of(cluster.seed, pg_of(cluster.seed, PGS, bucket, k),
                                              r, nodes)]
            for k in keys}


# ---------------------------------------------------------------------------
# the load
# ---------------------------------------------------------------------------

@dataclass
class Op:
    kind: str       # "put", "delete" or "get"
    key: str
    door: str       # the node whose S3 door took it
    start: float    # time.monotonic()
    end: float
    ok: bool        # writes: acknowledged; GETs: answered (200, or 404 NoSuchKey)
    answer: str = ""


class Worker(threading.Thread):
    """One load thread: random PUT / GET / DELETE on its own keys through
    the doors it is given. No other thread touches its keys, so each key
    has one operation at a time and the order of its acknowledgements is
    the order the cluster applied them.

    `possible[key]` is the set of states the key may be in: one state
    after an acknowledged write; a write that failed adds its state (it may
    or may not have been applied) until the next acknowledged write. A
    write that got no answer at all (timeout, connection lost) might still
    be applied later, after a next write: its key is retired (no more
    operations) so that its state stays one of the two."""

    def __init__(self, index: int, keys: list[str], possible: dict, doors: list, bucket: str,
                 seed: int, t0: float, stop: threading.Event):
        super().__init__(name=f"load-{index}", daemon=True)
        self.active = sorted(keys)
        self.possible = {k: set(possible[k]) for k in keys}
        self.doors = doors   # [(node name, boto3 client)]
        self.bucket = bucket
        self.rng = random.Random(seed)
        self.t0 = t0
        self.stop = stop
        self.ops: list[Op] = []
        self.problems: list[str] = []
        self.retired: list[str] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.active:
                key = self.rng.choice(self.active)
                door, client = self.rng.choice(self.doors)
                roll = self.rng.random()
                if roll < PUT_SHARE:
                    body = self.rng.randbytes(self.rng.randint(MIN_SIZE, MAX_SIZE))
                    self.write("put", key, door, client, body)
                elif roll < PUT_SHARE + GET_SHARE:
                    self.get(key, door, client)
                else:
                    self.write("delete", key, door, client, None)
                time.sleep(PAUSE_S)
        except BaseException:  # noqa: BLE001 - a dead thread must fail the test
            self.problems.append(f"{self.name} crashed:\n{traceback.format_exc()}")

    def at(self) -> str:
        return f"at {time.monotonic() - self.t0:.2f} s"

    def write(self, kind: str, key: str, door: str, client, body: bytes | None) -> None:
        new = None if body is None else Blob.of(body)
        start = time.monotonic()
        try:
            if body is None:
                resp = client.delete_object(Bucket=self.bucket, Key=key)
                good = resp["ResponseMetadata"]["HTTPStatusCode"] == 204
            else:
                resp = client.put_object(Bucket=self.bucket, Key=key, Body=body)
                good = resp.get("ETag") == f'"{new.md5}"'
        except ClientError as e:  # the server answered: applied or not, it is done
            self.failed(kind, key, door, start, new, answer_of(e))
            if http_status(e) < 500:
                self.problems.append(f"{kind} {key} via {door} {self.at()}: {answer_of(e)}")
            return
        except Exception as e:  # noqa: BLE001 - no answer: it may still land later
            self.failed(kind, key, door, start, new, answer_of(e))
            self.active.remove(key)
            self.retired.append(key)
            return
        if not good:
            self.failed(kind, key, door, start, new, "unexpected answer")
            self.problems.append(f"{kind} {key} via {door} {self.at()}: unexpected answer "
                                 f"{resp.get('ResponseMetadata', {}).get('HTTPStatusCode')} "
                                 f"ETag {resp.get('ETag')} (content md5 "
                                 f"{new.md5 if new else '-'})")
            return
        self.ops.append(Op(kind, key, door, start, time.monotonic(), True))
        self.possible[key] = {new}

    def failed(self, kind: str, key: str, door: str, start: float, new, answer: str) -> None:
        self.ops.append(Op(kind, key, door, start, time.monotonic(), False, answer))
        self.possible[key].add(new)

    def get(self, key: str, door: str, client) -> None:
        start = time.monotonic()
        try:
            got = fetch(client, self.bucket, key)
        except Exception as e:  # noqa: BLE001 - a failed read changes nothing
            self.ops.append(Op("get", key, door, start, time.monotonic(), False, answer_of(e)))
            if isinstance(e, ClientError) and http_status(e) < 500:
                self.problems.append(f"GET {key} via {door} {self.at()}: {answer_of(e)}")
            return
        self.ops.append(Op("get", key, door, start, time.monotonic(), True))
        if got not in self.possible[key]:
            self.problems.append(f"GET {key} via {door} {self.at()}: served {describe(got)}, "
                                 f"expected {describe_all(self.possible[key])}")


def preload(client, bucket: str, rng: random.Random) -> dict[str, set]:
    """The key pool (k/000 ..) with its first PRELOAD_KEYS keys written:
    the model, key -> the set of states it may be in."""
    keys = [f"k/{i:03d}" for i in range(POOL_KEYS)]
    possible: dict[str, set] = {k: {None} for k in keys}
    for key in keys[:PRELOAD_KEYS]:
        body = rng.randbytes(rng.randint(MIN_SIZE, MAX_SIZE))
        client.put_object(Bucket=bucket, Key=key, Body=body)
        possible[key] = {Blob.of(body)}
    return possible


@dataclass
class Load:
    """What a run of the load did, and the model after it."""
    t0: float              # the load's start (time.monotonic())
    event_t: float         # when the event under the load began
    end: float             # when every thread had stopped
    ops: list[Op]          # every operation, by start time
    problems: list[str]    # wrong answers (a read of an impossible state, a 4xx)
    possible: dict         # key -> the states it may be in now
    retired: list[str]     # keys whose write got no answer

    @property
    def writes(self) -> list[Op]:
        return [o for o in self.ops if o.kind != "get"]

    @property
    def gets(self) -> list[Op]:
        return [o for o in self.ops if o.kind == "get"]

    @property
    def uncertain(self) -> list[str]:
        """Keys whose last write failed: either state is possible."""
        return sorted(k for k, s in self.possible.items() if len(s) > 1)

    @property
    def early(self) -> list[Op]:
        """Operations that failed before the event (every node up)."""
        return [o for o in self.ops if not o.ok and o.end < self.event_t]


def run_load(bucket: str, possible: dict, doors: list[Node], rng: random.Random,
             load_s: float, event_after_s: float, event: Callable[[], None]) -> Load:
    """THREADS load threads, each on its own keys of `possible` (split
    round-robin), each through every door of `doors` (a client of its own);
    `event_after_s` into the load, once a write was acknowledged, `event()`
    runs (in this thread, the load going on); the load stops `load_s` after
    its start, or when `event` returns if that is later."""
    keys = sorted(possible)
    stop = threading.Event()
    t0 = time.monotonic()
    workers = [Worker(i, keys[i::THREADS], possible,
                      [(n.node_name, load_client(n)) for n in doors],
                      bucket, rng.getrandbits(64), t0, stop)
               for i in range(THREADS)]
    for w in workers:
        w.start()
    try:
        time.sleep(max(0.0, t0 + event_after_s - time.monotonic()))
        # A first request may take longer on a loaded machine (new
        # connections, clients): the event waits for one acknowledged write.
        late = time.monotonic() + FIRST_WRITE_WAIT_S
        while (not any(o.ok and o.kind != "get" for w in workers for o in w.ops)
               and time.monotonic() < late):
            time.sleep(0.05)
        assert any(o.ok and o.kind != "get" for w in workers for o in w.ops), (
            f"no write acknowledged in the first {event_after_s + FIRST_WRITE_WAIT_S} s with "
            f"every node up: "
            f"{[w.ops[:3] for w in workers]} {[w.problems[:3] for w in workers]}")
        event_t = time.monotonic()
        event()
        time.sleep(max(0.0, t0 + load_s - time.monotonic()))
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert not any(w.is_alive() for w in workers), "a load thread is stuck"
    after = dict(possible)
    for w in workers:
        after.update(w.possible)
    return Load(t0=t0, event_t=event_t, end=time.monotonic(),
                ops=sorted((o for w in workers for o in w.ops), key=lambda o: o.start),
                problems=[p for w in workers for p in w.problems], possible=after,
                retired=[k for w in workers for k in w.retired])


def longest_write_gap(ops: list[Op], start: float, end: float) -> tuple[float, float]:
    """The longest time between `start` and `end` in which no write was
    acknowledged (a stall up to `end` counts): (its length, its start)."""
    acks = sorted(o.end for o in ops if o.kind != "get" and o.ok and start <= o.end <= end)
    marks = [start, *acks, end]
    return max((b - a, a) for a, b in zip(marks, marks[1:]))


def show_ops(ops: list[Op], kill_t: float) -> list[tuple]:
    """Operations for a failure message: (start s after the kill, kind,
    key, door, answer)."""
    return [(round(o.start - kill_t, 2), o.kind, o.key, o.door, o.answer) for o in ops]


def writes_resumed_at(ops: list[Op], kill_t: float) -> tuple[float | None, float]:
    """When writes worked again after the kill: the end of the first
    acknowledged write that started after the last failed write ended (or
    after the kill, when none failed: a write that hangs instead of failing
    counts as an outage too). Returns (that time or None, the last failure's
    end or kill_t)."""
    writes = [o for o in ops if o.kind != "get"]
    last_bad = max((o.end for o in writes if not o.ok and o.end >= kill_t), default=kill_t)
    resumed = min((o.end for o in writes if o.ok and o.start >= last_bad), default=None)
    return resumed, last_bad


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------

def test_replicas_hold_every_write(cluster):
    """No failure: every write through any door is on all three replicas,
    with the same stamp and ETag, once it is acknowledged."""
    nodes = cluster.nodes
    rng = random.Random(SEED + 1)
    s3 = [n.client() for n in nodes]
    bucket = unique_bucket_name("repl-every")
    s3[0].create_bucket(Bucket=bucket)
    t0_ms = int(time.time() * 1000)

    objects: dict[str, bytes] = {}
    etags: dict[str, str] = {}
    for i in range(20):
        key, body = f"obj/{i:02d}", rng.randbytes(rng.randint(1, 70_000))
        resp = s3[i % 3].put_object(Bucket=bucket, Key=key, Body=body)
        assert resp["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        objects[key], etags[key] = body, hashlib.md5(body).hexdigest()

    # A multipart upload through node 3: two parts of 5 MiB and a small one.
    parts = [rng.randbytes(5 * MiB), rng.randbytes(5 * MiB), rng.randbytes(1000)]
    up = s3[2].create_multipart_upload(Bucket=bucket, Key="mpu/big")["UploadId"]
    done = [{"PartNumber": n + 1,
             "ETag": s3[2].upload_part(Bucket=bucket, Key="mpu/big", UploadId=up,
                                       PartNumber=n + 1, Body=p)["ETag"]}
            for n, p in enumerate(parts)]
    resp = s3[2].complete_multipart_upload(Bucket=bucket, Key="mpu/big", UploadId=up,
                                           MultipartUpload={"Parts": done})
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    assert etag_md5(resp["ETag"]) == want
    objects["mpu/big"], etags["mpu/big"] = b"".join(parts), want

    deleted = [f"obj/{i:02d}" for i in range(0, 20, 4)]
    for j, key in enumerate(deleted):
        s3[(j + 1) % 3].delete_object(Bucket=bucket, Key=key)
        del objects[key], etags[key]
    t1_ms = int(time.time() * 1000)

    digests = {n.node_name: digest(n) for n in nodes}
    # Paging: small pages give the same state.
    assert digest(nodes[0], limit=3) == digests["n1"]
    problems = compare_digests(digests)
    for name, d in digests.items():
        live = {k: etag_md5(e) for (b, k), (_, e) in d.items() if b == bucket and e is not None}
        if live != etags:
            problems.append(f"{name}: live keys {sorted(live.items())}, expected "
                            f"{sorted(etags.items())}")
        for key in deleted:
            entry = d.get((bucket, key))
            if entry is not None and entry[1] is not None:
                problems.append(f"{name}: deleted {key} is live: {entry}")
        # Stamps are milliseconds of this test's writes (same machine clock).
        for (b, k), (stamp, _) in d.items():
            if b == bucket and not t0_ms - 2000 <= stamp <= t1_ms + 2000:
                problems.append(f"{name}: {k} has stamp {stamp}, written between "
                                f"{t0_ms} and {t1_ms} (ms)")
    assert not problems, "replicas differ after acknowledged writes:\n" + "\n".join(problems)

    # Every door reads every key and lists each key once.
    possible = {k: {Blob.of(v)} for k, v in objects.items()}
    possible.update({k: {None} for k in deleted})
    for i, node in enumerate(nodes):
        problems += check_listing(s3[i], bucket, possible, node.node_name)
    for j, key in enumerate(sorted(possible)):
        door = (j + 1) % 3
        problems += check_reads(s3[door], bucket, {key: possible[key]}, nodes[door].node_name)
    assert not problems, "\n".join(problems)

    # The digest is node-authenticated like the other internal requests.
    body = json.dumps({"epoch": 0, "pgs": None, "after": None, "limit": 10}).encode()
    forged = node_header("POST", DIGEST, node_id(nodes[0]), body, secret="wrong")
    code, raw = internal(nodes[0], "POST", DIGEST, body, header=forged)
    assert code == 403 and b"AccessDenied" in raw, (code, raw[:300])


def test_kill9_under_mixed_load_loses_nothing(cluster):
    """kill -9 of node 2 under PUT / GET / DELETE load through nodes 1 and 3:
    writes stop until its lease expires and its groups get another acting
    primary, then resume; nothing acknowledged is lost, no read is wrong;
    node 2 comes back, syncs, and the three replicas agree."""
    n1, n2, n3 = cluster.nodes
    rng = random.Random(SEED)
    bucket = unique_bucket_name("repl-kill9")
    n1.client().create_bucket(Bucket=bucket)
    possible = preload(n1.client(), bucket, rng)

    marks: dict[str, float] = {}

    def kill() -> None:
        # Copies skipped so far (any node): each counts as a write a
        # replica lacks, though it ended before the kill.
        marks["skips_read"] = time.monotonic()
        marks["skipped"] = sum(
            v for node in cluster.nodes for k, v in cluster_gauges(node).items()
            if k.startswith("percore_cluster_writes_replica_skipped_total"))
        n2.kill9()
        marks["killed"] = time.monotonic()
        wait_for(cluster.urls, "n2", "down", timeout=LEASE_TTL_S * 4)
        marks["down"] = time.monotonic()

    # Three threads, each on its own keys, each through the survivors' doors.
    load = run_load(bucket, possible, [n1, n3], rng, LOAD_S, KILL_AFTER_S, kill)
    t0, kill_t, down_t, load_end = load.t0, load.event_t, marks["down"], load.end
    ops, problems, possible = load.ops, load.problems, load.possible
    retired, uncertain = load.retired, load.uncertain
    writes, gets, early = load.writes, load.gets, load.early
    resumed, last_bad = writes_resumed_at(ops, kill_t)
    failed_writes = [o for o in writes if not o.ok]
    failed_gets = [o for o in gets if not o.ok]
    gets_after = [o for o in failed_gets if resumed is not None and o.start >= resumed]
    late_gets = [o for o in gets_after if o.start >= resumed + MAP_LAG_S]
    writes_after = [o for o in writes if o.ok and resumed is not None and o.start >= resumed]
    resume_s = None if resumed is None else resumed - kill_t
    print(f"\nreplication kill -9 (seed {SEED}): n2 killed {kill_t - t0:.1f} s into "
          f"{load_end - t0:.1f} s of load, marked down {down_t - kill_t:.1f} s after the kill; "
          f"writes resumed {'never' if resume_s is None else f'{resume_s:.2f} s'} after the "
          f"kill (last failed write ended {last_bad - kill_t:.2f} s after it); "
          f"{sum(o.ok for o in writes)} writes acknowledged, {len(failed_writes)} failed; "
          f"{len(gets)} GETs, {len(failed_gets)} failed ({len(gets_after)} after the resume, "
          f"{len(late_gets)} more than {MAP_LAG_S:.1f} s after it); "
          f"{len(writes_after)} writes acknowledged after the resume; "
          f"{len(uncertain)} keys uncertain, {len(retired)} retired (no answer)")
    if failed_writes:
        print("  failed writes answered: " + ", ".join(sorted({o.answer for o in failed_writes})))

    assert not problems, "wrong answers under load:\n" + "\n".join(problems[:30])
    assert not early, f"operations failed with every node up: {show_ops(early[:10], kill_t)}"
    assert resume_s is not None and resume_s <= RESUME_LIMIT_S, (
        f"writes did not resume within {RESUME_LIMIT_S} s of the kill (resumed: {resume_s}); "
        f"last failed write ended {last_bad - kill_t:.2f} s after the kill; failures: "
        f"{show_ops(failed_writes[-10:], kill_t)}")
    assert len(writes_after) >= 5, f"only {len(writes_after)} writes after the resume"
    assert not late_gets, (f"GETs failed more than {MAP_LAG_S:.1f} s after writes resumed: "
                           f"{show_ops(late_gets[:10], kill_t)}")

    # With n2 down every group has 2 of its 3 replicas up (degraded), none
    # is unavailable, and the survivors lead every group between them.
    groups = {n.node_name: group_gauges(n) for n in (n1, n3)}
    for name, g in groups.items():
        assert g["degraded"] == PGS and g["unavailable"] == 0 and g["held"] == PGS, (name, g)
    assert sum(g["led"] for g in groups.values()) == PGS, groups
    # Per node and per group, as the survivors' /metrics show them.
    for node in (n1, n3):
        health = node_health(node)
        assert health["n2"]["state"] == "down" and health["n2"]["led"] == 0, health
        assert health["n2"]["held"] == PGS, health
        assert health["n1"]["led"] + health["n3"]["led"] == PGS, health
        assert all(health[n]["state"] == "up" for n in ("n1", "n3")), health
    per_group = group_replicas([n1, n3])
    assert sorted(per_group) == list(range(PGS)), sorted(per_group)
    assert all(g == {"placed": 3, "up": 2, "synced": 2} for g in per_group.values()), per_group
    # How far behind n2 is, as the survivors (its groups' primaries) count
    # it: every write they acknowledged since it died (each group holds
    # n2), and no more than the writes that ended after the copies
    # skipped before the kill were read, plus those; its lag at least the
    # age of the first write after its death and (none skipped before)
    # at most the time since that read. n1 and n3 lack none.
    scraped = time.monotonic()
    lags = {n.node_name: replica_lag(n) for n in (n1, n3)}
    scraped_end = time.monotonic()
    missed = sum(lag["n2"][0] for lag in lags.values())
    lag_s = max(lag["n2"][1] for lag in lags.values())
    dead = [o for o in writes if o.ok and o.start >= marks["killed"]]
    ended = [o for o in writes if o.end >= marks["skips_read"]]
    print(f"  n2 lacks {missed} writes as its primaries count them ({len(dead)} acknowledged "
          f"after it died, {len(ended)} ended after the kill began, {marks['skipped']:.0f} "
          f"copies skipped before), lag {lag_s:.1f} s")
    assert len(dead) <= missed <= len(ended) + marks["skipped"], (
        len(dead), missed, len(ended), marks["skipped"], lags)
    oldest = min(o.end for o in dead)
    assert lag_s >= scraped - oldest - 0.01, (lags, scraped - oldest)
    if not marks["skipped"]:
        assert lag_s <= scraped_end - marks["skips_read"] + 0.01, (
            lags, scraped_end - marks["skips_read"])
    assert lags["n1"]["n3"] == (0, 0.0) and lags["n3"]["n1"] == (0, 0.0), lags

    # After the load, with n2 still down: both survivors serve every key as
    # acknowledged, and list them.
    for node in (n1, n3):
        client = load_client(node)
        problems += check_reads(client, bucket, possible, node.node_name)
        problems += check_listing(client, bucket, possible, node.node_name)
    assert not problems, ("survivors differ from the acknowledged state (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))

    # n2 returns on its data, syncs from the acting primaries, and then
    # holds what they hold.
    restart_t = time.monotonic()
    n2.start(timeout=SYNC_TIMEOUT_S)
    wait_synced(cluster.urls, ["n1", "n2", "n3"])
    print(f"  n2 restarted, up and sync=yes after {time.monotonic() - restart_t:.1f} s")
    settle(cluster, cluster.nodes)
    # The nodes that took over n2's groups, and n2 once it leads them
    # again, repair the other replicas of their groups (writes that were
    # not acknowledged may have reached some replicas only): the replicas
    # agree within a few seconds.
    deadline = time.monotonic() + REPAIR_S
    while True:
        digests = {n.node_name: digest(n) for n in cluster.nodes}
        problems = (compare_digests(digests, {(bucket, k) for k in uncertain})
                    + digest_vs_model(digests, bucket, possible))
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print(f"  replicas agree {time.monotonic() - restart_t:.1f} s after n2's restart")
    groups = {n.node_name: group_gauges(n) for n in cluster.nodes}
    for name, g in groups.items():
        assert g["degraded"] == 0 and g["unavailable"] == 0 and g["waiting"] == 0, (name, g)
    assert sum(g["led"] for g in groups.values()) == PGS, groups
    # Every group whole again: none is shown.
    assert group_replicas(cluster.nodes) == {}
    health = node_health(n2)
    assert all(h["state"] == "up" and h["synced"] == 1 and h["held"] == PGS
               for h in health.values()), health
    # Caught up: no node counts n2 (or any node) behind.
    lags = {n.node_name: replica_lag(n) for n in cluster.nodes}
    assert all(v == (0, 0.0) for lag in lags.values() for v in lag.values()), lags
    assert all(len(lag) == 2 for lag in lags.values()), lags
    assert not problems, ("replicas differ after n2 synced (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))
    problems = check_reads(load_client(n2), bucket, possible, "n2")
    assert not problems, ("n2's door differs from the acknowledged state (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))


def test_a_copy_whose_bytes_differ_from_its_state_is_refused(cluster):
    """A replica checks a copy's bytes against the MD5 and size its state
    names (hashed by the shard's MD5 engine) before the version can become
    visible: a push from the key's primary, correctly signed, whose body
    has one byte changed is refused and installs nothing; the same push
    with the right bytes is taken (so the refusal was for the bytes)."""
    import base64
    import http.client
    bucket = unique_bucket_name("repl-bad-copy")
    cluster.nodes[0].client().create_bucket(Bucket=bucket)
    key = "k"
    cluster.nodes[0].client().put_object(Bucket=bucket, Key=key, Body=os.urandom(100_000))
    names = placement(cluster, bucket, [key])[key]
    by_name = {n.node_name: n for n in cluster.nodes}
    primary, replica = by_name[names[0]], by_name[names[1]]
    held = digest(replica)[(bucket, key)]
    body = os.urandom(150_000)
    state = json.dumps({
        "epoch": cluster_gauges(replica)["percore_cluster_epoch"],
        "stamp": held[0] + 1000, "etag": hashlib.md5(body).hexdigest(), "size": len(body),
        "mtime_ms": int(time.time() * 1000), "content_type": "application/octet-stream",
        "headers": [], "md5": hashlib.md5(body).hexdigest()}).encode()
    target = f"/_percore/push?bucket={bucket}&key={key}"

    def push(data: bytes) -> tuple[int, bytes]:
        mac = node_header("PUT", target, node_id(replica), sender=node_id(primary),
                          digest=hashlib.sha256(state).hexdigest())
        conn = http.client.HTTPConnection(replica.ip, replica.s3_port, timeout=10)
        try:
            conn.request("PUT", target, body=data, headers={
                "x-percore-node": mac, "x-percore-state": base64.b64encode(state).decode()})
            r = conn.getresponse()
            answer = r.read()
            # The acknowledgement is signed, bound to this request.
            if r.status == 200:
                check_reply(mac, 200, hashlib.sha256(answer).hexdigest(),
                            r.getheader("x-percore-reply"))
            return r.status, answer
        finally:
            conn.close()

    bad = bytearray(body)
    bad[len(bad) // 2] ^= 1
    status_bad, answer = push(bytes(bad))
    assert status_bad >= 400 and b"do not match its state" in answer, (status_bad, answer)
    assert digest(replica)[(bucket, key)] == held, "a copy with wrong bytes was installed"
    # Shorter and longer than the state's size (the request's own length
    # says so): refused, nothing installed.
    for wrong in (body[:-1], body + b"x"):
        status_bad, answer = push(wrong)
        assert status_bad >= 400, (len(wrong), status_bad, answer)
        assert digest(replica)[(bucket, key)] == held, f"a copy of {len(wrong)} bytes was installed"
    status_ok, answer = push(body)
    assert status_ok == 200, (status_ok, answer)
    assert digest(replica)[(bucket, key)] == (held[0] + 1000, hashlib.md5(body).hexdigest())

    # A fetch's answer is signed over its state header (whose MD5 covers
    # the bytes), and its 404 too (a mirroring catch-up drops its own copy
    # on it).
    for k, want in ((key, 200), ("never-written", 404)):
        fetch = f"/_percore/fetch?bucket={bucket}&key={k}"
        mac = node_header("GET", fetch, node_id(replica), sender=node_id(primary))
        conn = http.client.HTTPConnection(replica.ip, replica.s3_port, timeout=10)
        try:
            conn.request("GET", fetch, headers={"x-percore-node": mac})
            r = conn.getresponse()
            got = r.read()
            assert r.status == want, (k, r.status, got)
            covered = "absent" if want == 404 else "state " + r.getheader("x-percore-state")
            check_reply(mac, want, covered, r.getheader("x-percore-reply"))
            if want == 200:
                assert got == body
        finally:
            conn.close()

    # Copies keep their connection open for the primary's next copy (a
    # shard keeps its copies' connections): two on one connection; a third
    # of a version the replica holds already is answered without its bytes
    # being read, so that connection closes after the answer.
    conn = http.client.HTTPConnection(replica.ip, replica.s3_port, timeout=10)
    try:
        for extra in (2000, 3000, 3000):
            again = json.loads(state)
            again["stamp"] = held[0] + extra
            raw = json.dumps(again).encode()
            mac = node_header("PUT", target, node_id(replica), sender=node_id(primary),
                              digest=hashlib.sha256(raw).hexdigest())
            conn.request("PUT", target, body=body, headers={
                "x-percore-node": mac, "x-percore-state": base64.b64encode(raw).decode()})
            r = conn.getresponse()
            answer = r.read()
            assert r.status == 200, (extra, r.status, answer)
            assert json.loads(answer)["applied"] == (not r.will_close), (extra, answer)
            assert json.loads(answer)["stamp"] == held[0] + extra, answer
    finally:
        conn.close()


def test_catch_up_is_paced(cluster):
    """A node that returns takes what it missed at most
    cluster_backfill_mib_s a second: n3 is killed, marked down, 13 MiB are
    written without it (one a multipart object), and it is restarted with a bound of 2 MiB/s. Its
    `percore_cluster_backfill_bytes_total` grows to at least the missed
    bytes, never faster than the bound (plus the one second the token
    bucket holds and one read chunk, per window sampled), so it syncs no
    sooner than the bound allows; then the replicas agree."""
    n1, _, n3 = cluster.nodes
    bucket = unique_bucket_name("repl-pace")
    s3 = n1.client()
    s3.create_bucket(Bucket=bucket)
    n3.kill9()
    wait_for(cluster.urls, "n3", "down", timeout=LEASE_TTL_S * 4)
    settle(cluster, [n1, cluster.nodes[1]])
    missed = 32 * 256 * KiB
    for i in range(32):
        s3.put_object(Bucket=bucket, Key=f"paced/{i:02d}", Body=os.urandom(256 * KiB))
    # A multipart object whose first part is not a multiple of 1 MiB (a
    # fetch's reads end at the part's end).
    up = s3.create_multipart_upload(Bucket=bucket, Key="paced/mpu")["UploadId"]
    sizes = [5 * MiB + 4099, 3000]
    parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key="paced/mpu", UploadId=up,
                                                      PartNumber=n, Body=os.urandom(size))["ETag"]}
             for n, size in enumerate(sizes, start=1)]
    s3.complete_multipart_upload(Bucket=bucket, Key="paced/mpu", UploadId=up,
                                 MultipartUpload={"Parts": parts})
    missed += sum(sizes)
    rate = 2 * MiB
    n3.env["PERCORE_CLUSTER_BACKFILL_MIB_S"] = str(rate // MiB)
    start = time.monotonic()
    n3.start(timeout=SYNC_TIMEOUT_S)
    samples: list[tuple[float, int]] = []
    deadline = start + SYNC_TIMEOUT_S
    # Per group: the groups n3 still has to take (each from one node, the
    # synced primary), and n3 behind in the groups n1 and n2 lead.
    pending: list[int] = []
    behind_seen = False
    while True:
        g = cluster_gauges(n3)
        samples.append((time.monotonic(), g["percore_cluster_backfill_bytes_total"]))
        left = labelled(n3, "percore_cluster_backfill_group_sources_left")
        assert all(v == 1 and 0 <= int(lb["pg"]) < PGS for lb, v in left), left
        pending.append(len(left))
        nodes, _ = status(cluster.urls)
        if nodes["n3"]["sync"] == "yes":
            break
        if left:
            per_group = group_replicas(cluster.nodes[:2])
            behind_seen |= any(g2 == {"placed": 3, "up": 3, "synced": 2}
                               for g2 in per_group.values())
        assert time.monotonic() < deadline, f"n3 never synced: {nodes}"
        time.sleep(0.2)
    synced_s = time.monotonic() - start
    taken = samples[-1][1]
    print(f"\npaced catch-up: n3 took {taken / MiB:.1f} MiB at most {rate // MiB} MiB/s, "
          f"synced {synced_s:.1f} s after its start")
    assert g["percore_cluster_backfill_limit_bytes_per_second"] == rate, g
    assert taken >= missed, f"n3 took {taken} bytes, it missed {missed}"
    # The bound: bytes between any two samples <= rate * dt + a second's
    # burst + one 256 KiB read (+ a quarter second's worth for the time a
    # /metrics answer takes).
    worst = max(((b2 - b1) - rate * (t2 - t1), t1 - start)
                for i, (t1, b1) in enumerate(samples) for (t2, b2) in samples[i + 1:])
    assert worst[0] <= rate + 256 * KiB + rate // 4, (
        f"n3 took {worst[0] / MiB:.2f} MiB more than the bound allows in a window "
        f"{worst[1]:.1f} s after its start: {samples}")
    assert synced_s >= (missed - rate) / rate, f"n3 synced after {synced_s:.1f} s: not paced"
    assert cluster_gauges(n3)["percore_cluster_backfill_groups_left"] == 0
    assert not labelled(n3, "percore_cluster_backfill_group_sources_left")
    assert max(pending) > 0, f"no group was ever pending: {pending}"
    assert behind_seen, "n1 and n2 never showed n3 behind in a group they lead"
    settle(cluster, cluster.nodes)
    deadline = time.monotonic() + REPAIR_S
    while True:
        digests = {n.node_name: digest(n) for n in cluster.nodes}
        problems = compare_digests(digests)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems, "replicas differ after the paced catch-up:\n" + "\n".join(problems[:30])


def check_doors(cluster: Cluster, nodes: list[Node], listers, bucket: str, possible: dict,
                uncertain: list[str]) -> None:
    """Once `nodes` run the map etcd holds: every key reads as acknowledged
    through each of their doors, and `listers` list exactly the keys that
    must be there."""
    settle(cluster, nodes)
    problems: list[str] = []
    for node in nodes:
        problems += check_reads(load_client(node), bucket, possible, node.node_name)
    for node in listers:
        problems += check_listing(load_client(node), bucket, possible, node.node_name)
    assert not problems, ("doors differ from the acknowledged state (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))


def add_node_and_wait(cluster: Cluster, node: Node, names: list[str], marks: dict[str, float],
                      unsynced: dict[str, float]) -> None:
    """Starts `node` and polls the map until the nodes `names` are up and
    synced (`marks`: "ready", "synced", "not_synced" the last look before;
    `unsynced`: node -> first seen sync=no, s after the start), then lets
    a load run on under the new map for AFTER_SYNC_S."""
    start = time.monotonic()
    node.start(timeout=SYNC_TIMEOUT_S)
    marks["ready"] = time.monotonic()
    while True:
        listed, _ = status(cluster.urls)
        now = time.monotonic()
        for name in names:
            if name in listed and listed[name].get("sync") != "yes":
                unsynced.setdefault(name, now - start)
        if all(listed.get(n, {}).get("state") == "up" and listed[n].get("sync") == "yes"
               for n in names):
            marks["synced"] = now
            break
        marks["not_synced"] = now
        assert now < start + SYNC_TIMEOUT_S, (
            f"{names} not all up with sync=yes {SYNC_TIMEOUT_S} s after {node.node_name} "
            f"started: {listed}")
        time.sleep(0.1)
    time.sleep(AFTER_SYNC_S)


# Nodes drop their copies of groups they gave up within a takeover wait
# (2/3 of the lease plus a margin) and two looks (2 s each) of a map change
# that left the groups whole elsewhere; a pass over a few hundred keys
# takes well under a second. Waited for this long.
DROP_WAIT_S = LEASE_TTL_S + 15


def copies_dropped(nodes: list[Node], bucket: str, placed: dict[str, list[str]]) -> dict:
    """Polls until no node of `nodes` stores a live copy of a key of
    `bucket` whose replicas (`placed`) it is not among, for DROP_WAIT_S:
    what each still stores then (empty when all were dropped)."""
    deadline = time.monotonic() + DROP_WAIT_S
    while True:
        kept = {n.node_name: sorted(k for k in keys_stored(n, bucket)
                                    if n.node_name not in placed.get(k, [n.node_name]))
                for n in nodes}
        if not any(kept.values()) or time.monotonic() > deadline:
            return {n: v for n, v in kept.items() if v}
        time.sleep(0.5)


def dropped_total(nodes: list[Node]) -> int:
    """`percore_cluster_copies_dropped_total` of `nodes`, every shard."""
    return sum(v for n in nodes for _, v in labelled(n, "percore_cluster_copies_dropped_total"))


def test_add_a_fourth_node_under_load(cluster):
    """A fourth node (zone z4, new data directory) joins under PUT / GET /
    DELETE load through nodes 1 and 3: it takes copies at once, catches up
    the groups it now holds (about 3/4 of them) from their acting
    primaries, turns sync=yes and leads its groups. No read is wrong,
    writes never stop for long, nothing acknowledged is lost; afterwards
    every door serves the acknowledged state, n4 stores live copies of
    exactly the keys of its groups, each key's replicas agree and its
    acting primary holds the acknowledged state. The nodes that gave up a
    group are checked not to contradict the newest copy, then to drop
    their copies."""
    n1, n2, n3 = cluster.nodes
    n4 = cluster.add_node("127.0.0.5", "n4", "z4")
    four = [n1, n2, n3, n4]
    names = [n.node_name for n in four]
    rng = random.Random(SEED + 2)
    bucket = unique_bucket_name("repl-add")
    n1.client().create_bucket(Bucket=bucket)
    possible = preload(n1.client(), bucket, rng)

    marks: dict[str, float] = {}
    unsynced: dict[str, float] = {}   # node -> first seen sync=no (s after n4's start)
    load = run_load(bucket, possible, [n1, n3], rng, ADD_LOAD_S, ADD_AFTER_S,
                    lambda: add_node_and_wait(cluster, n4, names, marks, unsynced))
    add_t, synced_t = load.event_t, marks["synced"]
    possible, uncertain = load.possible, load.uncertain
    writes, gets = load.writes, load.gets
    failed_writes = [o for o in writes if not o.ok]
    failed_gets = [o for o in gets if not o.ok]
    acked_after_sync = [o for o in writes if o.ok and o.start >= synced_t]
    flowing = [o for o in writes if o.ok and o.start >= load.end - FLOWING_S]
    gap, gap_at = longest_write_gap(load.ops, load.t0, load.end)
    print(f"\nadd a node under load (seed {SEED}): n4 started {add_t - load.t0:.1f} s into "
          f"{load.end - load.t0:.1f} s of load, ready after {marks['ready'] - add_t:.2f} s, "
          f"up with sync=yes (n1-n4) after {synced_t - add_t:.2f} s (status polled every "
          f"~0.1 s); seen sync=no: "
          f"{', '.join(f'{n} at {t:.2f} s' for n, t in unsynced.items()) or 'none'}; "
          f"{sum(o.ok for o in writes)} writes acknowledged, {len(failed_writes)} failed "
          f"({len(acked_after_sync)} acknowledged after n4 synced, {len(flowing)} in the "
          f"last {FLOWING_S} s); {len(gets)} GETs, "
          f"{len(failed_gets)} failed; longest time without an acknowledged write "
          f"{gap:.2f} s, from {gap_at - add_t:+.2f} s after n4's start; "
          f"{len(uncertain)} keys uncertain, {len(load.retired)} retired (no answer)")
    if failed_writes or failed_gets:
        print("  failed (s after n4's start, kind, key, door, answer): "
              f"{show_ops((failed_writes + failed_gets)[:20], add_t)}")
    slow = sorted(load.ops, key=lambda o: o.start - o.end)[:6]
    print("  slowest operations (s after n4's start, took s, kind, key, door, answered): "
          + ", ".join(f"({o.start - add_t:+.2f}, {o.end - o.start:.2f}, {o.kind}, {o.key}, "
                      f"{o.door}, {'ok' if o.ok else o.answer})" for o in slow))

    assert not load.problems, "wrong answers under load:\n" + "\n".join(load.problems[:30])
    assert not load.early, (f"operations failed before n4 started: "
                            f"{show_ops(load.early[:10], add_t)}")
    # The map changes twice: n4 joins (before it says it is ready) and is
    # marked synced (between the last two looks at the map). For MAP_LAG_S
    # after each the nodes' maps may disagree, and a request started then
    # may be answered 503 (SlowDown, or a write whose copy a replica
    # refused). No other request may fail: n4's catch-up itself must not
    # fail reads or writes.
    windows = [(add_t, marks["ready"] + MAP_LAG_S),
               (marks.get("not_synced", add_t), synced_t + MAP_LAG_S)]
    stray = [o for o in failed_writes + failed_gets
             if not any(a <= o.start <= b for a, b in windows)]
    assert not stray, (f"requests failed outside the map changes "
                       f"{[(round(a - add_t, 2), round(b - add_t, 2)) for a, b in windows]} "
                       f"(s after n4's start): {show_ops(stray[:10], add_t)}")
    assert gap < WRITE_GAP_LIMIT_S, (
        f"no write acknowledged for {gap:.2f} s (from {gap_at - add_t:+.2f} s after n4's "
        f"start; limit {WRITE_GAP_LIMIT_S} s); failures: {show_ops(failed_writes[-10:], add_t)}")
    assert len(flowing) >= FLOWING_WRITES, (
        f"only {len(flowing)} writes acknowledged in the load's last {FLOWING_S} s, "
        f"{load.end - synced_t - FLOWING_S:.1f} s after n4 synced; failures: "
        f"{show_ops(failed_writes[-10:], add_t)}")

    # Every node runs the final map. Every key reads as acknowledged
    # through every door, n4's included, and both n4 and n1 list exactly
    # the keys that must be there.
    check_doors(cluster, four, (n4, n1), bucket, possible, uncertain)

    # Where each key is: its replicas under the final map, computed from
    # the placement contract. Their first is its acting primary (all four
    # nodes are up and synced), which the native client must agree with.
    keys = sorted(possible)
    placed = placement(cluster, bucket, keys)
    client = percore.Client(native_endpoint(n1))
    routed = {k: client.owner_node(bucket, k) for k in keys}
    differ = {k: (placed[k], routed[k]) for k in keys if routed[k] != placed[k][0]}
    assert not differ, f"placement computed here differs from the client's: {differ}"
    ours = sorted(k for k in keys if "n4" in placed[k])
    assert {placed[k][0] for k in keys} == set(names), placed
    must = {k for k, s in possible.items() if None not in s}    # live whatever happened
    may = {k for k, s in possible.items() if s != {None}}       # live if a failed write landed

    def check_stored() -> tuple[list[str], list[str], dict]:
        digests = {n.node_name: digest(n) for n in four}
        found, notes = [], []
        for key in keys:
            where = (bucket, key)
            allowed = {s.md5 if s is not None else None for s in possible[key]}
            # The replicas agree with each other (absent and tombstone are
            # both not live) and hold a possible state: the acting
            # primary's copy is the acknowledged state. A key whose last
            # write failed is only noted when its replicas differ: a write
            # its old primary took under the older map, after the new
            # primary's repair of the group, stays on the replicas that
            # took its copy until the key's next write (no repair follows;
            # the guarantees do not cover writes answered 503).
            differ = compare_digests({n: {where: digests[n][where]} if where in digests[n]
                                      else {} for n in placed[key]},
                                     {where} if key in uncertain else set())
            (notes if key in uncertain else found).extend(differ)
            for n in placed[key]:
                entry = digests[n].get(where)
                stored = etag_md5(entry[1]) if entry else None
                if stored not in allowed:
                    role = "acting primary" if n == placed[key][0] else "replica"
                    found.append(f"{n} ({role} of {key}) stores it as "
                                 f"{'not live' if stored is None else 'ETag ' + stored}; "
                                 f"expected {describe_all(possible[key])}")
            # Every node, the ones that lost the key's group included:
            # those showing it live at its newest stamp agree on the ETag.
            entries = {n: d[where] for n, d in digests.items() if where in d}
            if entries:
                newest = max(stamp for stamp, _ in entries.values())
                etags = {n: e for n, (stamp, e) in entries.items()
                         if stamp == newest and e is not None}
                if len(set(etags.values())) > 1:
                    found.append(f"{key}: live at its newest stamp {newest} with different "
                                 f"ETags: {etags}")
        # n4 started empty: it stores live exactly the keys of its groups.
        n4_live = {k for (b, k), (_, e) in digests["n4"].items() if b == bucket and e is not None}
        if not (must & set(ours)) <= n4_live:
            found.append(f"n4 lacks keys of its groups: {sorted(must & set(ours) - n4_live)}")
        if not n4_live <= (may & set(ours)):
            found.append(f"n4 stores live keys outside its groups or never written: "
                         f"{sorted(n4_live - (may & set(ours)))}")
        return found, notes, digests

    deadline = time.monotonic() + REPAIR_S
    while True:
        problems, notes, digests = check_stored()
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if notes:
        print("  replicas differ on keys whose last write failed:\n    " + "\n    ".join(notes))
    n4_live = {k for (b, k), (_, e) in digests["n4"].items() if b == bucket and e is not None}
    share = len(n4_live & must) / len(must)
    stale = {n: sorted(k for (b, k), (_, e) in digests[n].items()
                       if b == bucket and e is not None and n not in placed[k])
             for n in names}
    print(f"  n4 stores live {len(n4_live & must)} of the {len(must)} live keys ({share:.0%}); "
          f"its groups hold {len(ours)} of the {len(keys)} keys; live copies kept by nodes "
          f"that are no longer the key's replica: "
          f"{', '.join(f'{n} {len(v)}' for n, v in stale.items())}")
    assert not problems, ("stored state differs from the placement and the acknowledged "
                          f"state (uncertain keys: {uncertain}):\n" + "\n".join(problems[:30]))
    assert share >= ADD_SHARE_MIN, (
        f"n4 stores live only {share:.0%} of the live keys (at least {ADD_SHARE_MIN:.0%} "
        f"expected): {sorted(n4_live)}")

    # Each key is led (listed internally) by its acting primary, n4 among
    # them, and read through that node's own door it is the acknowledged
    # state.
    for node in four:
        name = node.node_name
        led = keys_on(node, bucket)
        mine = {k for k in keys if placed[k][0] == name}
        if not (must & mine) <= led <= (may & mine):
            problems.append(f"{name} leads {sorted(led)}; its groups' live keys are "
                            f"{sorted(must & mine)} (maybe also {sorted((may - must) & mine)})")
        problems += check_reads(load_client(node), bucket, {k: possible[k] for k in mine},
                                f"{name} (acting primary)")
    assert not problems, ("acting primaries differ (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))
    kept = copies_dropped(four, bucket, placed)
    assert not kept, f"copies of groups given up still stored {DROP_WAIT_S} s on: {kept}"
    # n1-n3 each gave up about a quarter of their groups, which held keys.
    assert dropped_total(four) > 0
    # The drops took nothing the replicas need.
    problems = check_reads(load_client(n2), bucket, possible, "n2, after the drops")
    assert not problems, "\n".join(problems[:30])


def test_add_a_node_to_a_single_replica_cluster_under_load(cluster_r1):
    """With R = 1 each group's data is on one node only: a fourth node
    added under PUT / GET / DELETE load through n1 and n3 must take its
    groups' keys from the nodes that held them. Until it is synced those
    nodes lead the groups (their settled primary: `placement::
    acting_primary`) and copy new writes to it; then it leads them. No read
    is wrong at any time (a 404 for a key that must be there fails the
    load), and afterwards every door serves the acknowledged state, n4
    stores live every key of its groups, and it leads them. The nodes that
    held them drop their copies, so the bucket, emptied through a door,
    can be deleted."""
    cluster = cluster_r1
    n1, n2, n3 = cluster.nodes
    n4 = cluster.add_node("127.0.0.5", "n4", "z4")
    four = [n1, n2, n3, n4]
    names = [n.node_name for n in four]
    rng = random.Random(SEED + 3)
    bucket = unique_bucket_name("repl-add-r1")
    n1.client().create_bucket(Bucket=bucket)
    possible = preload(n1.client(), bucket, rng)
    marks: dict[str, float] = {}
    load = run_load(bucket, possible, [n1, n3], rng, ADD_LOAD_S, ADD_AFTER_S,
                    lambda: add_node_and_wait(cluster, n4, names, marks, {}))
    add_t, synced_t = load.event_t, marks["synced"]
    possible, uncertain = load.possible, load.uncertain
    failed = [o for o in load.ops if not o.ok]
    flowing = [o for o in load.writes if o.ok and o.start >= load.end - FLOWING_S]
    gap, gap_at = longest_write_gap(load.ops, load.t0, load.end)
    print(f"\nadd a node to an R = 1 cluster under load (seed {SEED}): n4 ready after "
          f"{marks['ready'] - add_t:.2f} s, up with sync=yes after {synced_t - add_t:.2f} s; "
          f"{sum(o.ok for o in load.writes)} writes acknowledged, "
          f"{sum(not o.ok for o in load.writes)} failed; {len(load.gets)} GETs, "
          f"{sum(not o.ok for o in load.gets)} failed; longest time without an acknowledged "
          f"write {gap:.2f} s, from {gap_at - add_t:+.2f} s after n4's start")
    assert not load.problems, "wrong answers under load:\n" + "\n".join(load.problems[:30])
    assert not load.early, f"operations failed before n4 started: {show_ops(load.early, add_t)}"
    windows = [(add_t, marks["ready"] + MAP_LAG_S),
               (marks.get("not_synced", add_t), synced_t + MAP_LAG_S)]
    stray = [o for o in failed if not any(a <= o.start <= b for a, b in windows)]
    assert not stray, f"requests failed outside the map changes: {show_ops(stray[:10], add_t)}"
    assert gap < WRITE_GAP_LIMIT_S, f"no write acknowledged for {gap:.2f} s"
    assert len(flowing) >= FLOWING_WRITES, f"only {len(flowing)} writes at the load's end"

    check_doors(cluster, four, (n4, n2), bucket, possible, uncertain)

    keys = sorted(possible)
    placed = placement(cluster, bucket, keys, r=1)
    ours = {k for k in keys if placed[k] == ["n4"]}
    must = {k for k, s in possible.items() if None not in s}
    may = {k for k, s in possible.items() if s != {None}}
    n4_live = {k for (b, k), (_, e) in digest(n4).items() if b == bucket and e is not None}
    print(f"  n4's groups hold {len(ours)} of the {len(keys)} keys; n4 stores live "
          f"{len(n4_live)} ({len(must & ours)} must be live)")
    assert ours, f"no key of the pool is in n4's groups: {placed}"
    assert must & ours <= n4_live, f"n4 lacks keys of its groups: {sorted(must & ours - n4_live)}"
    assert n4_live <= may & ours, f"n4 stores keys not of its groups: {sorted(n4_live - ours)}"
    for node in four:
        mine = {k for k in keys if placed[k][0] == node.node_name}
        led = keys_on(node, bucket)
        assert must & mine <= led <= may & mine, (
            f"{node.node_name} leads {sorted(led)}; its groups' live keys are "
            f"{sorted(must & mine)}")
    kept = copies_dropped(four, bucket, placed)
    assert not kept, f"copies of n4's groups still stored {DROP_WAIT_S} s on: {kept}"
    # The keys n1-n3 held in n4's groups before it joined were dropped
    # (those written later went to n4 alone), and nothing n4 needs.
    assert dropped_total([n1, n2, n3]) > 0
    problems = check_reads(load_client(n3), bucket, possible, "n3, after the drops")
    assert not problems, "\n".join(problems[:30])
    assert all(labelled(n, "percore_cluster_copies_stranded") == [({}, 0)] for n in four)
    empty_and_delete(load_client(n2), bucket)


def bucket_of_keys(node: Node, prefix: str, seed: int, n: int,
                   size: int) -> tuple[str, dict[str, bytes]]:
    """A new bucket of `n` keys of 1 to `size` random bytes, written through
    `node`: its name, and key -> bytes."""
    bucket = unique_bucket_name(prefix)
    s3 = node.client()
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(seed)
    data = {f"k/{i:03d}": rng.randbytes(rng.randint(1, size)) for i in range(n)}
    for k, v in data.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    return bucket, data


def read_all(doors: list[Node], bucket: str, data: dict[str, bytes], when: str) -> None:
    """Every key of `data` reads as written through each of `doors`."""
    for door in doors:
        c = load_client(door)
        for k, v in data.items():
            assert c.get_object(Bucket=bucket, Key=k)["Body"].read() == v, (
                f"{k} via {door.node_name} {when}")


def empty_and_delete(client, bucket: str) -> None:
    """Deletes every key of `bucket` through one door, then the bucket: no
    node may keep a copy that makes it BucketNotEmpty."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as e:
        client.head_bucket(Bucket=bucket)
    assert http_status(e.value) == 404


def test_drain_a_node_of_a_single_replica_cluster(cluster_r1):
    """With R = 1 a draining node's groups go to nodes that never held
    them: each new holder merges the group from the draining node (its
    settled primary) before it is synced and leads it. Every key stays
    readable and listed through every door, the draining node then drops
    its copies, and the bucket, emptied, can be deleted."""
    cluster = cluster_r1
    n1, n2, n3 = cluster.nodes
    bucket, data = bucket_of_keys(n1, "drain-r1", SEED + 4, 60, 4 * KiB)
    before = placement(cluster, bucket, sorted(data), r=1)
    on_n2 = sorted(k for k, p in before.items() if p == ["n2"])
    assert on_n2, before
    assert set(on_n2) <= keys_stored(n2, bucket)
    _, summary = status(cluster.urls)
    epoch = int(re.search(r"epoch (\d+)", summary).group(1))
    percore_cli("cluster", "drain", "n2", "--cluster", cluster.urls)
    # The drain (n1 and n3 marked unsynced with it: they gained groups),
    # each synced again, and n2 unfilled once both hold its groups: four
    # map changes (until then its groups answer 503: only a settled
    # replica leads).
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        listed, summary = status(cluster.urls)
        now_epoch = int(re.search(r"epoch (\d+)", summary).group(1))
        if (now_epoch >= epoch + 4 and listed["n2"]["state"] == "draining"
                and listed["n2"]["filled"] == "no"
                and all(listed[n]["sync"] == "yes" for n in ("n1", "n3"))):
            break
        assert time.monotonic() < deadline, (summary, listed)
        time.sleep(0.2)
    settle(cluster, cluster.nodes)
    after = placement(cluster, bucket, sorted(data), r=1)
    assert all(after[k] != ["n2"] for k in data), after
    read_all([n1, n2, n3], bucket, data, "after the drain")
    for door in (n1, n2, n3):
        c = load_client(door)
        listed_keys = [o["Key"] for page in c.get_paginator("list_objects_v2").paginate(
            Bucket=bucket) for o in page.get("Contents", [])]
        assert listed_keys == sorted(data), door.node_name
    for k in on_n2:
        assert k in keys_stored(next(n for n in (n1, n3) if n.node_name == after[k][0]), bucket)
    kept = copies_dropped(cluster.nodes, bucket, after)
    assert not kept, f"copies still stored {DROP_WAIT_S} s after the drain: {kept}"
    read_all([n3], bucket, data, "after the drops")
    empty_and_delete(load_client(n1), bucket)


def test_two_nodes_added_at_once_to_a_single_replica_cluster(cluster_r1):
    """R = 1, two nodes added at once: n4 joins and dies (kill -9) before
    it catches up, then n5 joins and syncs alone. n5 holds its own groups
    only: it must not be recorded as where n4's groups are (`filled=no`
    until n4 is synced; before hand-offs were recorded it was filled on
    its sync and led the groups of n4 that it outscores the old holders
    for, answering 404 for their keys). Every key reads through every door
    while n4 is gone; n4 restarted catches up from the old holders, both
    are filled, the old holders drop their copies, every key reads again,
    and the bucket, emptied, is deleted."""
    cluster = cluster_r1
    n1, n2, n3 = cluster.nodes
    n4 = cluster.add_node("127.0.0.5", "n4", "z4")
    n5 = cluster.add_node("127.0.0.6", "n5", "z5")
    five = [n1, n2, n3, n4, n5]
    bucket, data = bucket_of_keys(n1, "add2-r1", SEED + 5, 200, 2 * KiB)
    # n4 joins (its first catch-up waits for the catalog: it is killed
    # before it), then n5.
    n4.start(timeout=SYNC_TIMEOUT_S)
    n4.kill9()
    assert status(cluster.urls)[0]["n4"]["sync"] == "no"
    n5.start(timeout=SYNC_TIMEOUT_S)
    wait_for(cluster.urls, "n5", "yes", timeout=SYNC_TIMEOUT_S, field="sync")
    settle(cluster, [n1, n2, n3, n5])
    listed, _ = status(cluster.urls)
    keys = sorted(data)
    placed = placement(cluster, bucket, keys, r=1)
    rows = [(int(r["id"]), r["zone"], r["state"]) for name, r in listed.items() if name != "n4"]
    names = {int(r["id"]): name for name, r in listed.items()}
    # The keys the old rule served wrong: on n4, and n5 the best of the rest.
    risky = [k for k in keys if placed[k] == ["n4"] and names[replicas_of(
        cluster.seed, pg_of(cluster.seed, PGS, bucket, k), 1, rows)[0]] == "n5"]
    print(f"\ntwo nodes added at once (R = 1): {len(risky)} of {len(keys)} keys are n4's, "
          f"with n5 the best of the rest")
    assert risky, placed
    read_all([n1, n3, n5], bucket, data, "with n4 gone")
    assert listed["n5"]["filled"] == "no" and listed["n4"]["filled"] == "no", listed
    n4.start(timeout=SYNC_TIMEOUT_S)
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        listed, summary = status(cluster.urls)
        if all(listed[n]["state"] == "up" and listed[n]["sync"] == "yes"
               and listed[n]["filled"] == "yes" for n in ("n4", "n5")):
            break
        assert time.monotonic() < deadline, (summary, listed)
        time.sleep(0.2)
    settle(cluster, five)
    for k in risky:
        assert k in keys_stored(n4, bucket), f"n4 lacks {k}"
    kept = copies_dropped(five, bucket, placed)
    assert not kept, f"copies still stored {DROP_WAIT_S} s after the adds: {kept}"
    read_all(five, bucket, data, "after the drops")
    assert all(labelled(n, "percore_cluster_copies_stranded") == [({}, 0)] for n in five)
    empty_and_delete(load_client(n5), bucket)


def test_alert_rules_read_metrics_a_cluster_node_exports(cluster):
    """docs/alerts.yml reads only metrics that /metrics exports: every
    `percore_*` name in its rules is a family (or a histogram's sample) on
    a cluster node, which has a single node's metrics and the cluster's."""
    import urllib.request

    from conftest import REPO_ROOT
    rules = (REPO_ROOT / "docs" / "alerts.yml").read_text()
    names = set(re.findall(r"\b(percore_[a-z0-9_]+)", rules))
    assert "percore_cluster_serving" in names and len(names) > 10, names
    node = cluster.nodes[0]
    body = urllib.request.urlopen(f"http://{node.ip}:{node.admin_port}/metrics",
                                  timeout=5).read().decode()
    families = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")}
    samples = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in body.splitlines()
               if line and not line.startswith("#")}
    missing = sorted(names - families - samples)
    assert not missing, f"docs/alerts.yml reads metrics /metrics does not export: {missing}"
