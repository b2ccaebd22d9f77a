"""The bad-input matrix: malformed and hostile requests against the running
server. Each case gets the right error (status, and S3 code where one is
defined) or a closed connection, and after every case the server still
serves other clients byte-exactly."""

from __future__ import annotations

import re
import socket
import time

import pytest
from botocore.exceptions import ClientError

import s3wire
from conftest import ACCESS_KEY, SECRET_KEY, metric, module_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BUCKET = "badinput"
# Short, so that the cases that wait for the head timeout (a request head
# that never ends) take 2 s, not the default 10 s.
HEADER_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def server(request):
    """The bad-input matrix at one shard count: hostile bytes are parsed and
    refused by the shard that accepted the connection, before any routing,
    so 1, 2 and 4 shards see the same thing. 2 rather than 1: the cases that
    do reach a key (missing key, Content-MD5, multipart) then also go
    through the forwarding to the key's owner shard."""
    yield from module_server(request, shards=2,
                             env={"PERCORE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)})


def signer(secret: str = SECRET_KEY, **kw) -> s3wire.Signer:
    return s3wire.Signer(ACCESS_KEY, secret, **kw)


def raw_exchange(srv, data: bytes, timeout: float = 10, half_close: bool = False) -> bytes:
    """Sends raw bytes, returns everything the server answers until it
    closes or goes quiet."""
    s = socket.create_connection((srv.host, srv.s3_port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
            if half_close is False and b"\r\n\r\n" in out and _complete(out):
                break
        return out
    finally:
        s.close()


def _complete(resp: bytes) -> bool:
    head, _, body = resp.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


def status_of(resp: bytes) -> int | None:
    if not resp.startswith(b"HTTP/1."):
        return None
    return int(resp.split(b" ", 2)[1])


def code_of(resp: bytes) -> str | None:
    """The S3 error code of an XML error reply."""
    m = re.search(rb"<Code>([^<]*)</Code>", resp)
    return m.group(1).decode() if m else None


def signed_request(srv, method: str, path: str, headers: dict | None = None, body: bytes = b"",
                   sign: s3wire.Signer | None = None, payload_hash: str | None = None,
                   query: list | None = None) -> bytes:
    """A SigV4-signed request as raw bytes (so tests can corrupt it after)."""
    hdrs = {"host": f"{srv.host}:{srv.s3_port}", **(headers or {})}
    if body and "content-length" not in {k.lower() for k in hdrs}:
        hdrs["content-length"] = str(len(body))
    signed, _ = (sign or signer()).sign(method, path, hdrs,
                                        payload_hash or s3wire.sha256_hex(body), query=query)
    target = path + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in signed.items())
    return head.encode() + b"\r\n" + body


@pytest.fixture(scope="module")
def srv(server):
    c = server.client()
    try:
        c.create_bucket(Bucket=BUCKET)
    except Exception:
        pass
    c.put_object(Bucket=BUCKET, Key="canary", Body=b"still here")
    return server


def assert_serving(srv):
    assert srv.client().get_object(Bucket=BUCKET, Key="canary")["Body"].read() == b"still here"


def _bad_request_line(srv):
    return b"GARBAGE\r\n\r\n"


CASES: list[tuple[str, object, set, str | None]] = []


def case(name: str, expect: set, code: str | None = None):
    def wrap(fn):
        CASES.append((name, fn, expect, code))
        return fn
    return wrap


# Each case returns raw request bytes (or a callable result); `expect` is the
# set of acceptable statuses, None meaning "connection closed without one";
# `code`, where given, is the S3 error code the reply must carry.
case("garbage request line", {400, None})(lambda s: b"GARBAGE\r\n\r\n")
case("only blank lines, then silence", {400, 408, None})(lambda s: b"\r\n\r\n")
case("unknown HTTP version", {505, 400, None})(lambda s: b"GET / HTTP/9.9\r\nHost: x\r\n\r\n")
case("HTTP/0.9 style", {400, None})(lambda s: b"GET /\r\n\r\n")
case("lowercase method", {400, 403, 405, 501, None})(lambda s: b"get / HTTP/1.1\r\nHost: x\r\n\r\n")
case("header without colon", {400, None})(lambda s: b"GET / HTTP/1.1\r\nHost x\r\n\r\n")
case("header with space before colon", {400, None})(lambda s: b"GET / HTTP/1.1\r\nHost : x\r\n\r\n")
case("NUL in header value", {400, None})(lambda s: b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n")
case("oversized header section", {431, 400, None})(
    lambda s: b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
case("too many headers", {431, 400, None})(
    lambda s: b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n")
case("very long URI", {414, 431, 400, None})(lambda s: b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
case("negative Content-Length", {400, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
case("non-numeric Content-Length", {400, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
case("Content-Length past u64", {400, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n")
# Signed, so that it passes authentication and reaches the size check (an
# anonymous one is refused before): one byte over the 5 GiB PUT limit,
# refused from the headers alone, before any body byte is read.
case("Content-Length one byte over 5 GiB", {400}, "EntityTooLarge")(
    lambda s: signed_request(s, "PUT", f"/{BUCKET}/huge",
                             headers={"content-length": str((5 << 30) + 1)},
                             payload_hash=s3wire.UNSIGNED_PAYLOAD))
case("aws-chunked decoded length one byte over 5 GiB", {400}, "EntityTooLarge")(
    lambda s: signed_request(s, "PUT", f"/{BUCKET}/huge",
                             headers={"content-encoding": "aws-chunked",
                                      "x-amz-decoded-content-length": str((5 << 30) + 1)},
                             body=b"5\r\nhello\r\n0\r\n\r\n",
                             payload_hash=s3wire.STREAMING_UNSIGNED_TRAILER))
case("two different Content-Lengths", {400, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
case("Content-Length with Transfer-Encoding", {400, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
case("unknown Transfer-Encoding", {400, 501, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
case("bad chunk size", {400, 403, None})(
    lambda s: b"PUT /badinput/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
case("anonymous request", {403})(lambda s: b"GET /badinput/canary HTTP/1.1\r\nHost: x\r\n\r\n")
case("malformed Authorization", {400, 403})(
    lambda s: b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: AWS4-HMAC-SHA256 nonsense\r\n\r\n")
case("AWS v2 signature", {400, 403})(
    lambda s: b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: AWS percore:abc=\r\n\r\n")
case("wrong secret", {403})(lambda s: signed_request(s, "GET", f"/{BUCKET}/canary", sign=signer("wrong")))
case("unknown access key", {403})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary", sign=s3wire.Signer("nobody", SECRET_KEY)))
case("skewed clock (1 hour ahead)", {403})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary",
                             sign=signer(amz_date=time.strftime("%Y%m%dT%H%M%SZ",
                                                                 time.gmtime(time.time() + 3600)))))
case("skewed clock (1 day behind)", {403})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary",
                             sign=signer(amz_date=time.strftime("%Y%m%dT%H%M%SZ",
                                                                 time.gmtime(time.time() - 86400)))))
case("truncated signature", {400, 403})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary").replace(b"Signature=", b"Signature=00", 1))
case("body does not match signed sha256", {400, 403})(
    lambda s: signed_request(s, "PUT", f"/{BUCKET}/tampered", body=b"actual",
                             payload_hash=s3wire.sha256_hex(b"claimed")))
case("expired presigned URL", {403})(lambda s: _presigned(s, expires=1, age=120))
case("presigned URL expiring beyond 7 days", {400, 403})(lambda s: _presigned(s, expires=700000, age=0))
case("bad bucket name", {400})(lambda s: signed_request(s, "PUT", "/Bad_Bucket_Name"))
case("key too long", {400})(lambda s: signed_request(s, "GET", f"/{BUCKET}/" + "k" * 1100))
case("NUL in key", {400})(lambda s: signed_request(s, "GET", f"/{BUCKET}/a%00b"))
case("invalid percent escape in key", {400, 403})(lambda s: signed_request(s, "GET", f"/{BUCKET}/a%zzb"))
case("non-UTF-8 key", {400})(lambda s: signed_request(s, "GET", f"/{BUCKET}/%ff%fe"))
case("dot-dot key is just a key", {404})(lambda s: signed_request(s, "GET", f"/{BUCKET}/../../etc/passwd"))
case("missing bucket", {404})(lambda s: signed_request(s, "GET", "/no-such-bucket-here/k"))
case("missing key", {404})(lambda s: signed_request(s, "GET", f"/{BUCKET}/no-such-key"))
case("unsatisfiable range", {416})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary", headers={"range": "bytes=100-200"}))
case("bad Content-MD5", {400})(
    lambda s: signed_request(s, "PUT", f"/{BUCKET}/md5", body=b"abc", headers={"content-md5": "notbase64!"}))
case("wrong Content-MD5", {400})(
    lambda s: signed_request(s, "PUT", f"/{BUCKET}/md5", body=b"abc",
                             headers={"content-md5": "1B2M2Y8AsgTpgAmY7PhCfg=="}))
# On an upload that exists, so that the XML is what is wrong (an unknown
# upload id would be a 404 NoSuchUpload whatever the body).
case("malformed CompleteMultipartUpload XML", {400}, "MalformedXML")(
    lambda s: signed_request(s, "POST", f"/{BUCKET}/mpu-bad-xml", body=b"<Complete<<",
                             query=[("uploadId", _open_upload(s, "mpu-bad-xml"))]))
case("DeleteObjects with a DTD", {400})(
    lambda s: signed_request(s, "POST", f"/{BUCKET}", body=b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x "y">]><Delete><Object><Key>&x;</Key></Object></Delete>',
                             query=[("delete", "")]))
case("unsupported subresource", {501})(lambda s: signed_request(s, "GET", f"/{BUCKET}", query=[("website", "")]))
case("method not allowed on service", {405})(lambda s: signed_request(s, "DELETE", "/"))
case("pipelined garbage after a good request", {200})(
    lambda s: signed_request(s, "GET", f"/{BUCKET}/canary") + b"\x16\x03\x01garbage\r\n\r\n")
case("TLS handshake to the plain port", {400, None})(lambda s: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64)


def _open_upload(srv, key: str) -> str:
    return srv.client().create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]


def _presigned(srv, expires: int, age: int) -> bytes:
    """A presigned GET built by hand: X-Amz-Date `age` seconds ago."""
    import hashlib
    import hmac
    from urllib.parse import quote
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - age))
    sg = signer(amz_date=amz_date)
    path = f"/{BUCKET}/canary"
    host = f"{srv.host}:{srv.s3_port}"
    q = sorted([
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", f"{ACCESS_KEY}/{sg.scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ])
    cq = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in q)
    creq = "\n".join(["GET", path, cq, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, sg.scope,
                     hashlib.sha256(creq.encode()).hexdigest()])
    sig = hmac.new(sg.key, sts.encode(), hashlib.sha256).hexdigest()
    return f"GET {path}?{cq}&X-Amz-Signature={sig} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def test_matrix_has_at_least_40_cases():
    assert len(CASES) >= 40, len(CASES)


@pytest.mark.parametrize("name,make,expect,code", CASES, ids=[c[0] for c in CASES])
def test_bad_input(srv, name, make, expect, code):
    resp = raw_exchange(srv, make(srv))
    got = status_of(resp)
    assert got in expect, f"{name}: got {got}: {resp[:400]!r}"
    if got is not None and got >= 400 and b"<Error>" in resp:
        assert b"<Code>" in resp and b"<RequestId>" in resp, resp[:400]
    if code is not None:
        assert code_of(resp) == code, f"{name}: want {code}, got {code_of(resp)}: {resp[:400]!r}"
    assert_serving(srv)


def test_body_shorter_than_declared_then_disconnect_leaves_nothing(srv):
    req = signed_request(srv, "PUT", f"/{BUCKET}/partial", headers={"content-length": "100000"},
                         payload_hash="UNSIGNED-PAYLOAD")
    raw_exchange(srv, req + b"x" * 5000, timeout=3, half_close=True)
    c = srv.client()
    with pytest.raises(ClientError) as ei:
        c.head_object(Bucket=BUCKET, Key="partial")
    # HEAD has no body, so no S3 code: the status says "no such key".
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404, ei.value.response
    assert_serving(srv)


def test_slowloris_head_is_cut_off(server_factory):
    # A request head trickled a byte at a time never completes: the head
    # timeout (counted from the head's first byte, not reset by later ones)
    # must answer 408 and close, HEADER_TIMEOUT_S after the first byte.
    srv = server_factory(shards=1, env={"PERCORE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)})
    s = socket.create_connection((srv.host, srv.s3_port), timeout=60)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    s.settimeout(0.2)
    reply, closed_after = b"", None
    try:
        while time.monotonic() - started < HEADER_TIMEOUT_S + 10:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                s.sendall(b"X")  # one more header byte, every 0.2 s
                continue
            if not chunk:
                closed_after = time.monotonic() - started
                break
            reply += chunk
    except (BrokenPipeError, ConnectionResetError):
        closed_after = time.monotonic() - started
    finally:
        s.close()
    assert closed_after is not None, (f"a trickled request head was not cut off in "
                                      f"{HEADER_TIMEOUT_S + 10} s (head timeout "
                                      f"{HEADER_TIMEOUT_S} s)")
    assert HEADER_TIMEOUT_S - 0.5 <= closed_after <= HEADER_TIMEOUT_S + 2, \
        f"closed after {closed_after:.2f} s, head timeout {HEADER_TIMEOUT_S} s"
    assert status_of(reply) == 408, reply[:300]
    srv.client().list_buckets()


def _read_reply(s: socket.socket) -> bytes:
    """One whole response (head and Content-Length body), or what came
    before the server closed."""
    reply = b""
    while b"\r\n\r\n" not in reply or not _complete(reply):
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `s` (EOF or reset), None if it did not."""
    started = time.monotonic()
    s.settimeout(seconds)
    try:
        while True:
            if not s.recv(4096):
                return time.monotonic() - started
    except (ConnectionResetError, BrokenPipeError):
        return time.monotonic() - started
    except socket.timeout:
        return None


def test_idle_connections_are_closed(server_factory):
    # Short timeouts (PERCORE_IDLE_TIMEOUT_S / idle_timeout_s): a connection
    # that never sends, and one that goes quiet after a request, are both
    # closed; a busy client meanwhile is served.
    srv = server_factory(shards=1, env={"PERCORE_IDLE_TIMEOUT_S": "2",
                                        "PERCORE_HEADER_TIMEOUT_S": "2"})
    silent = socket.create_connection((srv.host, srv.s3_port))
    kept = socket.create_connection((srv.host, srv.s3_port))
    kept.sendall(signed_request(srv, "GET", "/"))
    reply = _read_reply(kept)
    assert status_of(reply) == 200, reply[:300]
    c = srv.client()
    for _ in range(5):
        c.list_buckets()
        time.sleep(0.2)
    for name, s in (("silent", silent), ("kept-alive then idle", kept)):
        took = _closed_within(s, 15)
        s.close()
        assert took is not None, f"{name} connection still open after 15 s with a 2 s idle timeout"
    c.list_buckets()


def test_connection_limit_refuses_new_connections_and_recovers(server_factory):
    # connections_per_shard_max = 4 on one shard: a connection past the
    # limit is closed at once and counted; the others keep working; after
    # one closes a new connection is served.
    srv = server_factory(shards=1, env={"PERCORE_CONNECTIONS_MAX": "4"})

    def served(s: socket.socket) -> bool:
        s.sendall(signed_request(srv, "GET", "/"))
        return status_of(_read_reply(s)) == 200

    # The harness may hold a kept-alive connection of its own (readiness
    # check): fill up to the limit from what is open now.
    already = int(metric(srv, "percore_connections_open"))
    assert already < 4, f"{already} connections open before the test"
    held = [socket.create_connection((srv.host, srv.s3_port), timeout=10)
            for _ in range(4 - already)]
    assert all(served(s) for s in held)
    refused_before = metric(srv, "percore_connections_refused_total")
    extra = socket.create_connection((srv.host, srv.s3_port), timeout=10)
    took = _closed_within(extra, 5)
    extra.close()
    assert took is not None, "a connection over the limit of 4 was not closed"
    assert metric(srv, "percore_connections_refused_total") == refused_before + 1
    assert all(served(s) for s in held), "connections under the limit stopped being served"
    held.pop().close()
    deadline = time.monotonic() + 10
    while True:
        s = socket.create_connection((srv.host, srv.s3_port), timeout=10)
        try:
            if served(s):
                break
        except OSError:
            pass
        finally:
            s.close()
        assert time.monotonic() < deadline, "no new connection served after one closed"
        time.sleep(0.2)
    for s in held:
        s.close()
