"""Soak: sustained mixed load on both front doors plus connection churn and
abandoned requests, sampling the server's RSS and open descriptors
(process_resident_memory_bytes, process_open_fds from /metrics) every
second. Three equal phases: memory may grow while caches, pools and the
index warm up in the first; the third may not peak higher than the second
(by more than 10% + 16 MiB); descriptors return to the idle baseline
once the clients are gone.

PERCORE_SOAK_SECONDS per phase (default 10; bench/soak.sh runs it long),
PERCORE_SOAK_CSV writes the samples."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time

from conftest import metric, percore_bin, unique_bucket_name

PHASE_S = float(os.environ.get("PERCORE_SOAK_SECONDS", "10"))
MiB = 1024 * 1024


def gauges(srv) -> dict[str, float]:
    return {
        "process_resident_memory_bytes": metric(srv, "process_resident_memory_bytes"),
        "process_open_fds": metric(srv, "process_open_fds"),
        # Each segment file is an open descriptor: more data, more of them.
        "segments": metric(srv, "percore_segments"),
    }


def native_endpoint(srv) -> str:
    return srv.native_endpoint


def load(srv, mode: str, seconds: float, bucket: str) -> subprocess.Popen:
    ep = (["--s3", f"127.0.0.1:{srv.s3_port}"] if mode == "s3"
          else ["--endpoint", native_endpoint(srv)])
    return subprocess.Popen(
        [str(percore_bin()), "bench", "--mode", mode, *ep, "--op", "mixed", "--size", "4K",
         "--size-max", "256K", "--objects", "300", "--concurrency", "8", "--threads", "1",
         "--duration", str(seconds), "--warmup", "0", "--bucket", bucket,
         "--prefix", f"{mode}/"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def churn(srv, stop: threading.Event, counts: dict) -> None:
    """New connections that do one request, or send half a request and
    vanish, or connect and say nothing."""
    i = 0
    while not stop.is_set():
        i += 1
        s = socket.create_connection(("127.0.0.1", srv.s3_port), timeout=5)
        if i % 3 == 0:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            s.recv(4096)
        elif i % 3 == 1:
            s.sendall(b"PUT /b/k HTTP/1.1\r\nContent-Length: 100000\r\n\r\npartial")
        s.close()
        counts["conns"] += 1
        time.sleep(0.005)


def test_soak_memory_and_descriptors_stay_flat(server_factory, capsys):
    srv = server_factory(shards=2)
    bucket = unique_bucket_name("soak")
    srv.client().create_bucket(Bucket=bucket)
    time.sleep(0.5)
    idle = gauges(srv)
    samples, counts = [], {"conns": 0}
    phase_peak = []
    for phase in (1, 2, 3):
        stop = threading.Event()
        ch = threading.Thread(target=churn, args=(srv, stop, counts), daemon=True)
        ch.start()
        procs = [load(srv, m, PHASE_S, bucket) for m in ("s3", "native")]
        t0 = time.time()
        peak = 0.0
        while any(p.poll() is None for p in procs):
            g = gauges(srv)
            peak = max(peak, g["process_resident_memory_bytes"])
            samples.append((phase, round(time.time() - t0, 1), g["process_resident_memory_bytes"],
                            g["process_open_fds"]))
            time.sleep(1)
        stop.set()
        ch.join(10)
        for p in procs:
            out, err = p.communicate()
            assert p.returncode == 0, err
            row = [c.strip() for c in out.strip().splitlines()[-1].split("|")]
            assert row[13] == "0", f"load generator saw errors: {out}\n{err}"
        phase_peak.append(peak)
        srv.assert_alive()
    if os.environ.get("PERCORE_SOAK_CSV"):
        with open(os.environ["PERCORE_SOAK_CSV"], "w") as f:
            f.write("phase,seconds,rss_bytes,open_fds\n")
            f.writelines(",".join(map(str, s)) + "\n" for s in samples)
    # Clients gone: descriptors back to idle plus the new segment files
    # (abandoned requests time out).
    deadline = time.time() + 15

    def allowed(g):
        return idle["process_open_fds"] + (g["segments"] - idle["segments"]) + 2

    while (g := gauges(srv))["process_open_fds"] > allowed(g):
        assert time.time() < deadline, f"descriptors leaked: {g} vs idle {idle}"
        time.sleep(0.5)
    end = gauges(srv)
    growth = phase_peak[2] - phase_peak[1]
    with capsys.disabled():
        print(f"\nsoak: 3 x {PHASE_S:.0f} s, {counts['conns']} churned connections; RSS idle "
              f"{idle['process_resident_memory_bytes'] / MiB:.1f} MiB, peak phase 1 "
              f"{phase_peak[0] / MiB:.1f}, phase 2 {phase_peak[1] / MiB:.1f}, phase 3 "
              f"{phase_peak[2] / MiB:.1f} MiB; fds idle "
              f"{idle['process_open_fds']:.0f}, max under load {max(s[3] for s in samples):.0f}, "
              f"after {end['process_open_fds']:.0f} ({end['segments'] - idle['segments']:.0f} new segment files)")
    assert growth <= 0.10 * phase_peak[1] + 16 * MiB, \
        f"RSS grew {growth / MiB:.1f} MiB from phase 2 to phase 3: a leak?"
