"""Hand-built S3 requests: a small SigV4 signer and aws-chunked body encoders.

boto3 and the aws cli talk plain HTTP to the test server, and over plain HTTP
they never use the streaming (aws-chunked) upload formats; other SDKs and
boto3 over TLS do.  These helpers build such requests byte by byte so the
server's decoders get exercised.  The signer is checked against the example
AWS publishes for chunked uploads (see test_s3_wire.py).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import http.client
import re
import zlib
from dataclasses import dataclass, field
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def encode_key_path(bucket: str, key: str) -> str:
    """Path-style request path, encoded the way S3 SigV4 expects (no double encoding)."""
    return "/" + quote(bucket, safe="") + "/" + quote(key, safe="/~")


def crc32_b64(data: bytes) -> str:
    return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()


@dataclass
class Signer:
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    service: str = "s3"
    amz_date: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc)
                          .strftime("%Y%m%dT%H%M%SZ"))

    @property
    def date(self) -> str:
        return self.amz_date[:8]

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"

    @property
    def key(self) -> bytes:
        return signing_key(self.secret_key, self.date, self.region, self.service)

    def sign(self, method: str, path: str, headers: dict[str, str], payload_hash: str,
             query: list[tuple[str, str]] | None = None) -> tuple[dict[str, str], str]:
        """Returns (headers + x-amz-date/x-amz-content-sha256/Authorization, signature).

        Every header passed in is signed; ``host`` must be among them.
        """
        hdrs = dict(headers)
        hdrs["x-amz-date"] = self.amz_date
        hdrs["x-amz-content-sha256"] = payload_hash
        canon = sorted((k.lower().strip(), " ".join(str(v).split())) for k, v in hdrs.items())
        signed_headers = ";".join(k for k, _ in canon)
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
            for k, v in sorted(query or []))
        canonical_request = "\n".join([
            method, path, canonical_query,
            "".join(f"{k}:{v}\n" for k, v in canon),
            signed_headers, payload_hash,
        ])
        string_to_sign = "\n".join([
            "AWS4-HMAC-SHA256", self.amz_date, self.scope,
            sha256_hex(canonical_request.encode("utf-8")),
        ])
        signature = hmac.new(self.key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        hdrs["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{self.scope}, "
                                 f"SignedHeaders={signed_headers}, Signature={signature}")
        return hdrs, signature

    def chunk_signature(self, previous: str, chunk: bytes) -> str:
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", self.amz_date, self.scope, previous,
                         EMPTY_SHA256, sha256_hex(chunk)])
        return hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()

    def trailer_signature(self, previous: str, canonical_trailers: bytes) -> str:
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", self.amz_date, self.scope, previous,
                         sha256_hex(canonical_trailers)])
        return hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()


def split_chunks(payload: bytes, chunk_size: int) -> list[bytes]:
    return [payload[i:i + chunk_size] for i in range(0, len(payload), chunk_size)]


def signed_chunked_body(signer: Signer | None, seed_signature: str, payload: bytes,
                        chunk_size: int, trailer: tuple[str, str] | None = None,
                        corrupt_chunk: int | None = None) -> bytes:
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER] body.

    With ``signer=None`` every signature is 64 zeros (used to compute the
    encoded length before the seed signature exists).  ``corrupt_chunk`` flips
    a byte in that chunk's data after signing it.
    """
    out = bytearray()
    previous = seed_signature
    chunks = split_chunks(payload, chunk_size) + [b""]
    for i, chunk in enumerate(chunks):
        sig = signer.chunk_signature(previous, chunk) if signer else "0" * 64
        previous = sig
        data = bytearray(chunk)
        if corrupt_chunk == i and data:
            data[len(data) // 2] ^= 0x01
        out += f"{len(chunk):x};chunk-signature={sig}\r\n".encode()
        if chunk:
            out += data + b"\r\n"
    if trailer is None:
        out += b"\r\n"
    else:
        name, value = trailer
        canonical = f"{name}:{value}\n".encode()
        tsig = signer.trailer_signature(previous, canonical) if signer else "0" * 64
        out += f"{name}:{value}\r\n".encode()
        out += f"x-amz-trailer-signature:{tsig}\r\n".encode()
        out += b"\r\n"
    return bytes(out)


def unsigned_trailer_body(payload: bytes, chunk_size: int, trailer: tuple[str, str]) -> bytes:
    """STREAMING-UNSIGNED-PAYLOAD-TRAILER body, framed exactly as botocore frames it."""
    out = bytearray()
    for chunk in split_chunks(payload, chunk_size):
        out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    name, value = trailer
    out += f"0\r\n{name}:{value}\r\n\r\n".encode()
    return bytes(out)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str | None:
        m = re.search(rb"<Code>([^<]*)</Code>", self.body)
        return m.group(1).decode() if m else None


def send(host: str, port: int, method: str, path: str, headers: dict[str, str],
         body: bytes | list[bytes] | None = None, chunked: bool = False,
         timeout: float = 30) -> Response:
    """One request on a fresh connection. ``chunked`` sends Transfer-Encoding: chunked."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        hdrs = dict(headers)
        try:
            if chunked:
                hdrs["Transfer-Encoding"] = "chunked"
                pieces = body if isinstance(body, list) else [body or b""]
                conn.request(method, path, body=iter(pieces), headers=hdrs, encode_chunked=True)
            else:
                conn.request(method, path, body=body, headers=hdrs)
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer (e.g. reject) before reading the whole
            # body and close; its response is still there to read.
            pass
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def put_streaming_signed(host: str, port: int, signer: Signer, bucket: str, key: str,
                         payload: bytes, chunk_size: int = 64 * 1024, with_trailer: bool = False,
                         corrupt_chunk: int | None = None, extra_headers: dict | None = None
                         ) -> Response:
    """PutObject with a signed aws-chunked body (optionally with a signed CRC32 trailer)."""
    path = encode_key_path(bucket, key)
    trailer = ("x-amz-checksum-crc32", crc32_b64(payload)) if with_trailer else None
    length = len(signed_chunked_body(None, "0" * 64, payload, chunk_size, trailer))
    headers = {
        "host": f"{host}:{port}",
        "content-encoding": "aws-chunked",
        "content-length": str(length),
        "x-amz-decoded-content-length": str(len(payload)),
        **(extra_headers or {}),
    }
    if with_trailer:
        headers["x-amz-trailer"] = "x-amz-checksum-crc32"
    mode = STREAMING_SIGNED_TRAILER if with_trailer else STREAMING_SIGNED
    hdrs, seed = signer.sign("PUT", path, headers, mode)
    body = signed_chunked_body(signer, seed, payload, chunk_size, trailer, corrupt_chunk)
    assert len(body) == length
    return send(host, port, "PUT", path, hdrs, body)


def put_unsigned_trailer(host: str, port: int, signer: Signer, bucket: str, key: str,
                         payload: bytes, chunk_size: int = 64 * 1024,
                         transfer_chunked: bool = False) -> Response:
    """PutObject as SDKs send it over TLS: STREAMING-UNSIGNED-PAYLOAD-TRAILER + CRC32."""
    path = encode_key_path(bucket, key)
    body = unsigned_trailer_body(payload, chunk_size, ("x-amz-checksum-crc32", crc32_b64(payload)))
    headers = {
        "host": f"{host}:{port}",
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(payload)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    if not transfer_chunked:
        headers["content-length"] = str(len(body))
    hdrs, _ = signer.sign("PUT", path, headers, STREAMING_UNSIGNED_TRAILER)
    if transfer_chunked:
        pieces = [body[i:i + 10000] for i in range(0, len(body), 10000)]
        return send(host, port, "PUT", path, hdrs, pieces, chunked=True)
    return send(host, port, "PUT", path, hdrs, body)


def put_plain_chunked(host: str, port: int, signer: Signer, bucket: str, key: str,
                      pieces: list[bytes]) -> Response:
    """PutObject with Transfer-Encoding: chunked and no Content-Length (UNSIGNED-PAYLOAD)."""
    path = encode_key_path(bucket, key)
    headers = {"host": f"{host}:{port}"}
    hdrs, _ = signer.sign("PUT", path, headers, UNSIGNED_PAYLOAD)
    return send(host, port, "PUT", path, hdrs, pieces, chunked=True)


def put_signed_single(host: str, port: int, signer: Signer, bucket: str, key: str,
                      payload: bytes, unsigned: bool = False) -> Response:
    """Ordinary single-chunk PutObject with Content-Length."""
    path = encode_key_path(bucket, key)
    headers = {"host": f"{host}:{port}", "content-length": str(len(payload))}
    hdrs, _ = signer.sign("PUT", path, headers,
                          UNSIGNED_PAYLOAD if unsigned else sha256_hex(payload))
    return send(host, port, "PUT", path, hdrs, payload)
