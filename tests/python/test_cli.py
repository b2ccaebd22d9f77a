"""The `percore` command-line client, run as a real process against a real
server: every subcommand (mb, put, get, cat, ls, rm, stat) with its output
and exit status, an error case each; and the offline tools: `fsck --json`
(clean, damaged, no such directory) and `doctor` exit codes.

One shard: the CLI's behaviour does not depend on the shard count (the
client's routing is tested in server/tests/native.rs)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest

from conftest import percore_bin, unique_bucket_name
from signed import one_shard_server


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def native_port(srv) -> int:
    m = re.search(rb"native endpoint: 127\.0\.0\.1:(\d+)", srv.stdout_path.read_bytes())
    assert m, srv.logs()
    return int(m.group(1))


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    srv = one_shard_server("cli")
    cwd = tmp_path_factory.mktemp("cli")
    endpoint = f"127.0.0.1:{native_port(srv)}"

    def run(*args, stdin: bytes | None = None, env: dict | None = None,
            check: int | None = 0) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items()
             if k not in ("PERCORE_ACCESS_KEY", "PERCORE_SECRET_KEY", "PERCORE_ENDPOINT")}
        e["PERCORE_ENDPOINT"] = endpoint
        e.update(env or {})
        p = subprocess.run([str(percore_bin()), *map(str, args)], input=stdin or b"",
                           capture_output=True, env=e, cwd=cwd, timeout=60)
        if check is not None:
            assert p.returncode == check, (args, p.returncode, p.stdout[-2000:],
                                           p.stderr[-2000:])
        return p

    try:
        yield srv, run, cwd
    finally:
        srv.close()


def err(p) -> str:
    return p.stderr.decode(errors="replace")


def test_mb_and_ls_buckets(cli):
    srv, run, _ = cli
    b = unique_bucket_name("mb")
    p = run("mb", b)
    assert p.stdout.decode() == f"made bucket {b}\n"
    lines = run("ls").stdout.decode().splitlines()
    assert any(line.split()[-1] == b for line in lines), lines
    p = run("mb", b, check=1)
    assert "percore: error:" in err(p) and "BucketExists" in err(p), err(p)
    p = run("mb", "Bad_Name", check=1)
    assert "InvalidBucketName" in err(p), err(p)


def test_put_stat_get_cat(cli):
    srv, run, cwd = cli
    b = unique_bucket_name("put")
    run("mb", b)
    data = os.urandom(300_000)
    src = cwd / "src.bin"
    src.write_bytes(data)
    p = run("put", src, f"{b}/dir/file.bin", "--content-type", "application/x-cli")
    m = re.search(rf"put {b}/dir/file.bin: (\d+) bytes in [0-9.]+ s, etag ([0-9a-f]+) "
                  rf"crc32c ([0-9a-f]{{8}}) \(shard 0\)", err(p))
    assert m, err(p)
    assert int(m.group(1)) == len(data)
    assert m.group(2) == hashlib.md5(data).hexdigest()
    assert int(m.group(3), 16) == crc32c(data)

    out = run("stat", f"{b}/dir/file.bin").stdout.decode()
    fields = dict(re.findall(r"^([a-z0-9 -]+):\s+(.*)$", out, re.M))
    assert fields["key"] == f"{b}/dir/file.bin"
    assert fields["size"] == str(len(data))
    assert fields["etag"] == hashlib.md5(data).hexdigest()
    assert fields["crc32c"] == f"{crc32c(data):08x}"
    assert fields["content-type"] == "application/x-cli"
    assert fields["owner shard"] == "0"

    # get: to a named file, to the key's last component, several ranges.
    p = run("get", f"{b}/dir/file.bin", cwd / "out.bin")
    assert (cwd / "out.bin").read_bytes() == data
    assert f"-> {cwd / 'out.bin'}: {len(data)} bytes" in err(p), err(p)
    run("get", f"{b}/dir/file.bin")
    assert (cwd / "file.bin").read_bytes() == data
    run("get", f"{b}/dir/file.bin", "parts.bin", "--range", "0-9", "--range", "1000-1999",
        "--range", f"{len(data) - 5}-")
    assert (cwd / "parts.bin").read_bytes() == data[:10] + data[1000:2000] + data[-5:]
    assert not list(cwd.glob("*.percore-partial"))

    # cat: whole and ranged, to stdout.
    assert run("cat", f"{b}/dir/file.bin").stdout == data
    assert run("cat", f"percore://{b}/dir/file.bin", "--range", "100-199").stdout == \
        data[100:200]

    # stdin with --size.
    small = b"from stdin\n" * 100
    run("put", "-", f"{b}/stdin", "--size", len(small), stdin=small)
    assert run("cat", f"{b}/stdin").stdout == small
    assert "binary/octet-stream" in run("stat", f"{b}/stdin").stdout.decode()


def test_put_get_cat_stat_errors(cli):
    srv, run, cwd = cli
    b = unique_bucket_name("errs")
    run("mb", b)
    (cwd / "x").write_bytes(b"x")
    p = run("put", cwd / "no-such-file", f"{b}/k", check=1)
    assert "cannot open" in err(p), err(p)
    p = run("put", cwd / "x", "no-such-bucket-zz/k", check=1)
    assert "NoSuchBucket" in err(p), err(p)
    p = run("put", cwd / "x", b, check=1)
    assert "is not bucket/key" in err(p), err(p)
    p = run("put", "-", f"{b}/stdin", stdin=b"abc", check=1)
    assert "--size" in err(p), err(p)
    # Fewer bytes on stdin than declared: refused, nothing stored.
    p = run("put", "-", f"{b}/short", "--size", "10", stdin=b"abc", check=1)
    assert "percore: error:" in err(p), err(p)
    assert "NoSuchKey" in err(run("stat", f"{b}/short", check=1))
    # get of a missing key: error, and no file (partial or whole) left.
    p = run("get", f"{b}/missing", cwd / "missing.out", check=1)
    assert "NoSuchKey" in err(p), err(p)
    assert not (cwd / "missing.out").exists()
    assert not list(cwd.glob("missing.out*"))
    p = run("get", f"{b}/k", "--range", "9-3", check=2)  # clap: bad argument
    assert "END is before START" in err(p), err(p)
    run("put", cwd / "x", f"{b}/one")
    p = run("cat", f"{b}/one", "--range", "5-9", check=1)
    assert "InvalidRange" in err(p) or "past the end" in err(p), err(p)
    p = run("cat", f"{b}/missing", check=1)
    assert "NoSuchKey" in err(p) and p.stdout == b"", err(p)
    p = run("stat", f"{b}/missing", check=1)
    assert "NoSuchKey" in err(p), err(p)
    p = run("stat", "no-such-bucket-zz/k", check=1)
    assert "NoSuchBucket" in err(p), err(p)


def test_ls_and_rm(cli):
    srv, run, cwd = cli
    b = unique_bucket_name("ls")
    run("mb", b)
    (cwd / "y").write_bytes(b"yy")
    for k in ["a", "d/1", "d/2", "d/e/3"]:
        run("put", cwd / "y", f"{b}/{k}")
    lines = run("ls", b).stdout.decode().splitlines()
    assert [line.split() for line in lines] == [["2", lines[0].split()[1], "a"],
                                               ["PRE", "d/"]], lines
    lines = run("ls", f"{b}/d/").stdout.decode().splitlines()
    assert [line.split()[-1] for line in lines] == ["d/1", "d/2", "d/e/"]
    lines = run("ls", "-r", f"{b}/d/").stdout.decode().splitlines()
    assert [line.split()[-1] for line in lines] == ["d/1", "d/2", "d/e/3"]
    assert all(line.split()[0] == "2" for line in lines)
    p = run("ls", "no-such-bucket-zz", check=1)
    assert "NoSuchBucket" in err(p), err(p)

    p = run("rm", f"{b}/a", f"{b}/d/1", f"{b}/never")
    assert p.stdout.decode().splitlines() == [f"deleted {b}/a", f"deleted {b}/d/1",
                                              f"absent  {b}/never"]
    assert [line.split()[-1] for line in run("ls", "-r", b).stdout.decode().splitlines()] == \
        ["d/2", "d/e/3"]
    p = run("rm", b, check=1)
    assert "is not bucket/key" in err(p), err(p)
    p = run("rm", "no-such-bucket-zz/k", check=1)
    assert "NoSuchBucket" in err(p), err(p)
    p = run("rm", check=2)  # at least one target
    assert "required" in err(p), err(p)


def test_connection_errors(cli):
    srv, run, cwd = cli
    p = run("ls", env={"PERCORE_SECRET_KEY": "wrong"}, check=1)
    assert "Unauthenticated" in err(p), err(p)
    p = run("ls", "--access-key", "nobody", check=1)
    assert "Unauthenticated" in err(p), err(p)
    # A secret that starts with `-` (a generated one can: base64url) is
    # the option's value, not an option.
    p = run("ls", "--secret-key", "-Zwrong", check=1)
    assert "Unauthenticated" in err(p), err(p)
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    p = run("ls", "--endpoint", f"127.0.0.1:{port}", check=1)
    assert "cannot reach" in err(p), err(p)


def fsck(data, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(percore_bin()), "fsck", "--data", str(data), *extra],
                          capture_output=True, timeout=120)


def test_fsck_json(server_factory, tmp_path):
    srv = server_factory(shards=1)
    s3 = srv.client()
    b = unique_bucket_name("fsck")
    s3.create_bucket(Bucket=b)
    victim = os.urandom(200_000)
    s3.put_object(Bucket=b, Key="victim", Body=victim)
    s3.put_object(Bucket=b, Key="other", Body=b"other" * 1000)
    srv.terminate()

    p = fsck(srv.data_dir, "--json")
    assert p.returncode == 0, (p.stdout, p.stderr)
    rep = json.loads(p.stdout)
    assert rep["shards"] == 1 and rep["live_objects"] == 2, rep
    assert rep["live_bytes"] == 200_000 + 5000, rep
    assert rep["problems"] == [] and rep["records"] >= 3 and rep["segments"] >= 1, rep

    # One flipped payload byte: exit 1, the object named in the JSON.
    needle = victim[100_000:100_064]
    for seg in sorted((srv.data_dir / "shard-000").glob("seg-*.pcs")):
        raw = seg.read_bytes()
        at = raw.find(needle)
        if at >= 0:
            with open(seg, "r+b") as f:
                f.seek(at + 7)
                f.write(bytes([raw[at + 7] ^ 0x01]))
            break
    else:
        pytest.fail("victim bytes not found in any segment")
    p = fsck(srv.data_dir, "--json")
    assert p.returncode == 1, (p.stdout, p.stderr)
    rep = json.loads(p.stdout)
    bad = [x for x in rep["problems"] if x["corruption"]]
    assert bad and all(x["key"] == "victim" and x["bucket"] == b for x in bad), rep
    text = fsck(srv.data_dir)
    assert text.returncode == 1 and b"DAMAGE" in text.stdout and b"victim" in text.stdout

    p = fsck(tmp_path / "no-such-dir", "--json")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert b"percore fsck: error:" in p.stderr and p.stdout == b""


def test_doctor_exit_codes(tmp_path):
    def doctor(*args):
        return subprocess.run([str(percore_bin()), "doctor", *map(str, args)],
                              capture_output=True, text=True, timeout=60)
    p = doctor("--data", tmp_path / "d")
    assert p.returncode in (0, 1), p
    assert "[FAIL]" in p.stdout if p.returncode == 1 else "[FAIL]" not in p.stdout, p.stdout
    assert re.search(r"^\[ OK \] disk\s+O_DIRECT works", p.stdout, re.M) or "O_DIRECT" in p.stdout
    # A data directory that cannot be created is a FAIL: exit 1.
    f = tmp_path / "file"
    f.write_text("x")
    p = doctor("--data", f / "d")
    assert p.returncode == 1, p
    assert re.search(r"^\[FAIL\] disk\s+cannot create data directory", p.stdout, re.M), p.stdout
    # A bad --cpus list is a usage error: exit 2.
    p = doctor("--data", tmp_path / "d", "--cpus", "x-y")
    assert p.returncode == 2 and "--cpus" in p.stderr, p
