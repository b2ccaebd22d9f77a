"""The per-core data path as users see it: CPU-steered listeners (a
connection is accepted by the shard pinned to the CPU that handles its
packets) and `percore doctor`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import percore_bin
from test_metrics import scrape, total

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONNECT_FROM_CPU = r"""
import os, socket, sys
cpu, port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_connections_land_on_the_shard_of_their_cpu(server_factory):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    srv = server_factory(shards=2, unpinned=False, extra_args=["--cpus", f"{cpus[0]},{cpus[1]}"])
    assert "SO_ATTACH_REUSEPORT_CBPF" in srv.logs(), srv.logs()
    for shard, cpu in enumerate(cpus):
        before = scrape(srv)
        subprocess.run([sys.executable, "-c", CONNECT_FROM_CPU, str(cpu), str(srv.s3_port), "20"],
                       check=True, timeout=60)
        after = scrape(srv)
        got = {s: total(after, "percore_connections_accepted_total", shard=s)
               - total(before, "percore_connections_accepted_total", shard=s) for s in (0, 1)}
        # Loopback handles a connection's packets on the connecting CPU.
        assert got[shard] == 20 and got[1 - shard] == 0, (cpu, got)


def test_unexpected_shard_still_serves(server_factory):
    """Whichever shard accepts, every key is served (forwarded to its owner)."""
    srv = server_factory(shards=4)
    s3 = srv.client()
    s3.create_bucket(Bucket="steer")
    for i in range(40):
        c = srv.client()  # a new connection each time, landing anywhere
        c.put_object(Bucket="steer", Key=f"k{i}", Body=b"v%d" % i)
        assert c.get_object(Bucket="steer", Key=f"k{i}")["Body"].read() == b"v%d" % i
    accepted = scrape(srv)
    assert sum(v for n, _, v in accepted if n == "percore_connections_accepted_total") >= 40


def test_doctor_reports_each_finding_with_its_fix(tmp_path):
    proc = subprocess.run([str(percore_bin()), "doctor", "--data", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for topic in ("kernel", "io_uring", "memlock", "hugepages", "cpus", "disk"):
        assert f"] {topic}" in out, (topic, out)
    assert "READ_FIXED" in out and "SEND_ZC" in out
    assert "O_DIRECT" in out
    assert "shard plan:" in out
    # Every warning says what to do.
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[WARN]"):
            assert i + 1 < len(lines) and "fix:" in lines[i + 1], out


def test_sqpoll_threads_on_configured_cpus(server_factory):
    """With SQPOLL on, each shard's poller thread runs on its configured CPU,
    and GETs through the ring still return the right bytes."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    srv = server_factory(shards=2, env={"PERCORE_RING_SQPOLL_MS": "200",
                                        "PERCORE_RING_SQPOLL_CPUS": str(cpu)})
    s3 = srv.client()
    s3.create_bucket(Bucket="sqpoll")
    body = os.urandom(3 * 1024 * 1024 + 11)
    s3.put_object(Bucket="sqpoll", Key="o", Body=body)
    assert s3.get_object(Bucket="sqpoll", Key="o")["Body"].read() == body
    pid = srv.proc.pid
    pollers = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            status = open(f"/proc/{pid}/task/{tid}/status").read()
        except OSError:
            continue
        if comm.startswith("iou-sqp"):
            allowed = [l.split(":")[1].strip() for l in status.splitlines()
                       if l.startswith("Cpus_allowed_list")][0]
            pollers.append(allowed)
    assert len(pollers) >= 2, pollers
    assert all(a == str(cpu) for a in pollers), pollers
