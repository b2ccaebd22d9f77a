"""percore.torch and percore.fs against a real server (2 shards): DataLoader
workers, the rank split, WebDataset tar shards, a distributed-checkpoint
round trip, and pyarrow reading two Parquet columns through fsspec."""

import hashlib
import io
import os
import random
import tarfile

import pytest

import percore
from conftest import Server, unique_bucket_name

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import percore.torch as ptorch  # noqa: E402


@pytest.fixture(scope="module")
def srv(request):
    s = Server(shards=2, name="pytorch-s2")
    try:
        s.start()
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def client(srv):
    return percore.Client(srv.native_endpoint)


@pytest.fixture(scope="module")
def samples(client):
    """2,000 small samples with distinct bytes."""
    bucket = unique_bucket_name("samples")
    client.create_bucket(bucket)
    rng = random.Random(5)
    objs = {}
    for i in range(2000):
        k = f"train/{i:05d}.bin"
        objs[k] = rng.randbytes(rng.randrange(1, 3000)) + i.to_bytes(4, "big")
        client.put(bucket, k, objs[k])
    return bucket, objs


def _collate(batch):
    return batch


def _epoch(loader):
    return [(k, bytes(v)) for batch in loader for k, v in batch]


def test_iterable_dataloader_two_workers(srv, samples):
    bucket, objs = samples
    ds = ptorch.IterableDataset(bucket, prefix="train/", endpoint=srv.native_endpoint,
                                seed=11, batch=50)
    assert len(ds) == 2000
    loader = DataLoader(ds, batch_size=32, num_workers=2, collate_fn=_collate)
    ds.set_epoch(0)
    first = _epoch(loader)
    assert len(first) == 2000
    assert dict(first) == objs                        # exact bytes, each sample once
    assert len({k for k, _ in first}) == 2000
    ds.set_epoch(0)
    again = _epoch(loader)
    assert [k for k, _ in again] == [k for k, _ in first]   # same seed, same order
    ds.set_epoch(1)
    other = _epoch(loader)
    assert dict(other) == objs
    assert [k for k, _ in other] != [k for k, _ in first]   # a new epoch reshuffles
    assert [k for k, _ in first] != sorted(objs)


def test_rank_split_is_exact(srv, samples):
    bucket, objs = samples
    keys = sorted(objs)
    seen = []
    for rank in range(3):
        ds = ptorch.IterableDataset(bucket, keys=keys, endpoint=srv.native_endpoint,
                                    seed=3, rank=rank, world_size=3, batch=64)
        got = _epoch(DataLoader(ds, batch_size=16, num_workers=2, collate_fn=_collate))
        assert len(got) == len(ds)
        seen += got
    assert len(seen) == 2000 and dict(seen) == objs
    # The sampler for map-style datasets splits the same way.
    idx = []
    for rank in range(3):
        s = ptorch.ShardedSampler(2000, rank=rank, world_size=3, seed=3)
        s.set_epoch(2)
        idx += list(s)
    assert sorted(idx) == list(range(2000))


def test_map_dataset_batches(srv, samples):
    bucket, objs = samples
    keys = sorted(objs)[:500]
    ds = ptorch.MapDataset(bucket, keys=keys, endpoint=srv.native_endpoint,
                           transform=lambda k, b: (k, hashlib.md5(b).hexdigest()))
    sampler = ptorch.ShardedSampler(len(ds), rank=0, world_size=1, seed=9)
    loader = DataLoader(ds, batch_size=25, sampler=sampler, num_workers=2, collate_fn=_collate)
    got = [x for batch in loader for x in batch]
    assert sorted(got) == sorted((k, hashlib.md5(objs[k]).hexdigest()) for k in keys)
    assert ds[3] == (keys[3], hashlib.md5(objs[keys[3]]).hexdigest())


def _make_tar(members, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_webdataset_shards(srv, client):
    bucket = unique_bucket_name("wds")
    client.create_bucket(bucket)
    rng = random.Random(2)
    want = {}
    shards = []
    long_dir = "d" * 120   # past ustar's 100-byte name: GNU / pax records
    for s, fmt in enumerate([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]):
        members = []
        for i in range(40):
            base = f"{long_dir}/s{s}-{i:03d}" if fmt != tarfile.USTAR_FORMAT else f"s{s}-{i:03d}"
            img = rng.randbytes(rng.randrange(0, 70_000))
            cls = str(i % 7).encode()
            members += [(f"{base}.jpg", img), (f"{base}.cls", cls)]
            want[base] = {"jpg": img, "cls": cls}
        key = f"shards/shard-{s}.tar"
        client.put(bucket, key, _make_tar(members, fmt))
        shards.append(key)
    ds = ptorch.WebDataset(bucket, prefix="shards/", endpoint=srv.native_endpoint, batch=16)
    got = {}
    for sample in ds:
        assert sample["__key__"] not in got
        got[sample["__key__"]] = {"jpg": sample["jpg"], "cls": sample["cls"]}
    assert got == want
    # Two workers, shuffled: still every sample once.
    ds = ptorch.WebDataset(bucket, shards=shards, endpoint=srv.native_endpoint, shuffle=True,
                           seed=4, transform=lambda s: (s["__key__"], s["jpg"]))
    seen = [x for batch in DataLoader(ds, batch_size=8, num_workers=2, collate_fn=_collate)
            for x in batch]
    assert sorted(k for k, _ in seen) == sorted(want)
    assert all(want[k]["jpg"] == v for k, v in seen)
    # A truncated tar is an error, not silently short.
    client.put(bucket, "bad.tar", _make_tar([("a.bin", b"x" * 5000)], tarfile.USTAR_FORMAT)[:2048])
    with pytest.raises(ValueError):
        ptorch.tar_members(client, bucket, "bad.tar")


def test_checkpoint_round_trip(srv, client):
    import torch.distributed.checkpoint as dcp

    bucket = unique_bucket_name("ckpt")
    client.create_bucket(bucket)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    path = f"percore://{bucket}/run1/step-100"
    dcp.save(model.state_dict(), storage_writer=ptorch.CheckpointWriter(
        path, endpoint=srv.native_endpoint), no_dist=True)
    names = [e.key for e in client.list(bucket, "run1/step-100/")]
    assert "run1/step-100/.metadata" in names and len(names) >= 2

    fresh = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    target = fresh.state_dict()
    assert not all(torch.equal(target[k], state[k]) for k in state)
    prefetched_reads = []
    orig = ptorch._Prefetched.read

    def spy(self, n=-1):
        prefetched_reads.append(n)
        return orig(self, n)

    ptorch._Prefetched.read = spy
    try:
        dcp.load(target, storage_reader=ptorch.CheckpointReader(
            path, endpoint=srv.native_endpoint), no_dist=True)
    finally:
        ptorch._Prefetched.read = orig
    assert prefetched_reads, "the load did not read through the prefetched ranges"
    fresh.load_state_dict(target)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_fsspec_and_pyarrow_columns(srv, client, monkeypatch):
    import fsspec
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    bucket = unique_bucket_name("pq")
    client.create_bucket(bucket)
    fs = fsspec.filesystem("percore", endpoint=srv.native_endpoint)
    n = 200_000
    rng = random.Random(1)
    table = pa.table({
        "a": pa.array(range(n), pa.int64()),
        "b": pa.array([rng.random() for _ in range(n)], pa.float64()),
        "c": pa.array([rng.randrange(1 << 40) for _ in range(n)], pa.int64()),
    })
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="none")
    blob = sink.getvalue()
    with fs.open(f"percore://{bucket}/t.parquet", "wb") as f:
        f.write(blob[:1000])
        f.write(blob[1000:])
    assert fs.info(f"{bucket}/t.parquet")["size"] == len(blob)
    assert fs.cat_file(f"percore://{bucket}/t.parquet", 4, 10) == blob[4:10]
    assert fs.ls(bucket, detail=False) == [f"{bucket}/t.parquet"]

    fetched = []
    from percore.fs import PercoreFile
    orig = PercoreFile._fetch_range

    def spy(self, start, end):
        fetched.append((start, end))
        return orig(self, start, end)

    monkeypatch.setattr(PercoreFile, "_fetch_range", spy)
    with fs.open(f"{bucket}/t.parquet", "rb", block_size=64 * 1024) as f:
        got = pq.read_table(f, columns=["a", "c"])
    assert got.column_names == ["a", "c"]
    assert got.column("a").equals(table.column("a")) and got.column("c").equals(table.column("c"))
    # Column b's chunk (a third of the file) was never read: ranged reads only.
    md = pq.ParquetFile(io.BytesIO(blob)).metadata
    b = md.row_group(0).column(1)
    b_start = b.dictionary_page_offset or b.data_page_offset
    b_end = b_start + b.total_compressed_size
    read = sum(e - s for s, e in fetched)
    assert read < len(blob) * 0.8, (read, len(blob))
    assert not any(s <= b_start + 4096 and e >= b_end - 4096 for s, e in fetched), fetched
    # Missing paths are FileNotFoundError, for every fsspec user.
    with pytest.raises(FileNotFoundError):
        fs.info(f"{bucket}/nope")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{bucket}/nope")
    fs.rm(f"{bucket}/t.parquet")
    assert not fs.exists(f"{bucket}/t.parquet")


def _header(name: bytes, size_field: bytes, kind: bytes = b"0") -> bytes:
    """A ustar header block with a raw size field and a correct checksum."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = size_field.ljust(12, b"\0")[:12]
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def test_hostile_tars_are_refused_not_looped(client):
    """tar_members reads untrusted bytes: a negative size, a pax record of
    length 0 or one running past its header, an empty pax header, garbage in
    a number field: each is a ValueError (never a loop, never a read of the
    rest of the shard); GNU base-256 sizes and pax sizes are honoured."""
    bucket = unique_bucket_name("hostile")
    client.create_bucket(bucket)
    end = bytes(1024)
    bad = {
        "negative": _header(b"a.bin", b"-0000001750") + bytes(2048) + end,
        "pax-zero-len": _header(b"PaxHeaders/a", b"%011o" % 9, b"x") + _pad(b"0 path=x\n")
        + _header(b"a.bin", b"00000000001") + _pad(b"z") + end,
        "pax-past-end": _header(b"PaxHeaders/a", b"%011o" % 9, b"x") + _pad(b"99 path=x\n")
        + _header(b"a.bin", b"00000000001") + _pad(b"z") + end,
        "pax-empty": _header(b"PaxHeaders/a", b"00000000000", b"x")
        + _header(b"a.bin", b"00000000001") + _pad(b"z") + end,
        "garbage-size": _header(b"a.bin", b"12x4") + end,
        "past-the-end": _header(b"a.bin", b"%011o" % 1_000_000) + end,
    }
    for name, blob in bad.items():
        client.put(bucket, name, blob)
        with pytest.raises(ValueError):
            ptorch.tar_members(client, bucket, name)
    # GNU base-256 size (3 bytes) and a pax size record overriding the field.
    b256 = b"\x80" + bytes(10) + b"\x03"
    pax = b"15 path=long/a\n10 size=4\n"
    good = (_header(b"x.bin", b256) + _pad(b"abc")
            + _header(b"PaxHeaders/y", b"%011o" % len(pax), b"x") + _pad(pax)
            + _header(b"y.bin", b"00000000000") + _pad(b"wxyz") + end)
    client.put(bucket, "good", good)
    members = ptorch.tar_members(client, bucket, "good")
    assert [(n, s) for n, _, s in members] == [("x.bin", 3), ("long/a", 4)]
    assert client.get_ranges(bucket, "good", [(o, s) for _, o, s in members]) == [b"abc", b"wxyz"]


def test_fsspec_edges(srv, client):
    """Reads past the end are empty (fsspec's contract), more than 1024
    ranges of a file go through, recursive rm deletes keys under a prefix."""
    import fsspec

    bucket = unique_bucket_name("fsedge")
    client.create_bucket(bucket)
    fs = fsspec.filesystem("percore", endpoint=srv.native_endpoint, skip_instance_cache=True)
    data = os.urandom(50_000)
    client.put(bucket, "d/f", data)
    client.put(bucket, "d/sub/g", b"g")
    client.put(bucket, "keep", b"k")
    p = f"{bucket}/d/f"
    assert fs.cat_file(p, 60_000, 70_000) == b""
    assert fs.cat_file(p, -10) == data[-10:]
    assert fs.cat_file(p, 49_990, None) == data[49_990:]
    starts = [i * 40 for i in range(1300)]
    got = fs.cat_ranges([p] * 1300, starts, [s + 30 for s in starts])
    assert got == [data[s:s + 30] for s in starts]
    assert fs.cat_ranges([p, p], [None, 49_995], [5, 60_000]) == [data[:5], data[49_995:]]
    assert fs.info(f"{bucket}/d")["type"] == "directory"
    fs.rm(f"{bucket}/d", recursive=True)
    assert [e.key for e in client.list(bucket)] == ["keep"]
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{bucket}/nope")


def test_get_into_torch_tensors(client):
    """get_into writes into a CPU tensor's own memory (any dtype)."""
    bucket = unique_bucket_name("tensor")
    client.create_bucket(bucket)
    data = os.urandom(4096)
    client.put(bucket, "t", data)
    t = torch.zeros(4096, dtype=torch.uint8)
    assert client.get_into(bucket, "t", t) == 4096
    assert bytes(t.numpy()) == data
    f = torch.zeros(1024, dtype=torch.float32)
    client.get_into(bucket, "t", f)
    assert f.numpy().tobytes() == data
    with pytest.raises(ValueError):
        client.get_into(bucket, "t", torch.zeros(10, dtype=torch.uint8))
