"""Crash consistency: concurrent PUT/DELETE load, SIGKILL at a random moment,
restart on the same data dir, and check every key against a model of the
acknowledged operations.

Per round: 4 threads do random PUTs (0..300 KiB, a few up to 3 MiB, content
derived from (key, version) so it can be recomputed) and DELETEs over 200 keys
for 0.5-3 s; the server is SIGKILLed; then, after a restart:

* a key whose last acknowledged operation was a PUT returns exactly those
  bytes (MD5 and length compared, ETag too);
* a key whose last acknowledged operation was a DELETE (or that was never
  written) is 404 NoSuchKey;
* a key with an operation in flight at the kill may show either the previous
  acknowledged state or the in-flight one, nothing else;
* ListObjectsV2 lists exactly the present keys, with their sizes.

A share of the PUTs are multipart uploads (2-3 parts, 5 MiB minimum for all
but the last, uploaded in random order, completed): a completed upload is
acknowledged like a PUT (body and multipart ETag checked); one cut by the kill
may show either state.  After each restart the uploads left in progress are
listed and aborted, which must work.

Only one operation per key is in flight at any time, so per-key order of
acknowledgements is the order the server applied them.  The model carries
over from round to round (the data dir persists).

Env: PERCORE_CRASH_ROUNDS (default 10), PERCORE_CRASH_SEED.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from botocore.exceptions import ClientError

from conftest import unique_bucket_name

pytestmark = [pytest.mark.crash, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROUNDS = int(os.environ.get("PERCORE_CRASH_ROUNDS", "10"))
SEED = int(os.environ.get("PERCORE_CRASH_SEED", str(random.SystemRandom().randrange(1 << 32))))
SHARDS = 2
THREADS = 4
NKEYS = 200
KiB, MiB = 1024, 1024 * 1024
KEYS = [f"{hashlib.sha1(str(i).encode()).hexdigest()[:2]}/crash-key-{i:03d}" for i in range(NKEYS)]
DELETE_RATIO = 0.25
MULTIPART_RATIO = float(os.environ.get("PERCORE_CRASH_MULTIPART", "0.04"))


def content(key: str, version: int, size: int) -> bytes:
    return random.Random(f"{key}\0{version}").randbytes(size)


def pick_size(rng: random.Random) -> int:
    x = rng.random()
    if x < 0.05:
        return 0
    if x < 0.10:
        return rng.randint(300 * KiB, 3 * MiB)
    return rng.randint(1, 300 * KiB)


@dataclass(frozen=True)
class Obj:
    version: int
    size: int
    md5: str
    etag: str = ""  # multipart ETag; "" means the MD5

    @property
    def expected_etag(self) -> str:
        return f'"{self.etag or self.md5}"'


def multipart_put(client, bucket: str, key: str, body: bytes, rng: random.Random) -> str:
    """Uploads `body` as a multipart upload; returns the ETag the server gave."""
    cut = [0, 5 * MiB] + ([10 * MiB] if len(body) > 10 * MiB else []) + [len(body)]
    parts = [(i + 1, body[a:b]) for i, (a, b) in enumerate(zip(cut, cut[1:]))]
    up = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etags = {}
    for n, data in rng.sample(parts, len(parts)):
        etags[n] = client.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n,
                                      Body=data)["ETag"]
    resp = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n, _ in parts]})
    return resp.get("ETag", "")


def multipart_etag(body: bytes) -> str:
    cut = [0, 5 * MiB] + ([10 * MiB] if len(body) > 10 * MiB else []) + [len(body)]
    digests = b"".join(hashlib.md5(body[a:b]).digest() for a, b in zip(cut, cut[1:]))
    return f"{hashlib.md5(digests).hexdigest()}-{len(cut) - 1}"


def describe(state) -> str:
    return "absent" if state is None else f"v{state.version} ({state.size} B, md5 {state.md5})"


class Model:
    """Acknowledged state per key, plus the operation in flight at the kill."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state: dict[str, Obj | None] = {k: None for k in KEYS}
        self.pending: dict[str, Obj | None] = {}  # key -> state an unacknowledged op would leave
        self.busy: set[str] = set()
        self.versions = itertools.count(1)
        self.errors: list[str] = []
        self.acked = 0
        self.multipart_acked = 0

    def count_multipart(self) -> None:
        with self.lock:
            self.multipart_acked += 1

    def acquire(self, rng: random.Random) -> str | None:
        with self.lock:
            for _ in range(20):
                key = rng.choice(KEYS)
                if key not in self.busy:
                    self.busy.add(key)
                    return key
        return None

    def release(self, key: str) -> None:
        with self.lock:
            self.busy.discard(key)

    def next_version(self) -> int:
        with self.lock:
            return next(self.versions)

    def ack(self, key: str, new: Obj | None) -> None:
        with self.lock:
            self.state[key] = new
            self.acked += 1

    def unacked(self, key: str, new: Obj | None, error: str | None) -> None:
        with self.lock:
            self.pending[key] = new
            if error:
                self.errors.append(error)


def worker(client, bucket, model: Model, rng: random.Random, killing: threading.Event):
    while not killing.is_set():
        key = model.acquire(rng)
        if key is None:
            continue
        try:
            multipart = False
            if rng.random() < DELETE_RATIO:
                new, body = None, None
            elif rng.random() < MULTIPART_RATIO:
                multipart = True
                version = model.next_version()
                body = content(key, version, rng.randint(5 * MiB + 1, 11 * MiB))
                new = Obj(version, len(body), hashlib.md5(body).hexdigest(), multipart_etag(body))
            else:
                version = model.next_version()
                body = content(key, version, pick_size(rng))
                new = Obj(version, len(body), hashlib.md5(body).hexdigest())
            try:
                if body is None:
                    resp = client.delete_object(Bucket=bucket, Key=key)
                    ok = resp["ResponseMetadata"]["HTTPStatusCode"] == 204
                elif multipart:
                    etag = multipart_put(client, bucket, key, body, rng)
                    resp = {"ETag": etag}
                    ok = etag == new.expected_etag
                    if ok:
                        model.count_multipart()
                else:
                    resp = client.put_object(Bucket=bucket, Key=key, Body=body)
                    ok = resp.get("ETag") == new.expected_etag
                if not ok:
                    model.unacked(key, new, f"{key}: bad response {resp}")
                    continue
            except Exception as e:  # noqa: BLE001 - any failure leaves the op uncertain
                # After the kill was decided a failure is expected; before it
                # is a bug.  Either way the op may or may not have happened.
                model.unacked(key, new, None if killing.is_set()
                              else f"{key}: {'DELETE' if body is None else 'PUT'} failed "
                                   f"before the kill: {e!r}")
                continue
            model.ack(key, new)
        finally:
            model.release(key)


def list_keys(client, bucket):
    contents, token = [], None
    while True:
        kw = {"Bucket": bucket, "MaxKeys": 1000}
        if token:
            kw["ContinuationToken"] = token
        resp = client.list_objects_v2(**kw)
        contents += resp.get("Contents", [])
        if not resp.get("IsTruncated"):
            return contents
        token = resp["NextContinuationToken"]


def verify(client, bucket, model: Model) -> tuple[int, list[str]]:
    """Checks every key; resolves in-flight ops to what the server shows."""
    problems: list[str] = []

    def check(key):
        candidates = [model.state[key]]
        if key in model.pending:
            candidates.append(model.pending[key])
        try:
            obj = client.get_object(Bucket=bucket, Key=key)
            data = obj["Body"].read()
            seen = (len(data), hashlib.md5(data).hexdigest())
            etag = obj.get("ETag")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchKey":
                return key, None, f"{key}: GET failed: {e.response.get('Error')}"
            seen, etag = None, None
        except Exception as e:  # noqa: BLE001 - report, keep checking the other keys
            return key, None, f"{key}: GET failed: {e!r}"
        for cand in candidates:
            if cand is None and seen is None:
                return key, cand, None
            if cand is not None and seen == (cand.size, cand.md5):
                if etag != cand.expected_etag:
                    return key, cand, f"{key}: body is {describe(cand)} but ETag is {etag}"
                return key, cand, None
        what = "absent (404)" if seen is None else f"{seen[0]} B, md5 {seen[1]}"
        return key, None, (f"{key}: server has {what}; expected "
                           + " or ".join(describe(c) for c in candidates))

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(check, KEYS))
    for key, matched, problem in results:
        if problem:
            problems.append(problem)
        else:
            model.state[key] = matched
        model.pending.pop(key, None)

    present = {k: s for k, s in model.state.items() if s is not None}
    listed = list_keys(client, bucket)
    listed_keys = [c["Key"] for c in listed]
    if listed_keys != sorted(listed_keys, key=lambda k: k.encode()):
        problems.append("ListObjectsV2 is not in key order")
    if len(listed_keys) != len(set(listed_keys)):
        problems.append("ListObjectsV2 lists a key twice")
    unexpected = set(listed_keys) - set(present)
    missing = set(present) - set(listed_keys)
    if unexpected:
        problems.append(f"listed but absent: {sorted(unexpected)[:10]} ({len(unexpected)})")
    if missing:
        problems.append(f"present but not listed: {sorted(missing)[:10]} ({len(missing)})")
    for c in listed:
        s = present.get(c["Key"])
        if s is not None and c["Size"] != s.size:
            problems.append(f"{c['Key']}: listed size {c['Size']}, object has {s.size}")
    return len(KEYS), problems


def test_crash_consistency(server_factory, capsys):
    rng = random.Random(SEED)
    srv = server_factory(shards=SHARDS)
    bucket = unique_bucket_name("crash")
    srv.client().create_bucket(Bucket=bucket)
    model = Model()
    checks = 0
    summary = []
    for rnd in range(1, ROUNDS + 1):
        clients = [srv.client(connect_timeout=2, read_timeout=10) for _ in range(THREADS)]
        killing = threading.Event()
        acked_before = model.acked
        threads = [threading.Thread(target=worker, daemon=True,
                                    args=(clients[i], bucket, model,
                                          random.Random(rng.getrandbits(64)), killing))
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        try:
            time.sleep(rng.uniform(0.5, 3.0))
            srv.assert_alive()  # it must not have died on its own
        finally:
            killing.set()
            srv.kill9()
            for t in threads:
                t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a worker is stuck after the kill"
        assert not model.errors, (f"seed {SEED}, round {rnd}: operations failed before the "
                                  f"kill:\n" + "\n".join(model.errors[:20]) + "\n" + srv.logs())
        in_flight = len(model.pending)

        srv.start()
        client = srv.client(connect_timeout=2, read_timeout=20)
        assert bucket in [b["Name"] for b in client.list_buckets()["Buckets"]]
        n, problems = verify(client, bucket, model)
        checks += n
        # Uploads cut by the kill are still listed and can be aborted.
        left = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        for u in left:
            client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
        assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads"), \
            "aborted uploads are still listed"
        assert not problems, (f"seed {SEED}, round {rnd}: state after SIGKILL+restart differs "
                              f"from the acknowledged operations:\n" + "\n".join(problems[:30]))
        present = sum(1 for s in model.state.values() if s is not None)
        summary.append(f"round {rnd}: {model.acked - acked_before} acked ops, "
                       f"{in_flight} in flight at kill, {len(left)} uploads left open, "
                       f"{present} keys present")
    srv.terminate()
    with capsys.disabled():
        print(f"\ncrash: seed {SEED}\n  " + "\n  ".join(summary))
        print(f"crash: {ROUNDS} rounds, {model.acked} acknowledged operations "
              f"({model.multipart_acked} multipart uploads), {checks} object checks")
    assert model.acked > 0, "no operation was ever acknowledged"
