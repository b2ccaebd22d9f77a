"""/metrics after a known workload: counters move by exactly the right
amounts, summed over shards; health and log-level endpoints; access log."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request

import pytest

from conftest import SECRET_KEY
from test_s3_basic import s3_error

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(srv) -> list[tuple[str, dict, float]]:
    status, body = http("GET", f"http://127.0.0.1:{srv.admin_port}/metrics")
    assert status == 200, body
    out = []
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"not Prometheus text: {line!r}"
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def total(samples, name, **want) -> float:
    return sum(v for n, labels, v in samples
               if n == name and all(labels.get(k) == str(x) for k, x in want.items()))


def test_counters_move_by_the_workload(server_factory, shards):
    srv = server_factory(shards=shards)
    s3 = srv.client()
    s3.create_bucket(Bucket="metrics")
    before = scrape(srv)
    assert {labels["shard"] for n, labels, _ in before
            if n == "percore_objects"} == {str(i) for i in range(shards)}
    sizes = [1000, 70_000, 2_500_000, 0, 123]
    for i, n in enumerate(sizes):
        s3.put_object(Bucket="metrics", Key=f"k{i}", Body=os.urandom(n))
    for i in range(3):
        s3.get_object(Bucket="metrics", Key=f"k{i}")["Body"].read()
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket="metrics", Key="missing")
    after = scrape(srv)

    def delta(name, **want):
        return total(after, name, **want) - total(before, name, **want)

    assert delta("percore_s3_requests_total", op="PutObject", status=200) == 5
    assert delta("percore_s3_requests_total", op="GetObject", status=200) == 3
    assert delta("percore_s3_requests_total", op="GetObject", status=404) == 1
    assert delta("percore_s3_request_seconds_count", op="PutObject") == 5
    assert delta("percore_s3_bytes_in_total") == sum(sizes)
    assert delta("percore_s3_bytes_out_total") >= sum(sizes[:3])
    assert total(after, "percore_objects") == 5
    # Every PUT was made durable by at least one group commit, written with
    # WRITE_FIXED from the shard ring's registered buffers.
    assert delta("percore_store_flushes_total") >= 1
    assert delta("percore_ring_writes_fixed_total") >= delta("percore_store_flushes_total")
    assert delta("percore_stage_seconds_count", stage="device_write") >= 1
    assert delta("percore_stage_seconds_count", stage="device_read") >= 3
    assert delta("percore_stage_seconds_count", stage="send") >= 3
    if shards > 1:
        # Keys hash to several shards: some calls were forwarded.
        assert delta("percore_stage_seconds_count", stage="cross_shard_hop") >= 1
        assert total(after, "percore_stage_seconds_count", stage="queue") >= 1
    # Histograms are cumulative and end in +Inf == _count.
    for n, labels, v in after:
        if n == "percore_s3_request_seconds_bucket" and labels["le"] == "+Inf":
            count = total(after, "percore_s3_request_seconds_count",
                          shard=labels["shard"], op=labels["op"])
            assert v == count
    if shards == 1:
        # The 2.5 MB object's extents went out through the data ring: read by
        # READ_FIXED into registered buffers and sent from them. Loopback
        # always copies, and the counters say so: never zero-copy here.
        assert delta("percore_ring_reads_fixed_total") >= 3
        sends = sum(delta(f"percore_ring_sends_{k}_total") for k in ("zero_copy", "copied", "plain"))
        assert sends >= 3
        assert delta("percore_ring_sends_zero_copy_total") == 0
    assert total(after, "percore_segment_bytes", kind="live") > sum(sizes)
    assert total(after, "process_open_fds") > 0
    assert total(after, "process_resident_memory_bytes") > 0


def test_unsupported_operations_are_counted_as_what_they_got(server_factory):
    """One router decides both the handler and the metric name: a request
    answered 501 is counted as NotImplemented (PUT /bucket?tagging used to
    be counted as CreateBucket), never as the operation it resembles; a
    sub-resource percore serves is counted under its own name."""
    srv = server_factory(shards=1)
    s3 = srv.client()
    s3.create_bucket(Bucket="unsupported")
    s3.put_object(Bucket="unsupported", Key="k", Body=b"x")
    before = scrape(srv)
    with s3_error("NotImplemented", 501):
        s3.put_bucket_website(Bucket="unsupported",
                              WebsiteConfiguration={"IndexDocument": {"Suffix": "index.html"}})
    with s3_error("NotImplemented", 501):
        s3.get_object_legal_hold(Bucket="unsupported", Key="k")
    s3.put_bucket_tagging(Bucket="unsupported", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]})
    s3.get_object_tagging(Bucket="unsupported", Key="k")
    after = scrape(srv)

    def delta(name, **want):
        return total(after, name, **want) - total(before, name, **want)

    assert delta("percore_s3_requests_total", op="NotImplemented", status=501) == 2
    assert delta("percore_s3_requests_total", op="PutBucketTagging", status=204) == 1
    assert delta("percore_s3_requests_total", op="GetObjectTagging", status=200) == 1
    assert delta("percore_s3_requests_total", op="CreateBucket") == 0
    assert delta("percore_s3_requests_total", op="GetObject") == 0


def test_data_ring_get_storm_bytes_verified(server_factory):
    """More concurrent ranged GETs than registered buffers (32 per shard):
    every byte checked, every buffer back in the pool afterwards."""
    import hashlib
    import random
    from concurrent.futures import ThreadPoolExecutor
    srv = server_factory(shards=1)
    s3 = srv.client()
    s3.create_bucket(Bucket="storm")
    objects = {f"o{i}": os.urandom(3 * 1024 * 1024 + 777 * i) for i in range(4)}
    for k, v in objects.items():
        s3.put_object(Bucket="storm", Key=k, Body=v)
    before = scrape(srv)

    def one(seed):
        rng = random.Random(seed)
        k = rng.choice(sorted(objects))
        body = objects[k]
        a = rng.randrange(len(body) - 1)
        b = min(len(body) - 1, a + rng.choice([100, 20_000, 70_000, 1_500_000, 4_000_000]))
        got = s3.get_object(Bucket="storm", Key=k, Range=f"bytes={a}-{b}")["Body"].read()
        assert hashlib.md5(got).digest() == hashlib.md5(body[a:b + 1]).digest(), (k, a, b)
        return len(got)

    with ThreadPoolExecutor(48) as pool:
        moved = sum(pool.map(one, range(400)))
    after = scrape(srv)
    assert total(after, "percore_ring_reads_fixed_total") - total(before, "percore_ring_reads_fixed_total") > 100
    # Every buffer comes back once the kernel's last completion (SEND_ZC's
    # notification) is in, which may trail the client's last byte a little.
    deadline = time.monotonic() + 10
    while total(scrape(srv), "percore_ring_buffers_in_use") != 0:
        assert time.monotonic() < deadline, "registered buffers never came back"
        time.sleep(0.05)
    assert total(after, "percore_ring_sends_zero_copy_total") == 0  # loopback copies
    assert moved > 100 * 1024 * 1024 // 10


def test_health_and_log_level(server_factory):
    srv = server_factory(shards=2)
    base = f"http://127.0.0.1:{srv.admin_port}"
    assert http("GET", base + "/health/live") == (200, b"ok\n")
    assert http("GET", base + "/health/ready") == (200, b"ok\n")
    assert http("GET", base + "/log/level") == (200, b"info\n")
    # Writes need the secret key as a bearer token (see test_admin.py).
    auth = {"Authorization": f"Bearer {SECRET_KEY}"}
    assert http("PUT", base + "/log/level", b"debug", auth) == (200, b"debug\n")
    assert http("GET", base + "/log/level") == (200, b"debug\n")
    status, body = http("PUT", base + "/log/level", b"not a [filter", auth)
    assert status == 400 and b"invalid filter" in body
    assert http("GET", base + "/log/level") == (200, b"debug\n")
    assert http("PUT", base + "/log/level", b"info", auth) == (200, b"info\n")


def test_access_log_names_every_request(server_factory):
    srv = server_factory(shards=1, env={"PERCORE_ACCESS_LOG": "1"})
    s3 = srv.client()
    s3.create_bucket(Bucket="alog")
    s3.put_object(Bucket="alog", Key="x", Body=b"12345")
    with s3_error("NoSuchKey", 404):
        s3.get_object(Bucket="alog", Key="nope")
    logs = srv.logs(limit=100_000)
    assert re.search(r"percore::access.*op=\"?PutObject.*status=200.*bytes_in=5", logs), logs
    assert re.search(r"percore::access.*op=\"?GetObject.*status=404", logs), logs
