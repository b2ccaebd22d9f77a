"""Request limits and the server's life cycle at its edges:

* MetadataTooLarge (user metadata past 2 KiB), EntityTooLarge (a declared
  size past 5 GiB, refused before any body byte), 411 MissingContentLength
  (a PUT or UploadPart without Content-Length, aws-chunked without
  x-amz-decoded-content-length);
* 408 RequestTimeout for a request body that stalls (body_timeout_s = 1),
  and a GET whose client stops reading cut off after it;
* draining after SIGTERM: /health/ready 503, a request on a kept-alive
  connection is answered 503 ServiceUnavailable, new connections are
  refused, the upload in flight completes and is kept, exit 0;
* /health/ready 503 while the shards are still starting;
* start-up refusals: data directory not creatable or not writable (as
  root too), ports in use: exit 1 with a message saying what to fix.

One shard: none of this depends on the shard count."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from conftest import ACCESS_KEY, SECRET_KEY, Server, free_ports, percore_bin, unique_bucket_name
from s3wire import STREAMING_SIGNED, UNSIGNED_PAYLOAD, Signer
from signed import one_shard_server

GiB = 1 << 30


@pytest.fixture(scope="module")
def env():
    srv = one_shard_server("limits", env={"PERCORE_BODY_TIMEOUT_S": "1"})
    try:
        s3 = srv.client()
        bucket = unique_bucket_name("limits")
        s3.create_bucket(Bucket=bucket)
        yield srv, s3, bucket
    finally:
        srv.close()


def head_only(srv, method: str, path: str, headers: dict, payload_hash: str,
              body: bytes = b"", wait: float = 5.0,
              query: list[tuple[str, str]] | None = None) -> tuple[bytes, float]:
    """Sends a signed request head (and `body`, maybe less than announced),
    then reads until the server closes or `wait` passes. Returns what came
    back and the seconds it took."""
    host = f"127.0.0.1:{srv.s3_port}"
    hdrs, _ = Signer(ACCESS_KEY, SECRET_KEY).sign(
        method, path, {"host": host, "connection": "close", **headers}, payload_hash,
        query=query)
    target = path + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
    raw = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    s = socket.create_connection(("127.0.0.1", srv.s3_port), timeout=wait)
    started = time.monotonic()
    try:
        s.sendall(raw.encode() + b"\r\n" + body)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out, time.monotonic() - started
    finally:
        s.close()


def status_of(resp: bytes) -> int:
    assert resp.startswith(b"HTTP/1.1 "), resp[:200]
    return int(resp[9:12])


def test_user_metadata_over_2_kib_is_metadata_too_large(env):
    srv, s3, bucket = env
    # 2 KiB counts names (without x-amz-meta-) and values.
    at_limit = {"a": "x" * (2048 - 1 - 20), "b" * 10: "y" * 10}
    s3.put_object(Bucket=bucket, Key="meta-at-limit", Body=b"x", Metadata=at_limit)
    assert s3.head_object(Bucket=bucket, Key="meta-at-limit")["Metadata"] == at_limit
    over = {"a": "x" * (2048 - 1 - 20), "b" * 10: "y" * 11}
    for key, call in [
        ("meta-over", lambda: s3.put_object(Bucket=bucket, Key="meta-over", Body=b"x",
                                            Metadata=over)),
        ("meta-over-mpu", lambda: s3.create_multipart_upload(Bucket=bucket,
                                                             Key="meta-over-mpu",
                                                             Metadata=over)),
        ("meta-over-copy", lambda: s3.copy_object(
            Bucket=bucket, Key="meta-over-copy", Metadata=over, MetadataDirective="REPLACE",
            CopySource={"Bucket": bucket, "Key": "meta-at-limit"})),
    ]:
        with pytest.raises(ClientError) as e:
            call()
        err = e.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 400, (key, err)
        assert err["Error"]["Code"] == "MetadataTooLarge", (key, err)
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key=key)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_entity_too_large_is_refused_before_the_body(env):
    srv, s3, bucket = env
    resp, took = head_only(srv, "PUT", f"/{bucket}/huge",
                           {"content-length": str(5 * GiB + 1)}, UNSIGNED_PAYLOAD)
    assert status_of(resp) == 400 and b"<Code>EntityTooLarge</Code>" in resp, resp[:500]
    assert took < 4, took
    # Exactly 5 GiB is allowed to start: the server waits for the body
    # (100-continue), it does not refuse the size.
    resp, _ = head_only(srv, "PUT", f"/{bucket}/huge",
                        {"content-length": str(5 * GiB), "expect": "100-continue"},
                        UNSIGNED_PAYLOAD, wait=1.5)
    assert resp.startswith(b"HTTP/1.1 100"), resp[:300]
    # aws-chunked: the decoded length is what counts.
    resp, _ = head_only(srv, "PUT", f"/{bucket}/huge-chunked",
                        {"content-length": "1000", "content-encoding": "aws-chunked",
                         "x-amz-decoded-content-length": str(5 * GiB + 1)}, STREAMING_SIGNED)
    assert status_of(resp) == 400 and b"<Code>EntityTooLarge</Code>" in resp, resp[:500]
    # An UploadPart past 5 GiB too.
    up = s3.create_multipart_upload(Bucket=bucket, Key="huge-part")["UploadId"]
    resp, _ = head_only(srv, "PUT", f"/{bucket}/huge-part",
                        {"content-length": str(5 * GiB + 1)}, UNSIGNED_PAYLOAD,
                        query=[("partNumber", "1"), ("uploadId", up)])
    assert status_of(resp) == 400 and b"<Code>EntityTooLarge</Code>" in resp, resp[:500]
    s3.abort_multipart_upload(Bucket=bucket, Key="huge-part", UploadId=up)
    for key in ("huge", "huge-chunked"):
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key=key)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_put_without_content_length_is_411(env):
    srv, s3, bucket = env
    # No Content-Length and no Transfer-Encoding: HTTP says "no body"; S3
    # says 411 rather than storing an empty object.
    resp, _ = head_only(srv, "PUT", f"/{bucket}/no-cl", {}, UNSIGNED_PAYLOAD, wait=3)
    assert status_of(resp) == 411, resp[:500]
    assert b"<Code>MissingContentLength</Code>" in resp, resp[:500]
    up = s3.create_multipart_upload(Bucket=bucket, Key="no-cl-part")["UploadId"]
    resp, _ = head_only(srv, "PUT", f"/{bucket}/no-cl-part", {}, UNSIGNED_PAYLOAD, wait=3,
                        query=[("partNumber", "1"), ("uploadId", up)])
    assert status_of(resp) == 411, resp[:500]
    assert s3.list_parts(Bucket=bucket, Key="no-cl-part", UploadId=up).get("Parts", []) == []
    s3.abort_multipart_upload(Bucket=bucket, Key="no-cl-part", UploadId=up)
    # Content-Length: 0 is an empty object, as ever.
    resp, _ = head_only(srv, "PUT", f"/{bucket}/empty", {"content-length": "0"},
                        UNSIGNED_PAYLOAD, wait=3)
    assert status_of(resp) == 200, resp[:500]
    assert s3.head_object(Bucket=bucket, Key="empty")["ContentLength"] == 0
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="no-cl")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_aws_chunked_without_decoded_length_is_411(env):
    srv, s3, bucket = env
    resp, _ = head_only(srv, "PUT", f"/{bucket}/no-length",
                        {"content-length": "100", "content-encoding": "aws-chunked"},
                        STREAMING_SIGNED)
    assert status_of(resp) == 411, resp[:500]
    assert b"<Code>MissingContentLength</Code>" in resp, resp[:500]
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="no-length")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_a_stalled_request_body_is_408_after_the_body_timeout(env):
    srv, s3, bucket = env
    body = b"0123456789" * 10
    resp, took = head_only(srv, "PUT", f"/{bucket}/stalled",
                           {"content-length": "100000"}, UNSIGNED_PAYLOAD, body=body, wait=15)
    assert status_of(resp) == 408, resp[:500]
    assert b"<Code>RequestTimeout</Code>" in resp, resp[:500]
    # body_timeout_s = 1: not before it, and not much after it.
    assert 0.9 <= took < 8, took
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="stalled")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    # The server still serves.
    s3.put_object(Bucket=bucket, Key="after-stall", Body=b"ok")
    assert s3.get_object(Bucket=bucket, Key="after-stall")["Body"].read() == b"ok"


def test_a_client_that_stops_reading_is_cut_off_after_the_body_timeout(env):
    srv, s3, bucket = env
    size = 32 << 20
    s3.put_object(Bucket=bucket, Key="big", Body=os.urandom(size))
    host = f"127.0.0.1:{srv.s3_port}"
    hdrs, _ = Signer(ACCESS_KEY, SECRET_KEY).sign("GET", f"/{bucket}/big", {"host": host},
                                                  UNSIGNED_PAYLOAD)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.connect(("127.0.0.1", srv.s3_port))
    s.sendall((f"GET /{bucket}/big HTTP/1.1\r\n" +
               "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
    time.sleep(2.5)  # not reading: the server's sends stall past body_timeout_s = 1
    s.settimeout(5)
    got = 0
    try:
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
    except ConnectionResetError:
        pass
    finally:
        s.close()
    # Cut off: what was queued in the socket buffers came, the rest did not.
    assert 0 < got < size, got
    # And the server serves the next client.
    assert len(s3.get_object(Bucket=bucket, Key="big", Range="bytes=0-9")["Body"].read()) == 10


def metric_value(srv, name: str) -> float:
    status, body = admin_get(srv, "/metrics")
    assert status == 200, body
    values = [float(v) for n, v in re.findall(rb"^([a-z_]+)(?:\{[^}]*\})? (\S+)$", body, re.M)
              if n.decode() == name]
    assert values, f"metric {name} not exported"
    return sum(values)


def admin_get(srv, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_draining_refuses_new_work_and_finishes_the_upload_in_flight(server_factory):
    srv = server_factory(shards=1)
    s3 = srv.client()
    bucket = unique_bucket_name("drain")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="old", Body=b"old")
    host = f"127.0.0.1:{srv.s3_port}"
    signer = Signer(ACCESS_KEY, SECRET_KEY)

    # B: a kept-alive connection that has served one request.
    b = socket.create_connection(("127.0.0.1", srv.s3_port), timeout=10)
    hdrs, _ = signer.sign("GET", f"/{bucket}/old", {"host": host}, UNSIGNED_PAYLOAD)
    get_old = (f"GET /{bucket}/old HTTP/1.1\r\n" +
               "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode()
    b.sendall(get_old)
    first = b.recv(65536)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"old"), first

    # A: an upload in flight, half its body sent.
    data = os.urandom(256 * 1024)
    a = socket.create_connection(("127.0.0.1", srv.s3_port), timeout=10)
    hdrs, _ = signer.sign("PUT", f"/{bucket}/inflight",
                          {"host": host, "content-length": str(len(data))}, UNSIGNED_PAYLOAD)
    a.sendall((f"PUT /{bucket}/inflight HTTP/1.1\r\n" +
               "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
    a.sendall(data[: len(data) // 2])
    deadline = time.monotonic() + 10
    while metric_value(srv, "percore_requests_in_flight") < 1:  # the head was read
        assert time.monotonic() < deadline, "the PUT never got in flight"
        time.sleep(0.01)

    srv.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while True:
        status, text = admin_get(srv, "/health/ready")
        if status == 503:
            break
        assert time.monotonic() < deadline, "never saw /health/ready 503 while draining"
        time.sleep(0.01)
    assert text == b"draining: shutting down\n"
    assert admin_get(srv, "/health/live") == (200, b"ok\n")
    assert srv.alive(), "the server exited with an upload in flight"

    # A new request on B: 503, and B is closed.
    b.sendall(get_old)
    reply = b""
    while True:
        chunk = b.recv(65536)
        if not chunk:
            break
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 503"), reply[:300]
    assert b"<Code>ServiceUnavailable</Code>" in reply, reply
    assert b"connection: close" in reply.lower(), reply
    b.close()
    # A new connection is refused.
    with pytest.raises(OSError):
        c = socket.create_connection(("127.0.0.1", srv.s3_port), timeout=2)
        c.sendall(get_old)
        if not c.recv(100):
            raise ConnectionResetError("closed without a reply")
    assert srv.alive()

    # The upload in flight completes and is acknowledged.
    a.sendall(data[len(data) // 2:])
    reply = a.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert hashlib.md5(data).hexdigest().encode() in reply, reply
    a.close()
    assert srv.wait(timeout=30) == 0
    srv.start()
    s3 = srv.client()
    assert s3.get_object(Bucket=bucket, Key="inflight")["Body"].read() == data


def test_health_ready_is_503_while_starting(server_factory, tmp_path):
    # Enough segments (32 MiB in 4 MiB segments) that recovery takes a
    # while: /health/ready answers "starting" dozens of times meanwhile.
    conf = tmp_path / "percore.toml"
    conf.write_text("segment_bytes_max = 4194304\n")
    srv = server_factory(shards=1, extra_args=["--config", str(conf)])
    s3 = srv.client()
    bucket = unique_bucket_name("starting")
    s3.create_bucket(Bucket=bucket)
    for i in range(32):
        s3.put_object(Bucket=bucket, Key=f"k{i}", Body=os.urandom(1 << 20))
    srv.terminate()
    seen: list[tuple[int, bytes]] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                seen.append(admin_get(srv, "/health/ready"))
            except OSError:
                pass  # not listening yet
            if seen and seen[-1][0] == 200:
                return
            time.sleep(0.0005)

    t = threading.Thread(target=poll)
    t.start()
    try:
        srv.start()
    finally:
        time.sleep(0.2)
        stop.set()
        t.join()
    starting = seen.count((503, b"starting: recovering shards\n"))
    print(f"ready polled {len(seen)} times, {starting} answered starting")
    assert starting > 0, seen[:5]
    assert seen[-1] == (200, b"ok\n")
    # Once ready, never back to 503.
    first_ok = seen.index((200, b"ok\n"))
    assert all(s == (200, b"ok\n") for s in seen[first_ok:])


def refused(data: str, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    s3, native, admin = free_ports(3)
    args = {"--s3": f"127.0.0.1:{s3}", "--native": f"127.0.0.1:{native}",
            "--admin": f"127.0.0.1:{admin}"}
    for i in range(0, len(extra), 2):
        args[extra[i]] = extra[i + 1]
    cmd = [str(percore_bin()), "serve", "--data", data, "--shards", "1", "--unpinned"]
    for k, v in args.items():
        cmd += [k, v]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "percore: ready" not in p.stdout
    return p


def test_startup_refuses_a_data_dir_under_a_regular_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("not a directory")
    p = refused(str(f / "data"))
    assert "cannot create data directory" in p.stderr and "Not a directory" in p.stderr, p.stderr
    p = refused(str(f))
    assert "cannot create data directory" in p.stderr, p.stderr
    assert f.read_text() == "not a directory"


def test_startup_refuses_an_unwritable_data_dir_even_as_root(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    how = None
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)],
                                                 capture_output=True).returncode == 0:
        how = "chattr"
    elif subprocess.run(["mount", "--bind", str(d), str(d)], capture_output=True).returncode == 0:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(d)], check=True)
        how = "mount"
    if how is None and os.geteuid() != 0:
        d.chmod(0o555)  # enough for a non-root server
        how = "chmod"
    if how is None:
        pytest.fail("neither chattr +i nor a read-only bind mount works here")
    try:
        p = refused(str(d))
        assert "is not writable" in p.stderr, p.stderr
        assert "--data" in p.stderr, p.stderr  # says what to do
        assert not any(d.iterdir())
    finally:
        if how == "chattr":
            subprocess.run(["chattr", "-i", str(d)], check=True)
        elif how == "mount":
            subprocess.run(["umount", str(d)], check=True)
        else:
            d.chmod(0o755)


def test_startup_refuses_ports_in_use(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        p = refused(str(tmp_path / "d1"), "--native", f"127.0.0.1:{port}")
        assert f"cannot listen on 127.0.0.1:{port} for the native protocol" in p.stderr, p.stderr
        p = refused(str(tmp_path / "d2"), "--s3", f"127.0.0.1:{port}")
        assert str(port) in p.stderr and "percore: error:" in p.stderr, p.stderr
    finally:
        busy.close()
