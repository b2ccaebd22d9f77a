"""percore's S3 BatchGet (``POST /{bucket}?batchGet``), from Python.

For hosts that reach only percore's S3 endpoint (a proxy, a firewall that
passes HTTP): many objects, or ranges of them, in one SigV4-signed request,
streamed back as one tar in request order (docs/s3.md, "BatchGet").

    from percore.s3batch import S3BatchClient
    c = S3BatchClient("http://127.0.0.1:9000", "percore", "percore-secret")
    blobs = c.get_batch("data", ["a.jpg", "b.jpg"])            # list[bytes]
    for item in c.iter_batch("data", [("big.bin", [(0, 4096)])]):
        print(item.key, item.index, item.error, len(item.data))

``S3BatchClient`` has the reading methods of ``percore.Client`` that the
datasets use (``get``, ``get_ranges``, ``get_batch``, ``stat``, ``list``),
so ``percore.torch.IterableDataset(bucket, prefix=..., client=S3BatchClient(...))``
reads over S3. Signing uses botocore (installed with boto3).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tarfile
import urllib.parse
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from ._native import InvalidRange, NoSuchBucket, NoSuchKey, PercoreError, ServerError

#: Objects per request (the server's limit).
BATCH_ITEMS_MAX = 1000

_ERRORS = {"NoSuchKey": NoSuchKey, "NoSuchBucket": NoSuchBucket, "InvalidRange": InvalidRange}


@dataclass
class BatchItem:
    """One member of the answer: ``data`` is empty when ``error`` is set."""

    index: int
    key: str
    data: bytes
    etag: str | None = None
    size: int | None = None
    range: str | None = None
    error: str | None = None
    message: str | None = None
    extra: dict = field(default_factory=dict)

    def raise_for_error(self) -> None:
        if self.error:
            err = _ERRORS.get(self.error, ServerError)(f"{self.key}: {self.error}: {self.message}")
            err.code = self.error
            raise err


def _xml_escape(key: str) -> str:
    # XML 1.0 cannot carry most control characters even escaped; refuse
    # them here rather than send a body the server must reject.
    if any(ord(ch) < 0x20 and ch not in "\t\n\r" for ch in key):
        raise ValueError(f"key {key!r} has control characters, which XML cannot carry")
    return escape(key)


def batch_body(items) -> bytes:
    """The XML body for ``items``: names, or ``(name, [(offset, length), ...])``
    pairs (one ``Object`` per range)."""
    parts = ["<BatchGet>"]
    count = 0
    for it in items:
        if isinstance(it, str):
            parts.append(f"<Object><Key>{_xml_escape(it)}</Key></Object>")
            count += 1
            continue
        key, ranges = it
        for off, length in ranges:
            if length <= 0:
                raise ValueError(f"{key}: a range must have a positive length")
            parts.append(f"<Object><Key>{_xml_escape(key)}</Key>"
                         f"<Range>bytes={off}-{off + length - 1}</Range></Object>")
            count += 1
    parts.append("</BatchGet>")
    if count > BATCH_ITEMS_MAX:
        raise ValueError(f"at most {BATCH_ITEMS_MAX} objects or ranges per request")
    return "".join(parts).encode()


class S3BatchClient:
    """BatchGet (and the few other reads datasets need) over percore's S3
    endpoint. Settings default to ``PERCORE_S3_ENDPOINT`` (else
    ``http://127.0.0.1:9000``), ``PERCORE_ACCESS_KEY``, ``PERCORE_SECRET_KEY``."""

    def __init__(self, endpoint_url: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, region: str = "us-east-1",
                 timeout: float = 60.0):
        self.endpoint_url = (endpoint_url or os.environ.get("PERCORE_S3_ENDPOINT")
                             or "http://127.0.0.1:9000").rstrip("/")
        self.access_key = access_key or os.environ.get("PERCORE_ACCESS_KEY") or "percore"
        self.secret_key = secret_key or os.environ.get("PERCORE_SECRET_KEY") or "percore-secret"
        self.region = region
        self.timeout = timeout
        u = urllib.parse.urlsplit(self.endpoint_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint_url must be http(s)://host:port, not {endpoint_url!r}")
        self._u = u
        self._boto = None

    @property
    def endpoint(self) -> str:
        return self.endpoint_url

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_boto"] = None
        return state

    def _signed_headers(self, method: str, url: str, body: bytes) -> dict:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        req = AWSRequest(method=method, url=url, data=body, headers={
            "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
            "Content-Type": "application/xml",
        })
        SigV4Auth(Credentials(self.access_key, self.secret_key), "s3", self.region).add_auth(req)
        return dict(req.headers.items())

    def iter_batch(self, bucket: str, items):
        """Yields a ``BatchItem`` per requested object or range, in request
        order, as the tar stream arrives."""
        body = batch_body(items)
        path = f"/{urllib.parse.quote(bucket, safe='')}"
        url = f"{self.endpoint_url}{path}?batchGet"
        headers = self._signed_headers("POST", url, body)
        conn_cls = http.client.HTTPSConnection if self._u.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(self._u.hostname, self._u.port, timeout=self.timeout)
        try:
            conn.request("POST", f"{path}?batchGet", body=body, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode("utf-8", "replace")
                code = text.split("<Code>", 1)[1].split("</Code>", 1)[0] if "<Code>" in text else ""
                err = _ERRORS.get(code, ServerError)(
                    f"BatchGet answered {resp.status} {code}: {text[:500]}")
                err.code = code
                raise err
            with tarfile.open(fileobj=resp, mode="r|") as tf:
                for m in tf:
                    pax = m.pax_headers
                    if "PERCORE.index" not in pax:
                        raise PercoreError(f"unexpected tar member {m.name!r} in a BatchGet answer")
                    f = tf.extractfile(m)
                    data = f.read() if f is not None else b""
                    if len(data) != m.size:
                        raise PercoreError(f"{m.name}: {len(data)} of {m.size} bytes (stream cut)")
                    yield BatchItem(
                        index=int(pax["PERCORE.index"]), key=pax.get("path", m.name), data=data,
                        etag=pax.get("PERCORE.etag"),
                        size=int(pax["PERCORE.size"]) if "PERCORE.size" in pax else None,
                        range=pax.get("PERCORE.range"), error=pax.get("PERCORE.error"),
                        message=pax.get("PERCORE.message"),
                        extra={k: v for k, v in pax.items() if k.startswith("PERCORE.")})
        except (tarfile.ReadError, http.client.HTTPException, OSError) as e:
            if isinstance(e, PercoreError):
                raise
            raise PercoreError(f"BatchGet stream cut or malformed: {e!r}") from e
        finally:
            conn.close()

    def get_batch(self, bucket: str, keys, *, missing: str = "raise") -> list:
        """As ``percore.Client.get_batch``: ``bytes`` per name, a list of
        ``bytes`` per ``(name, ranges)`` pair; in request order, split into
        requests of at most 1000 objects."""
        if missing not in ("raise", "none"):
            raise ValueError("missing must be 'raise' or 'none'")
        keys = list(keys)
        out: list = []
        group: list = []
        weight = 0

        def flush():
            nonlocal group, weight
            if not group:
                return
            got = list(self.iter_batch(bucket, group))
            if [g.index for g in got] != list(range(weight)):
                raise PercoreError(f"BatchGet answered {len(got)} members for {weight} objects")
            pos = 0
            for it in group:
                n = 1 if isinstance(it, str) else len(it[1])
                parts = got[pos:pos + n]
                pos += n
                value = []
                failed = None
                for p in parts:
                    if p.error:
                        failed = p
                    value.append(p.data)
                if failed is not None:
                    if failed.error == "NoSuchKey" and missing == "none":
                        out.append(None)
                        continue
                    failed.raise_for_error()
                out.append(value[0] if isinstance(it, str) else value)
            group, weight = [], 0

        for it in keys:
            n = 1 if isinstance(it, str) else len(it[1])
            if weight + n > BATCH_ITEMS_MAX:
                flush()
            group.append(it)
            weight += n
        flush()
        return out

    def get(self, bucket: str, key: str) -> bytes:
        return self.get_batch(bucket, [key])[0]

    def get_ranges(self, bucket: str, key: str, ranges) -> list:
        ranges = list(ranges)
        return self.get_batch(bucket, [(key, ranges)])[0] if ranges else []

    def _s3(self):
        if self._boto is None:
            import boto3
            from botocore.config import Config

            self._boto = boto3.client(
                "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key, region_name=self.region,
                config=Config(s3={"addressing_style": "path"}))
        return self._boto

    def stat(self, bucket: str, key: str):
        """``.size`` and ``.etag``, as ``percore.Client.stat``."""
        from types import SimpleNamespace

        h = self._s3().head_object(Bucket=bucket, Key=key)
        return SimpleNamespace(size=h["ContentLength"], etag=h["ETag"].strip('"'))

    def list(self, bucket: str, prefix: str = ""):
        """Keys under ``prefix`` (objects with ``.key`` and ``.size``)."""
        from types import SimpleNamespace

        out = []
        for page in self._s3().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix):
            for o in page.get("Contents", []):
                out.append(SimpleNamespace(key=o["Key"], size=o["Size"], is_prefix=False,
                                           etag=o["ETag"].strip('"')))
        return out
