"""percore's S3 BatchGet (POST /{bucket}?batchGet): many objects and ranges
in one SigV4 request, answered as a tar stream in request order, with
missing keys and bad ranges reported inline."""

import hashlib
import http.client
import os
import random
import subprocess
import tarfile
import io

import pytest

from percore.s3batch import S3BatchClient, batch_body
import percore
from conftest import unique_bucket_name


@pytest.fixture(scope="module")
def batch(server):
    return S3BatchClient(server.endpoint)


@pytest.fixture(scope="module")
def objects(server, s3):
    bucket = unique_bucket_name("batch")
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(3)
    objs = {}
    for i in range(120):
        key = f"s/{i:03d}" if i % 10 else f"s/dir {i}/ünï & <x>"
        objs[key] = rng.randbytes(rng.randrange(0, 20_000))
    objs["big"] = rng.randbytes(5 * 1024 * 1024 + 123)   # streamed, not read ahead
    objs["empty"] = b""
    for k, v in objs.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    return bucket, objs


def test_batch_in_request_order(batch, objects):
    bucket, objs = objects
    keys = list(objs)
    random.Random(1).shuffle(keys)
    keys += keys[:5]   # repeats are served again
    items = list(batch.iter_batch(bucket, keys))
    assert [it.index for it in items] == list(range(len(keys)))
    assert [it.key for it in items] == keys
    for it in items:
        assert it.error is None, it
        assert it.data == objs[it.key]
        assert it.size == len(objs[it.key])
        assert it.etag == hashlib.md5(objs[it.key]).hexdigest()
    assert batch.get_batch(bucket, keys) == [objs[k] for k in keys]


def test_missing_keys_and_bad_ranges_inline(batch, objects):
    bucket, objs = objects
    big = objs["big"]
    req = ["s/001", "no/such/key", ("big", [(0, 10), (len(big) - 7, 100), (2_000_000, 3_000_000)]),
           ("s/002", [(len(objs["s/002"]) + 5, 1)]), "s/003"]
    items = list(batch.iter_batch(bucket, req))
    assert len(items) == 7
    assert items[0].data == objs["s/001"]
    assert (items[1].error, items[1].data) == ("NoSuchKey", b"")
    assert items[2].data == big[:10] and items[2].range == f"0-9/{len(big)}"
    assert items[3].data == big[-7:]            # cut at the end, as a GET range is
    assert items[4].data == big[2_000_000:5_000_000]
    assert items[5].error == "InvalidRange"
    assert items[6].data == objs["s/003"]
    # The list form raises on a missing key, or leaves None.
    with pytest.raises(percore.NoSuchKey):
        batch.get_batch(bucket, ["s/001", "nope"])
    assert batch.get_batch(bucket, ["nope", "s/004"], missing="none") == [None, objs["s/004"]]


def _raw(server, body: bytes, bucket: str, query="batchGet", sign=True, headers=None,
         version="HTTP/1.1", unsigned_payload=False):
    """One request on a raw connection; returns (status, headers, body)."""
    c = S3BatchClient(server.endpoint)
    url = f"{server.endpoint}/{bucket}?{query}"
    h = {}
    if sign and unsigned_payload:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        req = AWSRequest(method="POST", url=url, data=body,
                         headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        SigV4Auth(Credentials("percore", "percore-secret"), "s3", "us-east-1").add_auth(req)
        h = dict(req.headers.items())
    elif sign:
        h = c._signed_headers("POST", url, body)
    h.update(headers or {})
    if version == "HTTP/1.0":
        import socket
        h.setdefault("Content-Length", str(len(body)))
        h.setdefault("Host", f"127.0.0.1:{server.s3_port}")
        head = f"POST /{bucket}?{query} HTTP/1.0\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        with socket.create_connection(("127.0.0.1", server.s3_port), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        status_line, _, rest = raw.partition(b"\r\n")
        return int(status_line.split()[1]), {}, rest.partition(b"\r\n\r\n")[2]
    conn = http.client.HTTPConnection("127.0.0.1", server.s3_port, timeout=30)
    try:
        conn.request("POST", f"/{bucket}?{query}", body=body, headers=h)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_request_errors(server, objects):
    bucket, _ = objects
    ok = batch_body(["s/001"])
    status, _, body = _raw(server, ok, bucket, sign=False)
    assert status == 403, body
    # The body names what is read: it must be signed (no UNSIGNED-PAYLOAD).
    status, _, body = _raw(server, ok, bucket, unsigned_payload=True)
    assert status == 400 and b"signed body" in body, body
    status, _, body = _raw(server, ok, unique_bucket_name("missing"))
    assert status == 404 and b"NoSuchBucket" in body
    status, _, body = _raw(server, b"<BatchGet>", bucket)
    assert status == 400 and b"MalformedXML" in body
    status, _, body = _raw(server, b"<BatchGet></BatchGet>", bucket)
    assert status == 400 and b"MalformedXML" in body
    many = ("<BatchGet>" + "<Object><Key>k</Key></Object>" * 1001 + "</BatchGet>").encode()
    status, _, body = _raw(server, many, bucket)
    assert status == 400 and b"1000" in body
    status, _, body = _raw(server, ok, bucket, version="HTTP/1.0")
    assert status == 400 and b"HTTP/1.1" in body, (status, body)
    with pytest.raises(ValueError):
        batch_body(["x" * 5] * 1001)
    # A range that is not bytes=... is an item error, not a silent whole object.
    body = b"<BatchGet><Object><Key>s/001</Key><Range>rows=1-2</Range></Object></BatchGet>"
    status, hdrs, data = _raw(server, body, bucket)
    assert status == 200
    members = list(tarfile.open(fileobj=io.BytesIO(data), mode="r|"))
    assert members[0].pax_headers["PERCORE.error"] == "InvalidArgument"


def test_sigv2_refused(server, objects):
    """SigV2 does not sign the batchGet query name: SigV4 only."""
    from botocore.auth import HmacV1Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    bucket, _ = objects
    body = batch_body(["s/001"])
    # SigV2 signs a bucket as `/bucket/` (as botocore's S3 client does).
    req = AWSRequest(method="POST", url=f"{server.endpoint}/{bucket}/?batchGet", data=body)
    HmacV1Auth(Credentials("percore", "percore-secret")).add_auth(req)
    status, _, resp = _raw(server, body, bucket, sign=False, headers=dict(req.headers.items()))
    assert status == 400 and b"Signature Version 4" in resp, resp


def test_keep_alive_after_a_batch(server, objects):
    """The chunked answer ends cleanly: the next request on the same
    connection is answered."""
    bucket, objs = objects
    c = S3BatchClient(server.endpoint)
    conn = http.client.HTTPConnection("127.0.0.1", server.s3_port, timeout=30)
    try:
        for _ in range(3):
            body = batch_body(["s/005", "big"])
            url = f"{server.endpoint}/{bucket}?batchGet"
            conn.request("POST", f"/{bucket}?batchGet", body=body,
                         headers=c._signed_headers("POST", url, body))
            r = conn.getresponse()
            assert r.status == 200
            assert r.getheader("Transfer-Encoding") == "chunked"
            assert r.getheader("Content-Type") == "application/x-tar"
            data = r.read()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
                got = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
            assert got == [("s/005", objs["s/005"]), ("big", objs["big"])]
    finally:
        conn.close()


def test_gnu_tar_reads_the_stream(server, objects, tmp_path):
    """A standard tar: GNU tar lists the keys (from the pax path records)."""
    bucket, objs = objects
    body = batch_body(["s/006", "s/dir 10/ünï & <x>", "empty"])
    status, _, data = _raw(server, body, bucket)
    assert status == 200
    (tmp_path / "b.tar").write_bytes(data)
    out = subprocess.run(["tar", "--warning=no-unknown-keyword", "-tf", str(tmp_path / "b.tar")],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["s/006", "s/dir 10/ünï & <x>", "empty"]


def test_datasets_over_s3(server, objects):
    """The dataset layer runs over S3 BatchGet when given an S3BatchClient."""
    torch = pytest.importorskip("torch")
    import percore.torch as ptorch

    bucket, objs = objects
    ds = ptorch.IterableDataset(bucket, prefix="s/", client=S3BatchClient(server.endpoint),
                                seed=2, batch=40)
    loader = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2,
                                         collate_fn=lambda b: b)
    got = [x for b in loader for x in b]
    want = {k: v for k, v in objs.items() if k.startswith("s/")}
    assert len(got) == len(want) and dict(got) == want


def test_webdataset_over_s3(server, s3):
    """WebDataset shards through S3BatchClient (stat and ranged reads)."""
    pytest.importorskip("torch")
    import percore.torch as ptorch

    bucket = unique_bucket_name("wds3")
    s3.create_bucket(Bucket=bucket)
    buf = io.BytesIO()
    want = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(30):
            for ext in ("txt", "bin"):
                data = os.urandom(i * 97) if ext == "bin" else str(i).encode()
                info = tarfile.TarInfo(f"x/{i:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                want.setdefault(f"x/{i:03d}", {})[ext] = data
    s3.put_object(Bucket=bucket, Key="shard-0.tar", Body=buf.getvalue())
    ds = ptorch.WebDataset(bucket, shards=["shard-0.tar"], client=S3BatchClient(server.endpoint))
    got = {s["__key__"]: {"txt": s["txt"], "bin": s["bin"]} for s in ds}
    assert got == want


def test_the_documented_curl_example(server, objects, tmp_path):
    """docs/s3.md's curl command, as written there, lists the batch."""
    import re
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    bucket, objs = objects
    doc = open(os.path.join(os.path.dirname(__file__), "../../docs/s3.md")).read()
    cmd = re.search(r"\ncurl -s --aws-sigv4.*?\| tar [^\n]*", doc, re.S).group(0).strip()
    cmd = cmd.replace("http://127.0.0.1:9000/data", f"{server.endpoint}/{bucket}")
    (tmp_path / "req.xml").write_text(
        "<BatchGet><Object><Key>s/001</Key></Object>"
        "<Object><Key>s/002</Key><Range>bytes=0-99</Range></Object></BatchGet>")
    out = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split()[-1] for ln in lines] == ["s/001", "s/002"]
    assert int(lines[1].split()[2]) == min(100, len(objs["s/002"]))


def test_client_gone_mid_stream(server, objects):
    """A client that reads a few KB of a large batch and hangs up: the
    server drops the request and its read-ahead tasks (cross-shard sessions
    go back to zero) and keeps serving everyone else."""
    import socket
    import time

    from conftest import metric

    bucket, objs = objects
    c = S3BatchClient(server.endpoint)
    small = [k for k in objs if k.startswith("s/")][:40]
    keys = [k for pair in zip(["big"] * 40, small) for k in pair]
    body = batch_body(keys)
    url = f"{server.endpoint}/{bucket}?batchGet"
    h = c._signed_headers("POST", url, body)
    h["Host"] = f"127.0.0.1:{server.s3_port}"
    h["Content-Length"] = str(len(body))
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.s3_port), timeout=30) as sock:
            head = f"POST /{bucket}?batchGet HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
            sock.sendall(head.encode() + body)
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = sock.recv(8192)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert c.get_batch(bucket, ["s/007", "big"]) == [objs["s/007"], objs["big"]]
    deadline = time.monotonic() + 20
    while metric(server, "percore_cross_shard_sessions") != 0:
        assert time.monotonic() < deadline, "cross-shard sessions left open"
        time.sleep(0.2)
    server.assert_alive()
