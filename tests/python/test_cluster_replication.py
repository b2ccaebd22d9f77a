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

import pytest
from botocore.exceptions import ClientError

from conftest import ServerFactory, unique_bucket_name
from test_cluster_membership import (  # noqa: F401  (etcd is a fixture)
    LEASE_TTL_S,
    Node,
    etcd,
    loopback_ok,
    percore as percore_cli,
    status,
    wait_for,
)
from test_cluster_routing import (  # noqa: F401  (digest and wait_synced: shared)
    DIGEST,
    digest,
    internal,
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
SYNC_TIMEOUT_S = 60

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
    retry a 503 by itself and hide the outage), short timeouts."""
    return node.client(max_attempts=1, connect_timeout=2, read_timeout=10)


# ---------------------------------------------------------------------------
# cluster helpers
# ---------------------------------------------------------------------------

class Cluster(ServerFactory):
    """Three nodes n1-n3 on 127.0.0.2-4, zones z1-z3. A ServerFactory, so
    that conftest's failure hook attaches every node's log to a failed
    test's report."""

    def __init__(self, urls: str):
        super().__init__("cluster-replication")
        self.urls = urls
        ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        assert all(loopback_ok(ip) for ip in ips)
        self.servers = [Node(ip, f"n{i + 1}", f"z{i + 1}", urls) for i, ip in enumerate(ips)]

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
    percore_cli("cluster", "init", "--cluster", etcd.urls, "--replicas", "3", "--pgs", "64")
    c = Cluster(etcd.urls)
    try:
        for n in c.nodes:
            n.start()
        wait_synced(c.urls, ["n1", "n2", "n3"])
        settle(c, c.nodes)
        yield c
    finally:
        c.close()


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

    keys = [f"k/{i:03d}" for i in range(POOL_KEYS)]
    possible: dict[str, set] = {k: {None} for k in keys}
    preload = n1.client()
    for key in keys[:PRELOAD_KEYS]:
        body = rng.randbytes(rng.randint(MIN_SIZE, MAX_SIZE))
        preload.put_object(Bucket=bucket, Key=key, Body=body)
        possible[key] = {Blob.of(body)}

    # Three threads, each on its own keys, each through the survivors' doors.
    stop = threading.Event()
    t0 = time.monotonic()
    workers = [Worker(i, keys[i::THREADS], possible,
                      [("n1", load_client(n1)), ("n3", load_client(n3))],
                      bucket, rng.getrandbits(64), t0, stop)
               for i in range(THREADS)]
    kill_t = down_t = None
    for w in workers:
        w.start()
    try:
        time.sleep(max(0.0, t0 + KILL_AFTER_S - time.monotonic()))
        assert any(o.ok and o.kind != "get" for w in workers for o in w.ops), (
            f"no write acknowledged in the first {KILL_AFTER_S} s with every node up: "
            f"{[w.ops[:3] for w in workers]} {[w.problems[:3] for w in workers]}")
        kill_t = time.monotonic()
        n2.kill9()
        wait_for(cluster.urls, "n2", "down", timeout=LEASE_TTL_S * 4)
        down_t = time.monotonic()
        time.sleep(max(0.0, t0 + LOAD_S - time.monotonic()))
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert not any(w.is_alive() for w in workers), "a load thread is stuck"
    load_end = time.monotonic()

    ops = sorted((o for w in workers for o in w.ops), key=lambda o: o.start)
    problems = [p for w in workers for p in w.problems]
    for w in workers:
        possible.update(w.possible)
    retired = [k for w in workers for k in w.retired]
    uncertain = sorted(k for k, s in possible.items() if len(s) > 1)

    writes = [o for o in ops if o.kind != "get"]
    gets = [o for o in ops if o.kind == "get"]
    early = [o for o in ops if not o.ok and o.end < kill_t]
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
    assert not problems, ("replicas differ after n2 synced (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))
    problems = check_reads(load_client(n2), bucket, possible, "n2")
    assert not problems, ("n2's door differs from the acknowledged state (uncertain keys: "
                          f"{uncertain}):\n" + "\n".join(problems[:30]))
