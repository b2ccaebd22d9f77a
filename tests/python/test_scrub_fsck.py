"""Silent data damage on disk: `percore fsck` (offline) and the background
scrubber (online) must both find it, name the object, and the server must
refuse to serve the damaged bytes while serving everything else.

Small segments (4 MiB, via a config file) so that a dozen 1 MiB objects
fill sealed segments; one byte of one object's payload is flipped in its
segment file, the way a bad sector or a stray write would."""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest
from botocore.exceptions import ClientError, IncompleteReadError, ResponseStreamingError
from urllib3.exceptions import ProtocolError

from conftest import metric, percore_bin, unique_bucket_name

MiB = 1024 * 1024


def fsck(data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([str(percore_bin()), "fsck", "--data", str(data_dir)],
                          capture_output=True, text=True, timeout=120)


def test_fsck_and_scrubber_find_a_flipped_byte(server_factory, tmp_path):
    conf = tmp_path / "percore.toml"
    conf.write_text("segment_bytes_max = 4194304\n")
    srv = server_factory(shards=1, extra_args=["--config", str(conf)],
                         env={"PERCORE_SCRUB_INTERVAL_S": "1"})
    s3 = srv.client()
    bucket = unique_bucket_name("scrub")
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(7)
    bodies = {f"obj-{i:02d}": rng.randbytes(MiB) for i in range(12)}
    for k, b in bodies.items():
        s3.put_object(Bucket=bucket, Key=k, Body=b)
    srv.terminate()

    clean = fsck(srv.data_dir)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "clean" in clean.stdout and "12 live objects" in clean.stdout, clean.stdout

    # Flip one byte in the middle of obj-01's payload (a sealed segment).
    victim = "obj-01"
    needle = bodies[victim][300_000:300_064]
    segs = sorted((srv.data_dir / "shard-000").glob("seg-*.pcs"))
    for seg in segs:
        raw = seg.read_bytes()
        at = raw.find(needle)
        if at >= 0:
            with open(seg, "r+b") as f:
                f.seek(at + 10)
                f.write(bytes([raw[at + 10] ^ 0x40]))
                os.fsync(f.fileno())
            break
    else:
        pytest.fail("payload bytes not found in any segment")
    assert seg != segs[-1], "the damaged segment should be a sealed one"

    damaged = fsck(srv.data_dir)
    assert damaged.returncode == 1, damaged.stdout + damaged.stderr
    lines = [line for line in damaged.stdout.splitlines() if line.startswith("DAMAGE")]
    assert len(lines) == 1 and victim in lines[0] and "CRC" in lines[0], damaged.stdout

    srv.start()
    deadline = time.time() + 30
    while metric(srv, "percore_scrub_last_pass_corrupt_records") < 1:
        assert time.time() < deadline, "the scrubber did not report the damage\n" + srv.logs()
        time.sleep(0.5)
    assert metric(srv, "percore_scrub_bytes_total") >= 8 * MiB
    assert "scrub: record failed" in srv.logs(20000) and victim in srv.logs(20000)

    # A read timeout well under the test's budget: a server that stops
    # sending without closing fails here, not after 30 s.
    s3 = srv.client(read_timeout=10)
    # Never the damaged bytes: a 500 before the body, or the body cut off
    # before the damaged byte (after a 200 head, the connection closed),
    # never a complete body and never bytes that are not the object's.
    damaged_at = 300_010  # payload offset of the flipped byte (needle + 10)
    try:
        resp = s3.get_object(Bucket=bucket, Key=victim)
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 500, e.response
    else:
        got = bytearray()
        with pytest.raises((ResponseStreamingError, IncompleteReadError, ProtocolError)):
            for chunk in resp["Body"].iter_chunks(64 * 1024):
                got += chunk
        assert len(got) <= damaged_at, f"served {len(got)} bytes, past the damaged byte"
        assert bytes(got) == bodies[victim][:len(got)], "what was served before the cut is wrong"
    for k, b in bodies.items():
        if k != victim:
            assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == b, k
    # Replacing the damaged object repairs it: the old record is still on
    # disk (fsck notes it) but no key serves it any more.
    s3.put_object(Bucket=bucket, Key=victim, Body=bodies[victim])
    assert s3.get_object(Bucket=bucket, Key=victim)["Body"].read() == bodies[victim]
    srv.terminate()
    after = fsck(srv.data_dir)
    assert after.returncode == 0, after.stdout
    assert "older version, not served" in after.stdout and "12 live objects" in after.stdout, \
        after.stdout


def test_fsck_refuses_a_directory_that_is_not_percore_data(tmp_path):
    r = fsck(tmp_path)
    assert r.returncode == 2 and "shard-NNN" in r.stderr, r.stderr
