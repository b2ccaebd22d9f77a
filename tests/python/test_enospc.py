"""A full disk, for real: the data directory on a small loop-mounted ext4.

PUTs fill it until the server answers 507 InsufficientStorage; then:
* every acknowledged object still reads back exactly, and the server keeps
  answering (HEAD, LIST, GET) while full;
* once space is freed outside percore (a ballast file removed), PUTs
  succeed again without a restart;
* a restart on the full disk recovers every acknowledged object.

Needs root (CI is root) and mkfs.ext4 (tools/install-test-deps.sh installs
it); creates the loop device it needs when there is none (modprobe loop,
else mknod).  Without them it skips, saying why, and tests/run.sh fails the
run on that skip."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest
from botocore.exceptions import ClientError

from conftest import unique_bucket_name

MiB = 1024 * 1024
FS_MIB = 64
BALLAST_MIB = 12


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)


def _loop_device_for(img) -> str:
    """Attaches `img` to a free loop device, making one first if the
    machine (a container, say) has none: loop module, /dev/loop-control,
    /dev/loopN nodes (block major 7)."""
    r = _run("losetup", "--find", "--show", str(img))
    if r.returncode == 0:
        return r.stdout.strip()
    tried = [f"losetup --find: {r.stderr.strip()}"]
    _run("modprobe", "loop")
    if not os.path.exists("/dev/loop-control"):
        _run("mknod", "-m", "660", "/dev/loop-control", "c", "10", "237")
    for n in range(8):
        node = f"/dev/loop{n}"
        if not os.path.exists(node):
            _run("mknod", "-m", "660", node, "b", "7", str(n))
    r = _run("losetup", "--find", "--show", str(img))
    if r.returncode == 0:
        return r.stdout.strip()
    tried.append(f"after modprobe/mknod: {r.stderr.strip()}")
    pytest.skip("no loop device could be made here: " + "; ".join(tried))


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 to loop-mount a small file system")
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(FS_MIB * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True)
    dev = _loop_device_for(img)
    try:
        r = _run("mount", dev, str(mnt))
        if r.returncode != 0:
            pytest.skip(f"cannot mount {dev} ({r.stderr.strip()})")
        try:
            yield mnt
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def test_full_disk_is_a_clean_507_and_nothing_acknowledged_is_lost(small_fs, server_factory, tmp_path):
    ballast = small_fs / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\0" * BALLAST_MIB * MiB)
        os.fsync(f.fileno())
    conf = tmp_path / "percore.toml"
    conf.write_text("segment_bytes_max = 4194304\n")
    srv = server_factory(shards=1, start=False, extra_args=["--config", str(conf)])
    srv.data_dir = small_fs / "data"
    srv.data_dir.mkdir()
    srv.start()
    s3 = srv.client()
    bucket = unique_bucket_name("full")
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(3)
    acked: dict[str, bytes] = {}
    error = None
    for i in range(200):
        body = rng.randbytes(MiB)
        try:
            s3.put_object(Bucket=bucket, Key=f"o{i:03d}", Body=body)
            acked[f"o{i:03d}"] = body
        except ClientError as e:
            error = e.response
            break
    assert error is not None, "the small file system never filled up"
    assert error["Error"]["Code"] == "InsufficientStorage", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 507
    assert len(acked) >= 10, f"only {len(acked)} MiB fit"
    # Full, and still serving.
    srv.assert_alive()
    for k, b in acked.items():
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == b, k
    listed = s3.list_objects_v2(Bucket=bucket)["KeyCount"]
    assert listed == len(acked)
    # A small object may still fit in what is left, or get the same 507.
    try:
        s3.put_object(Bucket=bucket, Key="small", Body=b"x" * 100)
        acked["small"] = b"x" * 100
    except ClientError as e:
        assert e.response["Error"]["Code"] == "InsufficientStorage"

    # Space comes back: writes work again, no restart.
    ballast.unlink()
    body = rng.randbytes(MiB)
    s3.put_object(Bucket=bucket, Key="after", Body=body)
    acked["after"] = body
    # Fill it again, then restart on the full disk.
    for i in range(200, 400):
        b = rng.randbytes(MiB)
        try:
            s3.put_object(Bucket=bucket, Key=f"o{i:03d}", Body=b)
            acked[f"o{i:03d}"] = b
        except ClientError as e:
            assert e.response["Error"]["Code"] == "InsufficientStorage"
            break
    else:
        pytest.fail("the file system never filled up again")
    srv.kill9()
    srv.start()
    s3 = srv.client()
    for k, b in acked.items():
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == b, k
    print(f"\nenospc: {len(acked)} MiB acknowledged on a {FS_MIB} MiB file system; "
          f"first refusal: {error['Error']['Code']}")
