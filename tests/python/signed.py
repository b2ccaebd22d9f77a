"""Signed raw S3 requests (SigV4 via s3wire.Signer) on a fresh connection,
for tests that must see the exact status, headers and body, and a
module-scoped single-shard server fixture helper for the tests of
behaviour that does not depend on the shard count."""

from __future__ import annotations

from urllib.parse import quote

from conftest import ACCESS_KEY, SECRET_KEY, Server
from s3wire import EMPTY_SHA256, Response, Signer, send, sha256_hex


def request(srv: Server, method: str, path: str, headers: dict | None = None,
            body: bytes = b"", query: list[tuple[str, str]] | None = None,
            timeout: float = 30) -> Response:
    """One SigV4-signed request; `path` is already encoded, `query` is signed too."""
    host = f"127.0.0.1:{srv.s3_port}"
    hdrs = {"host": host, **(headers or {})}
    if body or method in ("PUT", "POST"):
        hdrs["content-length"] = str(len(body))
    signed, _ = Signer(ACCESS_KEY, SECRET_KEY).sign(
        method, path, hdrs, sha256_hex(body) if body else EMPTY_SHA256, query=query)
    target = path
    if query:
        target += "?" + "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                                 for k, v in query)
    return send("127.0.0.1", srv.s3_port, method, target, signed, body or None, timeout=timeout)


def one_shard_server(name: str, **kw) -> Server:
    srv = Server(shards=1, name=name, **kw)
    srv.start()
    return srv
